"""Helpers of the predict tests, in an importable module so worker and rank processes can
unpickle them by reference: a small regression job whose checkpoints are scored while it
trains; a small CNN, its transform and its outputs over the engine's Loader in the test's
process (what a predict over images must equal); the GPU tests' models, which fail on an
input that is not on CUDA (and channels_last where asked); tar shards written in memory."""

from __future__ import annotations

import io
import tarfile
from typing import Any

import numpy as np
import torch

from dask_ddp.data import ImageList, Loader, TarShards
from dask_ddp.data import transforms as T

#: The image tests' transform: every image 16 x 16, float.
TRANSFORM = T.Compose([T.Resize((16, 16)), T.ToTensor()])


def assert_close_f32(got: Any, want: Any) -> None:
    """float32 outputs against a local computation of the same model. The batch size, the
    thread count and the CPU's SIMD level pick BLAS kernels that sum a dot product in other
    orders (with or without FMA), so the last bits differ: a few ulp of the sum of the
    terms' magnitudes (2e-6 seen on a 1-wide Linear), never 1e-5 for these small models."""
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def assert_close_bf16(got: Any, want: Any) -> None:
    """Outputs computed under bf16 autocast against fp32 ones: bf16 keeps 8 bits of
    mantissa (a relative step of 2**-8 = 0.4%), rounded at each layer's inputs and
    outputs, so a few steps of the outputs' scale."""
    want = np.asarray(want)
    scale = float(np.abs(want).max()) or 1.0
    np.testing.assert_allclose(np.asarray(got), want, rtol=0.03, atol=0.03 * scale)


class TinyCnn(torch.nn.Module):
    """A small CNN with fixed weights: 5 outputs per image."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.head = torch.nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(x).mean(dim=(2, 3)))


def mlp() -> torch.nn.Sequential:
    """A small MLP with fixed weights: 8 features in, 4 outputs."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))


def assert_gpu_input(x: torch.Tensor, channels_last: bool) -> None:
    """What a predict task must hand a model on a GPU: a CUDA tensor, in ``channels_last``
    when asked (so a GPU test cannot pass on host tensors), with its GPU as the thread's
    current device."""
    assert x.is_cuda, f"predict fed the model a {x.device} tensor, not a CUDA one"
    assert torch.cuda.current_device() == x.device.index, (
        f"the model runs on {x.device} with cuda:{torch.cuda.current_device()} current")
    if channels_last:
        assert x.is_contiguous(memory_format=torch.channels_last), (
            f"predict fed the model a batch of strides {x.stride()}, not channels_last")


class CudaMlp(torch.nn.Module):
    """:func:`mlp` that fails on an input not on CUDA."""

    def __init__(self) -> None:
        super().__init__()
        self.net = mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert_gpu_input(x, channels_last=False)
        return self.net(x)


class CudaCnn(TinyCnn):
    """:class:`TinyCnn` that fails on an input not on CUDA."""

    channels_last = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert_gpu_input(x, self.channels_last)
        return super().forward(x)


class CudaChannelsLastCnn(CudaCnn):
    """:class:`TinyCnn` that fails on an input not on CUDA in ``channels_last``."""

    channels_last = True


def engine_outputs(dataset: ImageList | TarShards) -> tuple[np.ndarray, np.ndarray]:
    """TinyCnn over the engine's batches in this process: outputs and labels, in order."""
    loader = Loader(dataset, 7, transform=TRANSFORM, shuffle=False, rank=0, world_size=1)
    outs, labels = [], []
    model = TinyCnn().eval()
    with torch.inference_mode():
        for x, y in loader:
            outs.append(model(x).numpy())
            labels.append(y.numpy())
    return np.concatenate(outs), np.concatenate(labels)


def tar_shard(samples: list[tuple[str, bytes, int]]) -> bytes:
    """A WebDataset tar shard of ``(key, jpeg bytes, label)`` samples: ``key.jpg`` and
    ``key.cls`` members."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for key, data, label in samples:
            for name, payload in ((f"{key}.jpg", data), (f"{key}.cls", str(label).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(3, 1)


def mse(out: Any, df: Any) -> dict[str, Any]:
    """The evaluation's score: mean squared error of ``out_0`` against ``y`` (lazy)."""
    return {"mse": ((out["out_0"] - df["y"]) ** 2).mean()}


def train_with_evaluation(x: Any, y: Any, steps: int, every: int, storage: str,
                          evaluate: Any) -> int:
    """Full-batch SGD on (x, y); a checkpoint every ``every`` steps, each scored on the
    cluster by ``evaluate`` while the loop goes on."""
    import dask_ddp

    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt = dask_ddp.Checkpointer(model, opt, storage=storage, evaluate=evaluate)
    xt, yt = torch.as_tensor(x), torch.as_tensor(y)[:, None]
    for step in range(1, steps + 1):
        loss = torch.nn.functional.mse_loss(model(xt), yt)
        opt.zero_grad()
        loss.backward()
        opt.step()
        dask_ddp.report({"loss": loss.item()}, step=step)
        if step % every == 0:
            ckpt.save(step)
    ckpt.wait(120)
    return steps
