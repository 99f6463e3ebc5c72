"""The batched forward of a task: channels_last inputs, outputs in float32, batches of any
size collected in order; on a GPU, outputs copied back through pinned buffers and events,
the model's inputs on CUDA (in channels_last where asked)."""

from __future__ import annotations

from collections.abc import Iterator

import cloudpickle
import numpy as np
import pytest
import torch

from dask_ddp.predict.forward import forward
from dask_ddp.predict.model import ModelSpec
from dask_ddp.predict.outputs import Layout
from predict_util import (
    CudaChannelsLastCnn,
    CudaCnn,
    CudaMlp,
    TinyCnn,
    assert_close_bf16,
    assert_close_f32,
)


def spec(**options: object) -> ModelSpec:
    return ModelSpec("test-forward", cloudpickle.dumps(TinyCnn), **options)  # type: ignore[arg-type]


def images(n: int = 50) -> torch.Tensor:
    return torch.rand(n, 3, 16, 16, generator=torch.Generator().manual_seed(0))


def in_batches(x: torch.Tensor, size: int) -> Iterator[tuple[int, torch.Tensor]]:
    for start in range(0, len(x), size):
        yield start, x[start:start + size]


def reference(x: torch.Tensor) -> np.ndarray:
    with torch.inference_mode():
        return TinyCnn().eval()(x).numpy()


LAYOUT = Layout((5,), np.dtype(np.float32))


def run(device: torch.device, x: torch.Tensor, size: int, model_type: type[TinyCnn] = TinyCnn,
        **options: object) -> np.ndarray:
    model = model_type().eval().to(device)
    if options.get("channels_last"):
        model = model.to(memory_format=torch.channels_last)
    return forward(model, device, in_batches(x, size), len(x), LAYOUT, lambda s: f"at {s}",
                   spec(**options))


def test_channels_last_and_bf16_on_the_cpu() -> None:
    x = images()
    assert_close_f32(run(torch.device("cpu"), x, 7, channels_last=True), reference(x))
    got = run(torch.device("cpu"), x, 7, channels_last=True, precision="bf16")
    assert got.dtype == np.float32
    assert_close_bf16(got, reference(x))


def test_a_batch_of_another_shape_is_named() -> None:
    wrong = Layout((4,), np.dtype(np.float32))
    with pytest.raises(ValueError, match=r"returned \(7, 5\) for at 0"):
        forward(TinyCnn().eval(), torch.device("cpu"), in_batches(images(), 7), 50, wrong,
                lambda s: f"at {s}", spec())


def test_the_gpu_tests_models_refuse_host_tensors() -> None:
    """The gpu tests' models fail where a forward hands them host tensors, so those tests
    cannot pass on a CPU."""
    with pytest.raises(AssertionError, match="cpu tensor, not a CUDA one"):
        run(torch.device("cpu"), images(), 7, CudaChannelsLastCnn, channels_last=True)
    with pytest.raises(AssertionError, match="cpu tensor, not a CUDA one"):
        forward(CudaMlp().eval(), torch.device("cpu"), in_batches(torch.zeros(9, 8), 4), 9,
                Layout((4,), np.dtype(np.float32)), lambda s: f"at {s}", spec())


@pytest.mark.gpu
@pytest.mark.parametrize("size", [1, 7, 50, 64])
def test_outputs_copied_back_from_the_gpu_in_order(size: int) -> None:
    x = images(50)
    got = run(torch.device("cuda"), x, size, CudaCnn, tf32=False)
    assert_close_f32(got, reference(x))
    # Inputs already on the GPU; bf16 and channels_last: float32 outputs, close to fp32.
    fast = run(torch.device("cuda"), x.cuda(), size, CudaChannelsLastCnn, precision="bf16",
               channels_last=True)
    assert fast.dtype == np.float32
    assert_close_bf16(fast, reference(x))
