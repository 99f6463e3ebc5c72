"""The Loaders' device stage (``device=``, ``channels_last=``): on the CPU here (the same
path, without a stream), and on a GPU where one is (``gpu`` tests): batches equal to the
host path's, the float tail on the device equal to the engine's, accounting unchanged."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dask_ddp.data import ImageFolder, Loader, TarShards
from dask_ddp.data import transforms as T
from dask_ddp.data.device import DeviceTail, default_threads, resolve_device, split_tail
from images import encode, file_putter, photo, write_folder

NORM = T.Compose([T.Resize(40), T.CenterCrop(32), T.ToTensor(),
                  T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
TRAIN = T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.ToTensor()])
CUDA = torch.cuda.is_available()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("device-folder")
    write_folder(file_putter(str(root)), ("a", "b", "c"), 9, kinds=("jpeg", "png"))
    return root


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("device-shards")
    n = 0
    for s in range(3):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for _ in range(7):
                for name, data in ((f"{n:06d}.jpg", encode(photo(50, 40, n), "jpeg")),
                                   (f"{n:06d}.cls", str(n).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                n += 1
        (root / f"s-{s:06d}.tar").write_bytes(buf.getvalue())
    return str(root / "s-{000000..000002}.tar")


def batches(loader: Loader, epoch: int = 0) -> list[tuple[torch.Tensor, ...]]:
    loader.set_epoch(epoch)
    return [tuple(x.clone() for x in b) for b in loader]


# ---- the device's name ------------------------------------------------------------------


def test_device_names() -> None:
    assert resolve_device(None) is None
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")
    with pytest.raises(ValueError, match="'mps'.*supports 'cpu' and 'cuda'"):
        resolve_device("mps")
    with pytest.raises(ValueError, match="'gpu0'"):
        resolve_device("gpu0")
    with pytest.raises(TypeError, match="int"):
        resolve_device(3)  # type: ignore[arg-type]


@pytest.mark.skipif(CUDA, reason="checks the error where CUDA is absent")
def test_cuda_without_cuda_names_the_device(folder: Path) -> None:
    with pytest.raises(ValueError, match=r"device 'cuda:1'.*CUDA is not available"):
        Loader(ImageFolder(str(folder)), 4, transform=NORM, device="cuda:1")
    with pytest.raises(ValueError, match=r"device 'cuda'.*CUDA is not available"):
        Loader(ImageFolder(str(folder)), 4, transform=NORM, device="cuda")


def test_contradictory_options_are_named(folder: Path) -> None:
    ds = ImageFolder(str(folder))
    with pytest.raises(ValueError, match="channels_last=True needs a device"):
        Loader(ds, 4, transform=NORM, channels_last=True)
    with pytest.raises(ValueError, match="pin_memory=True with device='cpu'"):
        Loader(ds, 4, transform=NORM, device="cpu", pin_memory=True)


# ---- the float tail ---------------------------------------------------------------------


def test_split_tail_moves_only_a_trailing_float_tail() -> None:
    ops, tail = split_tail(T.to_ops(NORM))
    assert ops[-1] == ("pil_to_tensor", []) and [o for o, _ in ops].count("to_tensor") == 0
    assert tail is not None and tail.mean == (0.485, 0.456, 0.406)
    ops, tail = split_tail(T.to_ops(TRAIN))
    assert ops[-1] == ("pil_to_tensor", []) and tail == DeviceTail()
    uint8 = T.to_ops(T.Compose([T.CenterCrop(8), T.PILToTensor()]))
    assert split_tail(uint8) == (uint8, None)


def test_the_tail_equals_the_engines_float_pipeline(folder: Path) -> None:
    """uint8 from the engine, then the tail (as it runs on a GPU): the engine's floats."""
    ds = ImageFolder(str(folder))
    floats = batches(Loader(ds, 8, transform=NORM, shuffle=False))
    ops, tail = split_tail(T.to_ops(NORM))
    assert tail is not None
    uint8 = T.Compose([T.Resize(40), T.CenterCrop(32), T.PILToTensor()])
    assert ops == T.to_ops(uint8)
    raw = batches(Loader(ds, 8, transform=uint8, shuffle=False))
    for (f, y), (u, y2) in zip(floats, raw, strict=True):
        assert torch.equal(y, y2)
        for fmt in (torch.contiguous_format, torch.channels_last):
            out = tail.apply(u, fmt)
            assert out.dtype == torch.float32 and out.is_contiguous(memory_format=fmt)
            torch.testing.assert_close(out, f, rtol=0, atol=2e-6)


# ---- device="cpu": the stage's path, batches and accounting as without it ---------------


@pytest.mark.parametrize("channels_last", [False, True])
def test_images_on_the_cpu_stage_equal_host_batches(folder: Path, channels_last: bool) -> None:
    ds = ImageFolder(str(folder))
    host = batches(Loader(ds, 5, transform=TRAIN, seed=3), epoch=1)
    loader = Loader(ds, 5, transform=TRAIN, seed=3, device="cpu", channels_last=channels_last)
    assert loader.device == torch.device("cpu") and loader.channels_last is channels_last
    staged = batches(loader, epoch=1)
    assert len(staged) == len(host) == len(loader)
    for (x, y), (hx, hy) in zip(staged, host, strict=True):
        assert torch.equal(x, hx) and torch.equal(y, hy)
    loader.set_epoch(1)
    for x, _ in loader:
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        assert x.is_contiguous(memory_format=fmt)
        break


def test_the_cpu_stage_counts_yields_for_resume(folder: Path) -> None:
    ds = ImageFolder(str(folder))
    loader = Loader(ds, 4, transform=TRAIN, device="cpu")
    loader.set_epoch(2)
    it = iter(loader)
    first = [next(it) for _ in range(3)]
    state = loader.state_dict()
    assert state["batch"] == 3
    rest = [tuple(t.clone() for t in b) for b in it]
    resumed = Loader(ds, 4, transform=TRAIN, device="cpu")
    resumed.load_state_dict(state)
    resumed.set_epoch(2)
    again = [tuple(t.clone() for t in b) for b in resumed]
    assert len(first) + len(rest) == len(loader) and len(again) == len(rest)
    for (x, y), (ax, ay) in zip(rest, again, strict=True):
        assert torch.equal(x, ax) and torch.equal(y, ay)


def test_shards_on_the_cpu_stage_equal_host_batches(shards: str) -> None:
    host = batches(Loader(TarShards(shards), 4, transform=TRAIN, seed=1))
    staged = batches(Loader(TarShards(shards), 4, transform=TRAIN, seed=1, device="cpu",
                            channels_last=True))
    assert sorted(int(i) for b in staged for i in b[1]) == list(range(21))
    for (x, y), (hx, hy) in zip(staged, host, strict=True):
        assert torch.equal(x, hx) and torch.equal(y, hy)


def test_a_table_on_the_cpu_stage_equals_host_batches(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    from dask_ddp.data import Table

    ids = np.arange(300, dtype=np.int64)
    pq.write_table(pa.table({"id": ids, "x": (ids * 0.5).astype(np.float32)}),
                   tmp_path / "t.parquet", row_group_size=64)
    table = Table.from_parquet(str(tmp_path / "t.parquet"))
    with pytest.raises(ValueError, match="channels_last=True needs a device"):
        Loader(table, 32, features=["x"], label="id", channels_last=True)

    def read(**kw: object) -> list[tuple[torch.Tensor, torch.Tensor]]:
        loader = Loader(table, 32, features=["x"], label="id", seed=2, **kw)
        loader.set_epoch(1)
        try:
            return [(x.clone(), y.clone()) for x, y in loader]
        finally:
            loader.close()

    host, staged = read(), read(device="cpu")
    assert sorted(int(i) for _, y in staged for i in y) == ids.tolist()
    for (x, y), (hx, hy) in zip(staged, host, strict=True):
        assert torch.equal(x, hx) and torch.equal(y, hy)


def test_a_gpu_loader_leaves_the_loop_a_core(monkeypatch: pytest.MonkeyPatch) -> None:
    from dask_ddp.data import device as dev

    monkeypatch.setattr(dev, "cores_per_rank", lambda: 8)
    assert default_threads(None) == 8

    class OnGpu:
        pins = True

    assert default_threads(OnGpu()) == 7  # type: ignore[arg-type]
    monkeypatch.setattr(dev, "cores_per_rank", lambda: 1)
    assert default_threads(OnGpu()) == 1  # type: ignore[arg-type]


# ---- on a GPU ------------------------------------------------------------------------------


@pytest.mark.gpu
def test_cuda_batches_equal_the_host_path(folder: Path) -> None:
    ds = ImageFolder(str(folder))
    host = batches(Loader(ds, 6, transform=NORM, seed=4))
    loader = Loader(ds, 6, transform=NORM, seed=4, device="cuda", channels_last=True)
    assert loader.device is not None and loader.device.type == "cuda"
    loader.set_epoch(0)
    n = 0
    for (x, y), (hx, hy) in zip(loader, host, strict=True):
        assert x.is_cuda and y.is_cuda and x.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(x.cpu(), hx, rtol=0, atol=2e-6)
        assert torch.equal(y.cpu(), hy)
        n += 1
    assert n == len(loader)


@pytest.mark.gpu
def test_a_slow_consumer_never_sees_an_overwritten_batch(folder: Path) -> None:
    """The step's stream sleeps after every batch (a slow model): with prefetch 1 the engine
    would reuse a buffer whose copy has not run, if the stage released it early."""
    ds = ImageFolder(str(folder))
    uint8 = T.Compose([T.Resize(40), T.CenterCrop(32), T.PILToTensor()])
    host = batches(Loader(ds, 2, transform=uint8, seed=5, prefetch=1))
    loader = Loader(ds, 2, transform=uint8, seed=5, prefetch=1, device="cuda")
    stage = loader._stage
    assert stage is not None and stage.stream is not None
    loader.set_epoch(0)
    got = []
    it = iter(loader)
    while True:
        # The next copy queues behind ~tens of ms of GPU time on the stage's stream: a host
        # buffer released when its copy was issued (not done) is decoded over meanwhile.
        with torch.cuda.stream(stage.stream):
            torch.cuda._sleep(50_000_000)
        x = next(it, None)
        if x is None:
            break
        got.append(x[0].clone())
    torch.cuda.synchronize()
    assert len(got) == len(host)
    for x, (hx, _) in zip(got, host, strict=True):
        assert torch.equal(x.cpu(), hx)


@pytest.mark.gpu
def test_a_compiled_model_compiles_once_over_an_epoch(folder: Path) -> None:
    """drop_last=True: every batch has one shape, so torch.compile traces once (a short
    last batch would trace again, or mark the batch dimension dynamic)."""
    ds = ImageFolder(str(folder))
    loader = Loader(ds, 4, transform=NORM, device="cuda", drop_last=True, channels_last=True)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten()).cuda().to(memory_format=torch.channels_last)
    compiles = 0

    def backend(gm: torch.fx.GraphModule, _: object) -> object:
        nonlocal compiles
        compiles += 1
        return gm.forward

    fn = torch.compile(model, backend=backend)
    for epoch in range(2):
        loader.set_epoch(epoch)
        for x, _ in loader:
            fn(x)
    assert compiles == 1


def test_the_engine_decodes_into_lent_buffers(folder: Path) -> None:
    """The engine writes batches into memory the caller lends (on a GPU: pinned memory
    torch allocated), and keeps it referenced while a batch uses it."""
    from dask_ddp.data.engine import ImageSource

    source = ImageSource.of(ImageFolder(str(folder)))
    ops = T.to_ops(NORM)

    def engine() -> Any:
        return source.loader(ops, batch_size=4, shuffle=True, seed=2, num_threads=2,
                             prefetch=2)

    want = []
    core = engine()
    core.start_epoch(0, 0)
    while (item := core.next()) is not None:
        want.append(item[0].clone())
    core.close()

    core = engine()
    assert core.batch_image_bytes == 4 * 3 * 32 * 32 * 4
    with pytest.raises(ValueError, match="lent buffer 0 holds 10 bytes"):
        core.adopt_buffers([np.zeros(10, np.uint8)])
    lent = [np.zeros(core.batch_image_bytes, np.uint8) for _ in range(4)]
    core.adopt_buffers(lent)
    starts = {a.ctypes.data for a in lent}
    core.start_epoch(0, 0)
    got, inside = [], 0
    while (item := core.next()) is not None:
        inside += item[0].data_ptr() in starts
        got.append(item[0].clone())
    core.close()
    assert inside == len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
