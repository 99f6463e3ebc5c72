"""ImageFolder and the C++ Loader over real files: torchvision parity, determinism,
sharding, resume, buffer lifetime and bad input."""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from torchvision import transforms as tv

from dask_ddp import _core, storage
from dask_ddp.data import ImageFolder, Loader
from dask_ddp.data import transforms as T
from images import encode, file_putter, huge_png, photo, truncated, write_folder

KINDS = ("jpeg", "jpeg-gray", "jpeg-cmyk", "jpeg-progressive", "png", "png-palette", "png-rgba")
SIZES = ((64, 48), (50, 70), (81, 81), (120, 90), (97, 61))
N_PER_CLASS = 8
CLASSES = ("cat", "dog", "eel")

EVAL = T.Compose([T.Resize(40), T.CenterCrop(32), T.ToTensor()])
TRAIN = T.Compose(
    [
        T.RandomResizedCrop(32),
        T.RandomHorizontalFlip(),
        T.ToTensor(),
        T.Normalize([0.5] * 3, [0.25] * 3),
    ]
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("imagefolder")
    write_folder(file_putter(str(root)), CLASSES, N_PER_CLASS, sizes=SIZES, kinds=KINDS)
    (root / "cat" / "notes.txt").write_text("not an image")
    (root / "README.md").write_text("files at the root belong to no class")
    return root


def fingerprints(ds: ImageFolder, transform: T.Transform) -> dict[bytes, int]:
    """Digest of each sample's deterministic transform output -> its index."""
    out = {}
    for i, (path, _) in enumerate(ds.samples):
        with open(path, "rb") as f:
            arr = _core.transform_image(f.read(), transform._ops(), scaled_decode=True)
        out[hashlib.sha1(arr.tobytes()).digest()] = i
    assert len(out) == len(ds), "test images must be distinct"
    return out


def collect(loader: Loader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(x.clone(), y.clone()) for x, y in loader]


def test_imagefolder_matches_torchvision(folder: Path) -> None:
    ours = ImageFolder(folder)
    ref = torchvision.datasets.ImageFolder(str(folder))
    assert ours.classes == ref.classes == sorted(CLASSES)
    assert ours.class_to_idx == ref.class_to_idx
    assert ours.samples == ref.samples
    assert ours.targets == ref.targets
    assert len(ours) == len(CLASSES) * N_PER_CLASS
    for i in (0, 5, len(ours) - 1):
        img, label = ours[i]
        rimg, rlabel = ref[i]
        assert img.mode == "RGB" and label == rlabel
        np.testing.assert_array_equal(np.asarray(img), np.asarray(rimg))


def test_imagefolder_over_file_and_memory_urls(folder: Path) -> None:
    by_file = ImageFolder(f"file://{folder}")
    mem = storage.open("memory://imagefolder-test")
    for path, _ in by_file.samples:
        mem.put(os.path.relpath(path, folder), Path(path).read_bytes())
    by_mem = ImageFolder("memory://imagefolder-test", transform=tv.ToTensor())
    assert by_mem.targets == by_file.targets
    assert by_mem.samples[0][0].startswith("memory://imagefolder-test/")
    x, y = by_mem[3]
    assert isinstance(x, torch.Tensor) and y == by_file.targets[3]


def test_imagefolder_pickles_and_feeds_a_torch_dataloader(folder: Path) -> None:
    ds = ImageFolder(
        folder, transform=tv.Compose([tv.Resize(36), tv.CenterCrop(32), tv.ToTensor()])
    )
    ds[0]  # opens the store; pickling must still work
    clone = pickle.loads(pickle.dumps(ds))
    assert clone.samples == ds.samples
    dl = torch.utils.data.DataLoader(ds, batch_size=5, num_workers=2)
    labels = torch.cat([y for _, y in dl])
    assert labels.tolist() == ds.targets


def test_empty_folder_raises(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.txt").write_text("x")
    with pytest.raises(FileNotFoundError, match=r"no image files .* e\.g\. 'a/x\.txt'"):
        ImageFolder(tmp_path)
    with pytest.raises(FileNotFoundError, match=f"nothing under {tmp_path / 'missing'}"):
        ImageFolder(tmp_path / "missing")


def test_loader_pixels_and_labels_match_the_reference(folder: Path) -> None:
    ds = ImageFolder(folder)
    loader = Loader(ds, 7, transform=EVAL, shuffle=False, num_threads=2)
    assert len(loader) == 4  # 24 samples
    seen = 0
    for images, labels in loader:
        assert images.dtype == torch.float32 and images.shape[1:] == (3, 32, 32)
        assert labels.dtype == torch.int64
        for k in range(images.shape[0]):
            path, target = ds.samples[seen]
            want = _core.transform_image(Path(path).read_bytes(), EVAL._ops(), scaled_decode=True)
            np.testing.assert_array_equal(images[k].numpy(), want)
            assert labels[k].item() == target
            seen += 1
    assert seen == len(ds)


def test_torchvision_eval_pipeline_agrees(folder: Path) -> None:
    ds = ImageFolder(folder, transform=EVAL._torchvision())
    loader = Loader(ds, 8, transform=EVAL, shuffle=False)
    images = torch.cat([x for x, _ in loader])
    ref = torch.stack([ds[i][0] for i in range(len(ds))])
    assert (images - ref).abs().mean().item() < 3.0 / 255  # the documented tolerance


def test_deterministic_across_thread_counts(folder: Path) -> None:
    ds = ImageFolder(folder)
    runs = []
    for threads in (1, 2, 4):
        loader = Loader(ds, 5, transform=TRAIN, seed=3, num_threads=threads, prefetch=2)
        loader.set_epoch(2)
        runs.append(collect(loader))
    for other in runs[1:]:
        assert len(other) == len(runs[0])
        for (a, la), (b, lb) in zip(runs[0], other, strict=True):
            assert torch.equal(a, b) and torch.equal(la, lb)


def test_epochs_reshuffle_and_repeat(folder: Path) -> None:
    ds = ImageFolder(folder)
    loader = Loader(ds, 6, transform=EVAL, seed=1)
    first = collect(loader)
    again = collect(loader)
    loader.set_epoch(1)
    other = collect(loader)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(first, again, strict=True))
    assert not all(torch.equal(a[1], b[1]) for a, b in zip(first, other, strict=True))


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_shards_cover_every_index_once(folder: Path, world_size: int) -> None:
    ds = ImageFolder(folder)
    fp = fingerprints(ds, EVAL)
    for epoch in (0, 1):
        seen: list[int] = []
        for rank in range(world_size):
            loader = Loader(ds, 4, transform=EVAL, rank=rank, world_size=world_size, seed=5)
            loader.set_epoch(epoch)
            assert loader.num_samples == len(ds) // world_size
            for images, labels in loader:
                for img, label in zip(images, labels, strict=True):
                    idx = fp[hashlib.sha1(img.numpy().tobytes()).digest()]
                    assert ds.targets[idx] == label.item()
                    seen.append(idx)
        assert sorted(seen) == list(range(len(ds))), f"epoch {epoch}"


def test_uneven_shards_pad_like_torch(folder: Path) -> None:
    ds = ImageFolder(folder)  # 24 samples
    lens = [Loader(ds, 4, transform=EVAL, rank=r, world_size=5).num_samples for r in range(5)]
    assert lens == [5] * 5  # ceil(24 / 5), padded as DistributedSampler
    dropped = Loader(ds, 4, transform=EVAL, rank=0, world_size=5, drop_last=True)
    assert dropped.num_samples == 4 and len(dropped) == 1


def test_resume_from_state_dict(folder: Path) -> None:
    ds = ImageFolder(folder)
    full = Loader(ds, 5, transform=TRAIN, seed=9)
    full.set_epoch(4)
    want = collect(full)
    first = Loader(ds, 5, transform=TRAIN, seed=9)
    first.set_epoch(4)
    it = iter(first)
    for _ in range(2):
        next(it)
    state = first.state_dict()
    assert state["epoch"] == 4 and state["batch"] == 2
    resumed = Loader(ds, 5, transform=TRAIN, seed=9)
    resumed.load_state_dict(state)
    rest = collect(resumed)
    assert len(rest) == len(want) - 2
    for (a, la), (b, lb) in zip(rest, want[2:], strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)
    with pytest.raises(ValueError, match="seed"):
        Loader(ds, 5, transform=TRAIN, seed=1).load_state_dict(state)


def test_kept_batches_are_never_overwritten(folder: Path) -> None:
    ds = ImageFolder(folder)
    loader = Loader(ds, 2, transform=TRAIN, prefetch=2, num_threads=2)
    kept = list(loader)  # holds every batch tensor while the loader keeps producing
    copies = collect(loader)
    assert len(kept) == len(copies) == 12
    for (a, la), (b, lb) in zip(kept, copies, strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)
    del kept  # freeing returns buffers to the pool
    assert len(collect(loader)) == 12


def test_uint8_output(folder: Path) -> None:
    loader = Loader(
        ImageFolder(folder), 8, transform=T.Compose([T.CenterCrop(16), T.PILToTensor()])
    )
    images, labels = next(iter(loader))
    assert images.dtype == torch.uint8 and images.shape == (8, 3, 16, 16)


def test_uint8_train_pipeline_matches_torchvision_and_the_float_path(folder: Path) -> None:
    """The PILToTensor pipeline (normalise on the GPU): each uint8 sample is torchvision's
    resized_crop + hflip of the same planned box (PIL, antialiased) within the documented
    tolerance, and exactly the float32 ToTensor pipeline's values times 255."""
    from PIL import Image
    from torchvision.transforms import functional as F

    u8 = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.PILToTensor()])
    f32 = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToTensor()])
    ds = ImageFolder(folder)
    kw = {"shuffle": False, "seed": 5, "scaled_decode": False, "region_decode": True}
    a = collect(Loader(ds, 8, transform=u8, **kw))
    b = collect(Loader(ds, 8, transform=f32, **kw))
    images = torch.cat([x for x, _ in a])
    assert images.dtype == torch.uint8 and images.shape == (len(ds), 3, 32, 32)
    floats = torch.cat([x for x, _ in b])
    assert torch.equal(images.float() * torch.tensor(1 / 255, dtype=torch.float32), floats)
    diffs = []
    for i, (path, _) in enumerate(ds.samples):
        with Image.open(path) as img:
            rgb = img.convert("RGB")
        boxes, flips, _, _ = _core.sample_plan(*rgb.size, u8._ops(), 5, 0, i)
        ref = F.resized_crop(rgb, *boxes[0], [32, 32], antialias=True)
        if flips[0]:
            ref = F.hflip(ref)
        ref_t = tv.PILToTensor()(ref)
        diffs.append((images[i].int() - ref_t.int()).abs().float().mean().item())
        # A flip applied on the wrong side would be far off: check orientation per sample.
        mirrored = (images[i].int() - F.hflip(ref_t).int()).abs().float().mean().item()
        assert diffs[-1] <= mirrored or diffs[-1] < 1.0, (path, diffs[-1], mirrored)
    assert float(np.mean(diffs)) <= 3.0, diffs  # DOWNSCALE_MEAN in data/test_transforms.py


def test_torchvision_transform_is_a_type_error(folder: Path) -> None:
    ds = ImageFolder(folder, transform=tv.ToTensor())
    with pytest.raises(TypeError, match="dask_ddp.data.transforms"):
        Loader(ds, 4, transform=tv.Compose([tv.CenterCrop(8), tv.ToTensor()]))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="map-style"):
        Loader(ds, 4)  # the dataset's own torchvision transform cannot run in C++
    with pytest.raises(ValueError, match="fixed output size"):
        Loader(ImageFolder(folder), 4)
    with pytest.raises(ValueError, match="on_error"):
        Loader(ImageFolder(folder), 4, transform=EVAL, on_error="ignore")
    with pytest.raises(ValueError, match="rank and world_size"):
        Loader(ImageFolder(folder), 4, transform=EVAL, rank=1)


@pytest.fixture
def bad_folder(tmp_path: Path) -> Path:
    put = file_putter(str(tmp_path))
    write_folder(put, ("a", "b"), 5, sizes=((40, 30),))
    put("a/zero.jpg", b"")
    put("a/truncated.jpg", truncated(encode(photo(200, 150), "jpeg"), 0.5))
    put("b/garbage.png", b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)
    put("b/huge.png", huge_png())
    return tmp_path


@pytest.mark.parametrize("name", ["a/zero.jpg", "a/truncated.jpg", "b/garbage.png", "b/huge.png"])
def test_bad_image_raises_naming_its_url(bad_folder: Path, name: str) -> None:
    ds = ImageFolder(bad_folder)
    keep = [i for i, (p, _) in enumerate(ds.samples) if p.endswith(name) or "img_000" in p]
    ds._keys = [ds._keys[i] for i in keep]
    ds.targets = [ds.targets[i] for i in keep]
    ds.samples = [ds.samples[i] for i in keep]
    with pytest.raises((OSError, ValueError)) as info:
        for _ in Loader(ds, 2, transform=EVAL, shuffle=False):
            pass
    assert name in str(info.value)


def test_bad_images_are_skipped_and_counted(bad_folder: Path) -> None:
    ds = ImageFolder(bad_folder)
    assert len(ds) == 14
    loader = Loader(ds, 4, transform=EVAL, on_error="skip")
    total = sum(x.shape[0] for x, _ in loader)
    assert total == 10 and loader.skipped == 4
    sum(x.shape[0] for x, _ in loader)
    assert loader.skipped == 8  # counted again in the second epoch


def test_object_deleted_after_listing_is_not_found(tmp_path: Path) -> None:
    write_folder(file_putter(str(tmp_path)), ("a",), 3, sizes=((40, 30),))
    ds = ImageFolder(tmp_path)
    os.remove(ds.samples[1][0])
    with pytest.raises(FileNotFoundError, match="img_0001"):
        list(Loader(ds, 3, transform=EVAL, shuffle=False))
    shutil.rmtree(tmp_path / "a")


def test_rank_and_world_size_from_the_process_group(folder: Path, tmp_path: Path) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        loader = Loader(ImageFolder(folder), 4, transform=EVAL)
        assert (loader.rank, loader.world_size) == (0, 1)
        assert Loader(ImageFolder(folder), 4, transform=EVAL, world_size=2).world_size == 2
    finally:
        dist.destroy_process_group()


def test_imagefolder_and_loader_over_http(folder: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    from conftest import free_port, wait_for_port

    local = ImageFolder(folder)
    keys = [os.path.relpath(p, folder) for p, _ in local.samples]
    (folder / storage.LISTING_FILE).write_text("".join(f"{k}\n" for k in keys))
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", "-b", "127.0.0.1", "-d", str(folder), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, server)
        remote = ImageFolder(f"http://127.0.0.1:{port}")
        assert remote.targets == local.targets and remote.classes == local.classes
        a = collect(Loader(remote, 6, transform=TRAIN, seed=4))
        b = collect(Loader(local, 6, transform=TRAIN, seed=4))
        for (xa, ya), (xb, yb) in zip(a, b, strict=True):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)
    finally:
        server.terminate()
        server.wait(timeout=10)
        (folder / storage.LISTING_FILE).unlink()


def test_subset_of_a_folder_reads_just_its_indices(folder: Path) -> None:
    ds = ImageFolder(folder)
    picked = [5, 2, 17, 3, 11, 22, 8]
    inner = torch.utils.data.Subset(ds, list(range(2, 24)))  # nested subsets compose
    nested = torch.utils.data.Subset(inner, [i - 2 for i in picked])
    for subset in (torch.utils.data.Subset(ds, picked), nested):
        loader = Loader(subset, 3, transform=EVAL, shuffle=False, num_threads=2)
        images = torch.cat([x for x, _ in loader])
        labels = torch.cat([y for _, y in loader])
        assert labels.tolist() == [ds.targets[i] for i in picked]
        for k, i in enumerate(picked):
            want = _core.transform_image(Path(ds.samples[i][0]).read_bytes(), EVAL._ops(),
                                         scaled_decode=True)
            np.testing.assert_array_equal(images[k].numpy(), want)
    with pytest.raises(IndexError, match="Subset index 24"):
        Loader(torch.utils.data.Subset(ds, [0, 24]), 3, transform=EVAL)
    with pytest.raises(TypeError, match="list"):
        Loader([1, 2], 3, transform=EVAL)  # type: ignore[arg-type]


def test_close_from_another_thread_while_next_waits(folder: Path) -> None:
    """close() from a second thread while the first waits in next() with the GIL
    released: the waiter gets ValueError (closed), never a crash (the engine used to be
    destroyed under it). 100 rounds, closing at varied moments."""
    def close_after(loader: Loader, delay: float) -> None:
        time.sleep(delay)
        loader.close()

    ds = ImageFolder(folder)
    for round_ in range(100):
        loader = Loader(ds, batch_size=len(ds), transform=TRAIN, num_threads=1, prefetch=1)
        it = iter(loader)
        closer = threading.Thread(target=close_after, args=(loader, (round_ % 10) * 0.0005))
        closer.start()
        try:
            for _ in it:
                pass
        except ValueError as e:
            assert "closed" in str(e)
        closer.join()
        with pytest.raises(ValueError, match="closed"):
            next(iter(loader))
        loader.close()  # twice: harmless


def test_decode_buffer_is_not_kept_for_a_large_image(tmp_path: Path) -> None:
    """A thread that decoded one large image does not keep its buffer (it used to keep
    each thread's largest image for the loader's life)."""
    put = file_putter(str(tmp_path))
    for i in range(6):
        put(f"a/{i}.jpg", encode(photo(48, 40, seed=i), "jpeg"))
    put("a/big.jpg", encode(photo(3000, 2000, seed=9), "jpeg"))  # 18 MB of RGB
    loader = Loader(
        ImageFolder(tmp_path),
        batch_size=7,
        transform=TRAIN,
        num_threads=2,
        scaled_decode=False,
        region_decode=False,
    )
    assert len([x for x, _ in loader]) == 1
    deadline = time.monotonic() + 5  # each thread settles its buffer after its sample
    while loader._source.core.decode_buffer_bytes >= 3000 * 2000 * 3:
        assert time.monotonic() < deadline, loader._source.core.decode_buffer_bytes
        time.sleep(0.01)
    # At most each thread's small buffer stays. Not "> 0": when one thread happens to take
    # every sample, the big image comes last and that thread's buffer is dropped to nothing.
    assert loader._source.core.decode_buffer_bytes <= 2 * (16 << 20)
