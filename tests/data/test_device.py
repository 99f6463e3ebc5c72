"""The Loaders' device stage (``device=``, ``channels_last=``): on the CPU here (the same
path, without a stream), and on a GPU where one is (``gpu`` tests): batches equal to the
host path's, the float tail on the device equal to the engine's, accounting unchanged."""

from __future__ import annotations

import io
import tarfile
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dask_ddp.data import ImageFolder, Loader, TarShards
from dask_ddp.data import loader as loader_module
from dask_ddp.data import transforms as T
from dask_ddp.data.device import (
    DeviceStage,
    DeviceTail,
    HeldBatches,
    PinnedBudget,
    default_threads,
    pinned_block_bytes,
    resolve_device,
    split_tail,
)
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


@pytest.mark.parametrize("mean", [None, (0.485, 0.456, 0.406)])
def test_the_tail_is_one_op_equal_to_the_cast_then_the_arithmetic(mean: Any) -> None:
    """The fused tail (uint8 read, float written in the asked layout, one op) gives the
    same floats, bit for bit, as the cast followed by the scale (and the normalisation)."""
    tail = DeviceTail(mean, None if mean is None else (0.229, 0.224, 0.225))
    u = torch.randint(0, 256, (3, 3, 7, 5), dtype=torch.uint8)
    x = u.to(torch.float32)
    if mean is None:
        want = x * (1.0 / 255.0)
    else:
        scale, neg_shift = tail._constants(torch.device("cpu"))
        want = torch.addcmul(neg_shift, x, scale)
    for fmt in (torch.contiguous_format, torch.channels_last):
        out = tail.apply(u, fmt)
        assert out.dtype == torch.float32 and out.is_contiguous(memory_format=fmt)
        assert torch.equal(out, want)


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


def test_a_reader_left_early_has_its_held_batches_dropped(folder: Path) -> None:
    """``with stage.over(...)`` drops the held host batches however its block ends: the
    loop's break as well as the reader's end (the Loaders used to drop at the end only)."""
    loader = Loader(ImageFolder(str(folder)), 4, transform=NORM, device="cpu")
    drops: list[int] = []
    stage = loader._stage
    plain_drop = stage.drop

    def drop() -> None:
        drops.append(1)
        plain_drop()

    stage.drop = drop  # type: ignore[method-assign]
    for _ in loader:
        break
    assert drops == [1]
    assert sum(1 for _ in loader) == len(loader) and drops == [1, 1]
    assert stage.engine_ops == T.to_ops(NORM) and stage.tail is None  # the CPU runs it all
    loader.close()


def test_a_gpu_loader_leaves_the_loop_a_core(monkeypatch: pytest.MonkeyPatch) -> None:
    from dask_ddp.data import device as dev

    monkeypatch.setattr(dev, "cores_per_rank", lambda: 8)
    assert default_threads(None) == 8

    class OnGpu:
        stream = "the stage's CUDA stream"

    assert default_threads(OnGpu()) == 7  # type: ignore[arg-type]
    monkeypatch.setattr(dev, "cores_per_rank", lambda: 1)
    assert default_threads(OnGpu()) == 1  # type: ignore[arg-type]


# ---- the pinned budget: one reservation per lent buffer, at torch's block size -------------


def test_pinned_blocks_are_counted_as_torchs_host_allocator_takes_them() -> None:
    """torch rounds a pinned request up to a power of two, unless its settings set a
    limit above which it takes the request as it is."""
    batch = 256 * 3 * 224 * 224 // 4  # a 38.5 MB uint8 batch of 256 images at 224 / 2
    assert pinned_block_bytes(38_535_168, "") == 64 * 2**20
    assert [pinned_block_bytes(n, "") for n in (0, 1, 2, 3, 4096, 4097)] == [0, 1, 2, 4,
                                                                             4096, 8192]
    assert pinned_block_bytes(batch, "") == 1 << (batch - 1).bit_length()
    limit = "expandable_segments:True,pinned_max_round_threshold_mb:1"
    assert pinned_block_bytes(2**20, limit) == 2**20
    assert pinned_block_bytes(2**20 + 1, limit) == 2**20 + 1
    both = "pinned_max_round_threshold_mb:64,pinned_max_cached_size_mb:32"
    assert pinned_block_bytes(40 * 2**20, both) == 40 * 2**20
    assert pinned_block_bytes(20 * 2**20 + 1, both) == 32 * 2**20


def _plain(nbytes: int) -> torch.Tensor:
    """A stand-in for a pinned buffer on a machine without CUDA (the budget counts it the
    same way)."""
    return torch.empty(nbytes, dtype=torch.uint8)


@pytest.mark.parametrize("device", [None, "cpu"])
def test_no_engine_batch_is_held_while_the_next_is_asked_for(folder: Path,
                                                             device: str | None) -> None:
    """The Loader's and the stage's generators let go of a batch before the engine is asked
    for the next: a buffer still referenced counts against ``prefetch`` (on a GPU the loop
    holds device tensors, and theirs would be the only reference: ``prefetch - 2`` decoded
    ahead before)."""
    import weakref

    loader = Loader(ImageFolder(str(folder)), 4, transform=NORM, device=device)
    last: list[weakref.ref[torch.Tensor]] = []
    alive: list[bool] = []
    loader.before_batch = lambda: alive.append(bool(last) and last[-1]() is not None)
    it = iter(loader)
    for _ in range(3):
        images, labels = next(it)
        last.append(weakref.ref(images))
        del images, labels
    next(it)
    assert alive == [False] * 4
    loader.close()


def test_a_lent_buffer_holds_its_block_until_the_engine_frees_it(folder: Path) -> None:
    from dask_ddp.data.engine import ImageSource

    stage = DeviceStage(torch.device("cpu"), ops=T.to_ops(NORM), buffers=3,
                        host_buffer=_plain)
    source = ImageSource.of(ImageFolder(str(folder)))
    base = PinnedBudget.used()
    core = stage.reader(lambda ops: source.loader(ops, batch_size=4, num_threads=1,
                                                  prefetch=1))
    block = pinned_block_bytes(core.batch_buffer_bytes)
    assert block == 64 * 1024 and core.batch_buffer_bytes == 48 * 1024 + 4 * 8  # rounded up
    assert PinnedBudget.used() == base + 3 * block
    core.start_epoch(0, 0)
    kept = core.next()  # a batch in a lent buffer: the engine's pool outlives the engine
    core.close()
    assert PinnedBudget.used() == base + 3 * block
    del kept
    assert PinnedBudget.used() == base


@pytest.mark.parametrize("kind", ["images", "shards"])
def test_the_budget_returns_after_reshard_set_epoch_and_close(
        folder: Path, shards: str, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The buffers lent to a Loader's engines (its own share's, each live-recovery deal's)
    hold the budget while those engines live: a reshard, a new epoch and close() free
    them, where the stage used to keep every reservation until it died."""
    monkeypatch.setattr(loader_module, "stage_for", lambda device, channels_last, pin, **kw: (
        DeviceStage(torch.device("cpu"), host_buffer=_plain, **kw)))
    ds: Any = ImageFolder(str(folder)) if kind == "images" else TarShards(shards)
    base = PinnedBudget.used()
    loader = Loader(ds, 4, transform=NORM, prefetch=2, num_threads=1, rank=0, world_size=1,
                    device="cpu")
    lent = 4 * pinned_block_bytes(4 * 3 * 32 * 32 * 4)  # prefetch + 2 buffers per engine

    def read(epoch: int) -> int:
        loader.set_epoch(epoch)
        return sum(1 for _ in loader)

    assert PinnedBudget.used() == base + lent
    assert read(0) == len(loader)
    loader.reshard(1, 2)
    assert read(1) == len(loader) and loader.world_size == 2
    assert PinnedBudget.used() == base + lent, "the engine of the old layout was freed"
    loader.set_epoch(2)
    it = iter(loader)
    next(it)
    loader.deal_unread(2, [0, 2, 4, 6, 8], 0, 1)  # a lost rank's samples, read after
    assert PinnedBudget.used() == base + 2 * lent
    assert sum(1 for _ in it) == len(loader) - 1 + 2  # the own share, then the deal
    assert read(3) == len(loader)
    assert PinnedBudget.used() == base + lent, "the deals of epoch 2 were freed"
    loader.close()
    assert PinnedBudget.used() == base


def _lending(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loaders' stages on the CPU that lend buffers as a GPU's do (pageable here)."""
    monkeypatch.setattr(loader_module, "stage_for", lambda device, channels_last, pin, **kw: (
        DeviceStage(torch.device("cpu"), host_buffer=_plain, **kw) if device else
        DeviceStage(None, **kw)))


def test_a_tables_batches_are_gathered_into_lent_buffers_and_recycled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each pass over a table gathers its batches into prefetch + 2 buffers the stage lends
    (its outputs side by side, at 64-byte boundaries), each back in the engine once its
    batch is freed: the host path's batches, no more buffers over epochs, and the budget
    back once a pass ends (also after a reshard) and at close()."""
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    from dask_ddp.data import Table

    _lending(monkeypatch)
    ids = np.arange(300, dtype=np.int64)
    pq.write_table(pa.table({"id": ids, "x": (ids * 0.5).astype(np.float32)}),
                   tmp_path / "t.parquet", row_group_size=64)
    table = Table.from_parquet(str(tmp_path / "t.parquet"))
    lent = 4 * pinned_block_bytes(32 * 4 + 32 * 8)  # x (float32), then y at byte 128

    def read(loader: Loader, epoch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        loader.set_epoch(epoch)
        got, ptrs = [], set()
        for x, y in loader:
            assert y.data_ptr() == x.data_ptr() + 128, "not in one lent buffer"
            assert PinnedBudget.used() == base + lent  # this pass's; the last one's freed
            ptrs.add(x.data_ptr())
            got.append((x.clone(), y.clone()))
        assert len(ptrs) <= 4, "more buffers than lent"
        del x, y  # the epoch's end closed the pass: its buffers go with its last batch
        assert PinnedBudget.used() == base
        return got

    base = PinnedBudget.used()
    host = Loader(table, 32, features=["x"], label="id", seed=2, prefetch=2)
    loader = Loader(table, 32, features=["x"], label="id", seed=2, prefetch=2,
                    num_threads=1, device="cpu")
    for epoch in range(3):
        host.set_epoch(epoch)
        want = [(x.clone(), y.clone()) for x, y in host]
        got = read(loader, epoch)
        assert len(got) == len(want)
        for (x, y), (hx, hy) in zip(got, want, strict=True):
            assert torch.equal(x, hx) and torch.equal(y, hy)
    loader.reshard(0, 2)
    assert len(read(loader, 3)) == len(loader)
    loader.close()
    host.close()
    assert PinnedBudget.used() == base


def test_shard_fields_cross_in_lent_buffers_freed_with_their_batches(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shard's .npy and .cls fields are copied into buffers the stage lends (the engine
    stacks them apart), held as long as the batch: the host path's batches, and the budget
    back to the engine's buffers after each epoch and a reshard, and to nothing at
    close()."""
    from dask_ddp.data import write_shards

    _lending(monkeypatch)
    samples = [{"npy": np.arange(6, dtype=np.float32).reshape(2, 3) + i, "cls": i}
               for i in range(20)]
    ds = write_shards(samples, str(tmp_path / "f-{:06d}.tar"), samples_per_shard=7)
    base = PinnedBudget.used()
    host = Loader(ds, 4, seed=1)
    loader = Loader(ds, 4, seed=1, prefetch=2, num_threads=1, device="cpu")
    engine = PinnedBudget.used() - base
    fields = pinned_block_bytes(4 * 6 * 4) + pinned_block_bytes(4 * 8)
    assert engine == 4 * pinned_block_bytes(loader._source.core.batch_buffer_bytes)
    for epoch in range(3):
        host.set_epoch(epoch)
        loader.set_epoch(epoch)
        n = 0
        for (x, y), (hx, hy) in zip(loader, host, strict=True):
            assert torch.equal(x, hx) and torch.equal(y, hy) and y.dtype == torch.int64
            assert PinnedBudget.used() == base + engine + fields  # this batch's alone
            n += 1
        assert n == len(loader) == 5
        del x, y
        assert PinnedBudget.used() == base + engine
    loader.reshard(0, 2)  # the new layout's engine lent its buffers, the old one's freed
    loader.set_epoch(3)
    assert sum(1 for _ in loader) == len(loader) == 3
    assert PinnedBudget.used() == base + engine
    loader.close()
    host.close()
    assert PinnedBudget.used() == base


def test_past_the_budget_a_loader_keeps_pageable_buffers(
        folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dask

    stage = DeviceStage(torch.device("cpu"), host_buffer=_plain)
    base = PinnedBudget.used()
    with dask.config.set({"dask-ddp.data.pinned-memory": base + 3 * 2**16}):
        assert stage.pinned_buffers(4, 2**16) is None
        assert PinnedBudget.used() == base
        buffers = stage.pinned_buffers(3, 2**16 - 5)
        assert buffers is not None and [len(b) for b in buffers] == [2**16 - 5] * 3
        assert PinnedBudget.used() == base + 3 * 2**16
    del buffers
    assert PinnedBudget.used() == base


# ---- close() from another thread: the held batches ----------------------------------------

#: Bounds the waits of the thread tests: reached only when a test fails.
WAIT_S = 60.0


class GatedEvent:
    """A copy's event whose query() lets another thread act first: it signals ``asked``,
    then waits for ``go`` (bounded) before it answers that the copy is done."""

    def __init__(self, asked: threading.Event, go: threading.Event) -> None:
        self.asked, self.go, self.waited = asked, go, 0

    def query(self) -> bool:
        self.asked.set()
        assert self.go.wait(WAIT_S), "the other thread did not act"
        return True

    def synchronize(self) -> None:
        self.waited += 1


def test_close_while_the_loop_recycles_refuses_the_next_batch() -> None:
    """The loop's thread asks whether the oldest held copy is done while close() (another
    thread) releases every held batch: the loop then gets the documented ValueError, where
    the stage's deque used to raise IndexError."""
    held = HeldBatches()
    asked, closed = threading.Event(), threading.Event()
    event = GatedEvent(asked, closed)
    held.add(event, ("host batch",))

    def close() -> None:
        assert asked.wait(WAIT_S)
        held.close()
        closed.set()

    closer = threading.Thread(target=close)
    closer.start()
    try:
        with pytest.raises(ValueError, match="the loader is closed"):
            held.recycle()
    finally:
        closed.set()
        closer.join(WAIT_S)
    assert not closer.is_alive() and len(held) == 0 and event.waited == 1
    late = GatedEvent(threading.Event(), closed)
    with pytest.raises(ValueError, match="the loader is closed"):
        held.add(late, ("copied after close",))
    assert late.waited == 1, "a batch refused after close() waits for its copy first"
    held.close()  # twice: harmless


def test_held_batches_go_oldest_first_once_their_copies_are_done() -> None:
    class Done:
        def __init__(self, done: bool) -> None:
            self.done = done

        def query(self) -> bool:
            return self.done

        def synchronize(self) -> None:
            self.done = True

    held = HeldBatches()
    first, second, third = Done(True), Done(False), Done(True)
    for e in (first, second, third):
        held.add(e, ())
    held.recycle()
    assert len(held) == 2, "the third waits behind the second, copied before it"
    held.drop()
    assert len(held) == 0 and second.done
    held.add(Done(False), ())  # drop() keeps the stage open
    assert len(held) == 1


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
def test_pinned_buffers_hold_the_budget_while_their_engines_live(folder: Path) -> None:
    """Page-locked buffers from torch, counted at torch's block size: a reshard frees the
    old layout's, close() the Loader's."""
    base = PinnedBudget.used()
    loader = Loader(ImageFolder(str(folder)), 4, transform=NORM, prefetch=2, rank=0,
                    world_size=1, device="cuda")
    lent = 4 * pinned_block_bytes(4 * 3 * 32 * 32 + 4 * 8)  # uint8 crosses; labels after
    assert PinnedBudget.used() == base + lent
    for epoch, layout in ((0, (1, 2)), (1, None)):
        loader.set_epoch(epoch)
        assert sum(1 for _ in loader) == len(loader)
        if layout is not None:
            loader.reshard(*layout)
    assert loader.world_size == 2 and PinnedBudget.used() == base + lent
    core = loader._source.core
    core.start_epoch(2, 0)
    images, labels, _ = core.next()
    assert images.is_pinned() and labels.is_pinned()  # both copy without staging
    del images, labels
    loader.close()
    assert PinnedBudget.used() == base


@pytest.mark.gpu
def test_the_tail_runs_as_one_kernel_on_a_gpu() -> None:
    """uint8 in, normalised float32 out in channels_last: one kernel (the cast, the layout
    and the arithmetic in it), where the cast then the arithmetic took two."""
    from torch.profiler import ProfilerActivity, profile

    tail = DeviceTail((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    u = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8, device="cuda")
    tail.apply(u, torch.channels_last)  # the constants made on the device first
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = tail.apply(u, torch.channels_last)
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert len(kernels) == 1, [e.name for e in kernels]
    assert out.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["table", "shard fields"])
def test_tables_and_shard_fields_cross_from_pinned_memory_without_a_wait(
        tmp_path: Path, kind: str) -> None:
    """A table's columns and a shard's fields leave page-locked memory, so their copies are
    asynchronous: one queued behind a long kernel on the stage's stream is still pending
    when the loop has its batch (a copy from pageable memory waits for the stream first)."""
    from dask_ddp.data import write_shards

    if kind == "table":
        pq = pytest.importorskip("pyarrow.parquet")
        pa = pytest.importorskip("pyarrow")
        from dask_ddp.data import Table

        ids = np.arange(256, dtype=np.int64)
        pq.write_table(pa.table({"y": ids, "x": ids.astype(np.float32)}),
                       tmp_path / "t.parquet", row_group_size=64)
        loader = Loader(Table.from_parquet(str(tmp_path / "t.parquet")), 32, features=["x"],
                        label="y", device="cuda")
    else:
        samples = [{"npy": np.full((2, 3), i, np.float32), "cls": i} for i in range(64)]
        ds = write_shards(samples, str(tmp_path / "f-{:06d}.tar"), samples_per_shard=16)
        loader = Loader(ds, 8, device="cuda")
    stage = loader._stage
    loader.set_epoch(0)
    it = iter(loader)
    next(it)
    with torch.cuda.stream(stage.stream):
        torch.cuda._sleep(2_000_000_000)  # about a second of GPU time ahead of the copy
    next(it)
    event, host = stage._held._held[-1]
    assert all(t.is_pinned() for t in host if isinstance(t, torch.Tensor))
    assert not event.query(), "the copy waited for the stream (pageable memory)"
    loader.close()


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
def test_a_batch_on_the_device_crosses_nothing() -> None:
    """predict's forward takes batches the Loader's stage already moved: the stage hands
    them on (memory format applied) without a copy, an event or a held host batch; a host
    batch is held, behind a blocking event, until the block ends."""
    stage = DeviceStage(torch.device("cuda"), channels_last=True)
    on_gpu = torch.zeros(2, 3, 4, 4, device="cuda")
    with stage.over([(0, on_gpu)], image_at=1) as moved:
        start, x = next(moved)
        assert start == 0 and x.is_contiguous(memory_format=torch.channels_last)
        assert len(stage._held) == 0
    with stage.over([(0, on_gpu.cpu())], image_at=1) as moved:
        _, x = next(moved)
        assert x.is_cuda and len(stage._held) == 1
    assert len(stage._held) == 0


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
        want.append((item[0].clone(), item[1].clone()))
    core.close()

    core = engine()
    assert core.batch_buffer_bytes == 4 * 3 * 32 * 32 * 4 + 4 * 8  # images, then labels
    with pytest.raises(ValueError, match="lent buffer 0 holds 10 bytes"):
        core.adopt_buffers([np.zeros(10, np.uint8)])
    lent = [np.zeros(core.batch_buffer_bytes, np.uint8) for _ in range(4)]
    core.adopt_buffers(lent)
    starts = {a.ctypes.data for a in lent}
    core.start_epoch(0, 0)
    got, inside = [], 0
    while (item := core.next()) is not None:
        # The labels in the same lent buffer, after the images (pinned on a GPU too).
        inside += (item[0].data_ptr() in starts
                   and item[1].data_ptr() == item[0].data_ptr() + 4 * 3 * 32 * 32 * 4)
        got.append((item[0].clone(), item[1].clone()))
    core.close()
    assert inside == len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g[0], w[0]) and torch.equal(g[1], w[1])


def _epochs(loader: Loader, epochs: int, set_epoch: bool) -> list[list[torch.Tensor]]:
    out = []
    for e in range(epochs):
        if set_epoch:
            loader.set_epoch(e)
        out.append([labels.clone() for _, labels in loader])
    return out


@pytest.mark.parametrize("set_epoch", [True, False])
def test_the_next_epoch_starts_at_the_end_of_one_and_reads_as_a_fresh_start(
        folder: Path, set_epoch: bool) -> None:
    """At an epoch's end the engine already decodes the epoch the loop reads next (the next
    one where it calls set_epoch, else the same one); what it reads is what a fresh Loader
    reads, also after a guess the loop contradicts or a break."""
    ds = ImageFolder(str(folder))
    loader = Loader(ds, 4, transform=TRAIN, seed=3, device="cpu")
    starts: list[tuple[int, int]] = []
    core = loader._source.core
    plain = core.start_epoch

    class Counting:  # the engine loader, its start_epoch calls counted
        def __getattr__(self, name: str) -> Any:
            return getattr(core, name)

        def start_epoch(self, epoch: int, start: int = 0) -> None:
            starts.append((epoch, start))
            plain(epoch, start)

    loader._source.core = Counting()  # type: ignore[assignment]
    seen = _epochs(loader, 3, set_epoch)
    guesses = [(1, 0), (2, 0), (3, 0)] if set_epoch else [(0, 0)] * 3
    assert starts == [(0, 0)] + guesses  # each epoch after the first was started early
    fresh = Loader(ds, 4, transform=TRAIN, seed=3, device="cpu")
    assert all(torch.equal(a, b) for x, y in zip(seen, _epochs(fresh, 3, set_epoch),
                                                 strict=True)
               for a, b in zip(x, y, strict=True))
    # A guess the loop contradicts, and a break: each read equals a fresh Loader's.
    loader.set_epoch(7)
    assert [y.tolist() for _, y in loader] == [y.tolist() for _, y in _at(fresh, 7)]
    for _ in loader:
        break
    loader.set_epoch(8)
    assert [y.tolist() for _, y in loader] == [y.tolist() for _, y in _at(fresh, 8)]
    loader.close()
    fresh.close()


def _at(loader: Loader, epoch: int) -> Loader:
    loader.set_epoch(epoch)
    return loader


def test_a_resume_after_an_early_start_reads_the_saved_position(shards: str) -> None:
    """A state loaded after the next epoch was started early is read from its position."""
    loader = Loader(TarShards(shards), 4, transform=TRAIN, seed=1, device="cpu")
    loader.set_epoch(0)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    rest = [y.tolist() for _, y in it]
    loader.set_epoch(1)
    assert sum(1 for _ in loader) == len(loader)  # epoch 2 started early now
    loader.load_state_dict(state)
    loader.set_epoch(0)
    assert [y.tolist() for _, y in loader] == rest
    loader.close()
