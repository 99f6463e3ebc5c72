"""TarShards and write_shards: real tar files (Python's tarfile, webdataset's writer and
our own), read by the engine from files, a real http server and a moto S3 server."""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dask_ddp import _core, storage
from dask_ddp.data import ImageList, Loader, TarShards, write_shards
from dask_ddp.data import transforms as T
from dask_ddp.data.shards import expand_shard_urls
from images import encode, photo

EXACT = T.Compose([T.Resize(20), T.CenterCrop(20), T.PILToTensor()])
TRAIN = T.Compose([T.RandomResizedCrop(16), T.RandomHorizontalFlip(), T.PILToTensor()])
SIZES = ((64, 48), (50, 70), (81, 81), (40, 90))


def images(n: int) -> list[bytes]:
    """n real photos, JPEG and PNG, of a few sizes."""
    out = []
    for i in range(n):
        w, h = SIZES[i % len(SIZES)]
        out.append(encode(photo(w, h, i), "png" if i % 5 == 4 else "jpeg"))
    return out


def ext(data: bytes) -> str:
    return "png" if data.startswith(b"\x89PNG") else "jpg"


def tar_shard(members: list[tuple[str, bytes]], fmt: int = tarfile.USTAR_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def sample_members(first: int, blobs: list[bytes], prefix: str = "") -> list[tuple[str, bytes]]:
    """Members of samples first, first+1, ...: image, label (= the sample number), json."""
    out = []
    for i, data in enumerate(blobs, start=first):
        out.append((f"{prefix}{i:06d}.{ext(data)}", data))
        out.append((f"{prefix}{i:06d}.cls", str(i).encode()))
        out.append((f"{prefix}{i:06d}.json", b'{"label": %d}' % (1000 + i)))
    return out


def write_tar_shards(
    put: Any, blobs: list[bytes], sizes: list[int], fmt: int = tarfile.USTAR_FORMAT
) -> list[str]:
    """Shards shard-000000.tar, ... with ``sizes`` samples each; returns their keys."""
    keys, first = [], 0
    for s, n in enumerate(sizes):
        key = f"shard-{s:06d}.tar"
        put(key, tar_shard(sample_members(first, blobs[first : first + n]), fmt))
        keys.append(key)
        first += n
    return keys


def file_put(root: Path) -> Any:
    def put(key: str, data: bytes) -> None:
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(data)

    return put


def expected(blob: bytes, transform: Any = EXACT) -> torch.Tensor:
    ops = T.to_ops(transform)
    return torch.from_numpy(
        np.asarray(_core.transform_image(blob, ops, scaled_decode=True, region_decode=True))
    )


def read_all(loader: Loader, epoch: int = 0) -> tuple[list[int], list[torch.Tensor]]:
    loader.set_epoch(epoch)
    labels: list[int] = []
    pixels: list[torch.Tensor] = []
    for x, y in loader:
        labels += y.tolist()
        pixels += [t.clone() for t in x]
    return labels, pixels


def check_exact(loader: Loader, blobs: list[bytes]) -> list[int]:
    labels, pixels = read_all(loader)
    for label, px in zip(labels, pixels, strict=True):
        assert torch.equal(px, expected(blobs[label])), f"sample {label}"
    return labels


# ---- reading ---------------------------------------------------------------------------


def test_brace_expansion() -> None:
    assert expand_shard_urls("s3://b/s-{000..002}.tar") == [
        f"s3://b/s-{i:03d}.tar" for i in range(3)
    ]
    assert expand_shard_urls("a{1..2}/b{0..1}.tar") == [
        "a1/b0.tar",
        "a1/b1.tar",
        "a2/b0.tar",
        "a2/b1.tar",
    ]
    with pytest.raises(ValueError, match="descending"):
        expand_shard_urls("s-{3..1}.tar")


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_tarfile_shards_from_files_every_sample_once_and_exact(tmp_path: Path, fmt: int) -> None:
    blobs = images(23)
    write_tar_shards(file_put(tmp_path), blobs, [8, 8, 7], fmt)
    ds = TarShards(str(tmp_path / "shard-{000000..000002}.tar"))
    assert ds.counts == [8, 8, 7] and len(ds) == 23
    loader = Loader(ds, 5, transform=EXACT, shuffle=False, num_threads=2)
    assert len(loader) == 5
    assert check_exact(loader, blobs) == list(range(23))


def test_webdataset_writer_shards_and_json_labels(tmp_path: Path) -> None:
    wds = pytest.importorskip("webdataset")
    blobs = images(12)
    pattern = str(tmp_path / "wds-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=5, verbose=0) as sink:
        for i, data in enumerate(blobs):
            sink.write(
                {"__key__": f"s{i:04d}", ext(data): data, "cls": i, "json": {"label": 100 + i}}
            )
    ds = TarShards(str(tmp_path / "wds-{000000..000002}.tar"))
    assert ds.counts == [5, 5, 2]
    assert sorted(check_exact(Loader(ds, 4, transform=EXACT, seed=1), blobs)) == list(range(12))
    by_json = TarShards(str(tmp_path / "wds-{000000..000002}.tar"), label_field="label")
    labels, _ = read_all(Loader(by_json, 4, transform=EXACT, shuffle=False))
    assert labels == [100 + i for i in range(12)]


def test_pax_long_names_prefix_listing_and_url_list(tmp_path: Path) -> None:
    blobs = images(6)
    deep = "d" * 90 + "/" + "e" * 90 + "/"  # member names past ustar's 100 + 155 limit
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "b.tar").write_bytes(
        tar_shard(sample_members(3, blobs[3:], deep), tarfile.PAX_FORMAT)
    )
    (tmp_path / "train" / "a.tar").write_bytes(
        tar_shard(sample_members(0, blobs[:3], deep), tarfile.PAX_FORMAT)
    )
    (tmp_path / "train" / "notes.txt").write_bytes(b"not a shard")
    listed = TarShards(f"file://{tmp_path}/train/")
    assert listed.keys == ["a.tar", "b.tar"]
    assert check_exact(Loader(listed, 4, transform=EXACT, shuffle=False), blobs) == list(range(6))
    given = TarShards([str(tmp_path / "train" / "b.tar"), str(tmp_path / "train" / "a.tar")])
    assert read_all(Loader(given, 4, transform=EXACT, shuffle=False))[0] == [3, 4, 5, 0, 1, 2]


def test_truncated_empty_and_imageless_shards(tmp_path: Path) -> None:
    blobs = images(9)
    write_tar_shards(file_put(tmp_path), blobs, [3, 3, 3])
    whole = (tmp_path / "shard-000001.tar").read_bytes()
    (tmp_path / "shard-000001.tar").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(
        OSError,
        match=r"shard-000001\.tar: tar member at byte \d+: member of \d+ bytes is cut short",
    ):
        TarShards(str(tmp_path / "shard-{000000..000002}.tar")).shard_counts()
    skipping = TarShards(str(tmp_path / "shard-{000000..000002}.tar"))
    loader = Loader(skipping, 4, transform=EXACT, shuffle=False, on_error="skip")
    labels = check_exact(loader, blobs)
    assert labels[:3] == [0, 1, 2] and labels[-3:] == [6, 7, 8] and 6 <= len(labels) < 9
    assert loader.skipped >= 1

    # An empty shard (just the end marker) and one holding a sample without an image.
    (tmp_path / "shard-000001.tar").write_bytes(tar_shard([]))
    (tmp_path / "shard-000003.tar").write_bytes(
        tar_shard([("x.cls", b"1"), ("x.txt", b"no image")])
    )
    bad = TarShards(str(tmp_path / "shard-{000000..000003}.tar"))
    with pytest.raises(
        ValueError, match=r"shard-000003\.tar: tar member at byte 0: sample 'x' has no image"
    ):
        bad.shard_counts()
    ok = TarShards(str(tmp_path / "shard-{000000..000003}.tar"))
    loader = Loader(ok, 4, transform=EXACT, shuffle=False, on_error="skip")
    assert ok.shard_counts(skip_errors=True) == [3, 0, 3, 0]
    assert check_exact(loader, blobs) == [0, 1, 2, 6, 7, 8]
    assert ok.skipped == 1  # found when counting; a shard without good samples is not read again


def test_http_and_s3_stores(http_server: tuple[str, Path], s3_bucket: str) -> None:
    blobs = images(10)
    url, root = http_server
    write_tar_shards(file_put(root / "shards-http"), blobs, [4, 6])
    over_http = TarShards(f"{url}/shards-http/shard-{{000000..000001}}.tar")
    assert check_exact(Loader(over_http, 3, transform=EXACT, shuffle=False), blobs) == list(
        range(10)
    )
    s3 = storage.open(f"s3://{s3_bucket}/train")
    write_tar_shards(s3.put, blobs, [5, 5])
    over_s3 = TarShards(f"s3://{s3_bucket}/train/")
    assert sorted(check_exact(Loader(over_s3, 3, transform=EXACT, seed=4), blobs)) == list(
        range(10)
    )
    # Shards over the store's answer limit are read with ranged GETs in pieces.
    limit = min(i.size for i in s3.list("")) - 1
    capped = TarShards(
        f"s3://{s3_bucket}/train/",
        storage_options={"max_body_bytes": limit},
        range_bytes=limit // 3,
    )
    with pytest.raises(OSError, match="max_body_bytes"):
        capped.store.get("shard-000000.tar")
    assert capped.counts == [5, 5]
    loader = Loader(capped, 3, transform=EXACT, shuffle=False)
    assert check_exact(loader, blobs) == list(range(10))


# ---- order, equal batches, resume ---------------------------------------------------------


@pytest.fixture
def uneven(tmp_path: Path) -> TarShards:
    """41 samples in 7 shards of uneven sizes (labels = sample numbers)."""
    write_tar_shards(file_put(tmp_path), images(41), [7, 7, 7, 7, 7, 4, 2])
    return TarShards(str(tmp_path / "shard-{000000..000006}.tar"), shuffle_buffer=5)


def epoch_counts(
    ds: TarShards, world: int, drop_last: bool, epoch: int, batch_size: int = 8, seed: int = 2
) -> tuple[Counter[int], int, int]:
    """How often each sample is yielded over every rank's epoch, batches per rank and
    samples per rank (before the last incomplete batch is dropped)."""
    seen: Counter[int] = Counter()
    batches = set()
    samples = set()
    for rank in range(world):
        loader = Loader(
            ds,
            batch_size,
            transform=TRAIN,
            seed=seed,
            rank=rank,
            world_size=world,
            drop_last=drop_last,
            num_threads=1,
        )
        loader.set_epoch(epoch)
        n = 0
        for _, y in loader:
            seen.update(y.tolist())
            n += 1
        assert n == len(loader)
        batches.add(n)
        samples.add(loader.num_samples)
        loader.close()
    assert len(batches) == 1, f"batches per rank differ: {batches}"
    assert len(samples) == 1, f"samples per rank differ: {samples}"
    return seen, batches.pop(), samples.pop()


@pytest.mark.parametrize("drop_last", [False, True])
def test_three_ranks_two_epochs_equal_batches_and_coverage(
    uneven: TarShards, drop_last: bool
) -> None:
    for epoch in (0, 1):
        seen, _, _ = epoch_counts(uneven, 3, drop_last, epoch, batch_size=4, seed=7)
        if not drop_last:
            assert set(seen) == set(range(41)), f"epoch {epoch} missed {set(range(41)) - set(seen)}"
        else:
            assert max(seen.values()) == 1
    orders = [read_all(Loader(uneven, 4, transform=TRAIN, seed=7), e)[0] for e in (0, 1)]
    assert orders[0] != orders[1] and sorted(orders[0]) == sorted(orders[1]) == list(range(41))


def test_exact_resume_mid_epoch(uneven: TarShards) -> None:
    def make() -> Loader:
        return Loader(uneven, 4, transform=TRAIN, seed=3, rank=1, world_size=2, num_threads=2)

    full = make()
    labels, pixels = read_all(full, 1)
    stopped = make()
    stopped.set_epoch(1)
    it = iter(stopped)
    for _ in range(2):
        next(it)
    state = stopped.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    resumed.set_epoch(1)  # a training loop calls it every epoch: keeps the position
    rest_labels, rest_pixels = [], []
    for x, y in resumed:
        rest_labels += y.tolist()
        rest_pixels += [t.clone() for t in x]
    assert rest_labels == labels[8:]
    assert all(torch.equal(a, b) for a, b in zip(rest_pixels, pixels[8:], strict=True))


def test_resume_on_another_world_size_reads_exactly_the_unseen_samples(uneven: TarShards) -> None:
    before: Counter[int] = Counter()
    states = []
    for rank in range(3):
        loader = Loader(uneven, 2, transform=TRAIN, seed=5, rank=rank, world_size=3)
        loader.set_epoch(2)
        it = iter(loader)
        for _ in range(4):
            before.update(next(it)[1].tolist())
        states.append(loader.state_dict())
    assert sum(before.values()) == 24 and max(before.values()) == 1
    after: Counter[int] = Counter()
    batches = set()
    for rank in range(2):
        loader = Loader(uneven, 2, transform=TRAIN, seed=5, rank=rank, world_size=2)
        loader.load_state_dict(states[0])
        loader.set_epoch(2)
        n = 0
        for _, y in loader:
            after.update(y.tolist())
            n += 1
        batches.add(n)
        assert loader.state_dict()["epoch_segments"] is not None
    assert len(batches) == 1
    # Every sample not yielded before is read after; none yielded before is read again;
    # the new split pads with at most world_size - 1 repeats.
    assert set(after) == set(range(41)) - set(before)
    assert sum(after.values()) - len(after) <= 1
    # A state of the resized run resumes again (its segments travel in the state).
    again = Loader(uneven, 2, transform=TRAIN, seed=5, rank=1, world_size=2)
    first = Loader(uneven, 2, transform=TRAIN, seed=5, rank=1, world_size=2)
    first.load_state_dict(states[0])
    first.set_epoch(2)
    it = iter(first)
    next(it)
    again.load_state_dict(first.state_dict())
    again.set_epoch(2)
    tail = [y.tolist() for _, y in again]
    assert tail == [y.tolist() for _, y in it]


def test_state_with_whole_shards_of_an_earlier_version_still_loads(uneven: TarShards) -> None:
    loader = Loader(uneven, 4, transform=TRAIN, seed=5, shuffle=False)
    state = {**loader.state_dict(), "epoch_segments": None, "epoch_shards": [6, 5]}
    loader.load_state_dict(state)
    assert read_all(loader)[0] == [39, 40, 35, 36, 37, 38]


def wds_shards(root: Path, n: int, per_shard: int) -> tuple[TarShards, list[bytes]]:
    """``n`` samples (label = sample number) in shards of ``per_shard`` written by
    webdataset's ShardWriter."""
    wds = pytest.importorskip("webdataset")
    blobs = [encode(photo(24, 20, i % 7), "jpeg") for i in range(n)]
    with wds.ShardWriter(str(root / "w-%06d.tar"), maxcount=per_shard, verbose=0) as sink:
        for i, data in enumerate(blobs):
            sink.write({"__key__": f"s{i:05d}", "jpg": data, "cls": i})
    last = (n - 1) // per_shard
    return TarShards(str(root / f"w-{{000000..{last:06d}}}.tar"), shuffle_buffer=16), blobs


@pytest.mark.parametrize("world", [2, 3, 8])
@pytest.mark.parametrize("drop_last", [False, True])
def test_balance_over_ranks_with_webdataset_shards(
    tmp_path: Path, world: int, drop_last: bool
) -> None:
    # 203 samples in 7 shards (6 of 30, one of 23), as webdataset's ShardWriter writes them.
    ds, _ = wds_shards(tmp_path, 203, 30)
    assert ds.counts == [30] * 6 + [23]
    for epoch in (0, 1):
        seen, batches, per_rank = epoch_counts(ds, world, drop_last, epoch)
        repeats = sum(seen.values()) - len(seen)
        if drop_last:
            # At most world_size - 1 samples dropped by the split, then each rank's last
            # incomplete batch.
            assert per_rank == 203 // world and 203 - per_rank * world <= world - 1
            assert repeats == 0 and len(seen) == batches * 8 * world
        else:
            assert per_rank == -(-203 // world)
            assert set(seen) == set(range(203)), f"epoch {epoch} missed samples"
            assert repeats == -203 % world <= world - 1


# ---- any member type -----------------------------------------------------------------------


def wds_fields_shards(root: Path, n: int, per_shard: int, array: Any = None) -> list[bytes]:
    """Shards written by webdataset's ShardWriter with an image, an array, an integer,
    text and JSON per sample; returns the images."""
    wds = pytest.importorskip("webdataset")
    blobs = [encode(photo(24, 20, i), "jpeg") for i in range(n)]
    with wds.ShardWriter(str(root / "f-%06d.tar"), maxcount=per_shard, verbose=0) as sink:
        for i, data in enumerate(blobs):
            sample = {
                "__key__": f"s{i:05d}",
                "jpg": data,
                "npy": np.arange(6, dtype=np.float32).reshape(2, 3) * i
                if array is None
                else array(i),
                "cls": i,
                "txt": f"caption {i} \u00e9",
                "json": {"i": i, "tags": ["a", str(i)]},
            }
            sink.write(sample)
    return blobs


def test_fields_from_webdataset_shards_in_their_order(tmp_path: Path) -> None:
    blobs = wds_fields_shards(tmp_path, 10, 4)
    pattern = str(tmp_path / "f-{000000..000002}.tar")
    ds = TarShards(pattern, fields=("txt", "jpg", "npy", "cls", "json"))
    assert ds.counts == [4, 4, 2] and ds.image_field == 1
    loader = Loader(ds, 4, transform=EXACT, shuffle=False, num_threads=2)
    seen = 0
    for txt, images, arrays, cls, meta in loader:
        ids = cls.tolist()
        assert ids == list(range(seen, seen + len(ids)))
        assert txt == [f"caption {i} \u00e9" for i in ids]
        assert meta == [{"i": i, "tags": ["a", str(i)]} for i in ids]
        assert arrays.dtype == torch.float32 and arrays.shape == (len(ids), 2, 3)
        want = torch.arange(6, dtype=torch.float32).reshape(2, 3)
        assert torch.equal(arrays, torch.stack([want * i for i in ids]))
        assert cls.dtype == torch.int64
        for i, px in zip(ids, images, strict=True):
            assert torch.equal(px, expected(blobs[i]))
        seen += len(ids)
    assert seen == 10
    # The default stays (image, label); the label from .cls.
    labels, _ = read_all(Loader(TarShards(pattern), 4, transform=EXACT, shuffle=False))
    assert labels == list(range(10))


def test_arrays_without_images_need_no_transform(tmp_path: Path) -> None:
    wds_fields_shards(tmp_path, 9, 5, array=lambda i: np.full((3,), i, dtype=np.int16))
    ds = TarShards(str(tmp_path / "f-{000000..000001}.tar"), fields=("npy", "cls"))
    assert ds.image_field is None
    got: dict[int, list[int]] = {}
    for arrays, cls in Loader(ds, 4, seed=3, rank=1, world_size=2):
        assert arrays.dtype == torch.int16 and arrays.shape[1:] == (3,)
        for a, c in zip(arrays.tolist(), cls.tolist(), strict=True):
            got[c] = a
    assert got and all(a == [c, c, c] for c, a in got.items())


def test_arrays_of_different_shapes_or_bad_headers_are_errors(tmp_path: Path) -> None:
    wds_fields_shards(tmp_path, 6, 6, array=lambda i: np.zeros((2 + i % 2,), np.float32))
    ds = TarShards(str(tmp_path / "f-000000.tar"), fields=("npy", "cls"))
    with pytest.raises(
        ValueError, match=r"cannot stack the 'npy' arrays.*has shape \(2,\) f32.*has \(3,\) f32"
    ):
        list(Loader(ds, 4, shuffle=False))
    assert [len(c) for _, c in Loader(ds, 1, shuffle=False)] == [1] * 6

    # A corrupt .npy header: an error naming the shard and the member, or skipped.
    good = np.zeros((2,), np.float32)
    buf = io.BytesIO()
    np.save(buf, good)
    bad = buf.getvalue().replace(b"'descr'", b"'dexcr'")
    members = []
    for i, data in enumerate([buf.getvalue(), bad, buf.getvalue()]):
        members += [(f"k{i}.npy", data), (f"k{i}.cls", str(i).encode())]
    (tmp_path / "bad.tar").write_bytes(tar_shard(members))
    broken = TarShards(str(tmp_path / "bad.tar"), fields=("npy", "cls"))
    with pytest.raises(
        OSError, match=r"bad\.tar#k1 member 'npy': bad \.npy: unknown header key 'dexcr'"
    ):
        list(Loader(broken, 4, shuffle=False))
    skipping = Loader(broken, 4, shuffle=False, on_error="skip")
    assert [c.tolist() for _, c in skipping] == [[0, 2]] and skipping.skipped == 1

    # A sample without one of the fields.
    (tmp_path / "lacking.tar").write_bytes(tar_shard([("k.npy", buf.getvalue())]))
    with pytest.raises(
        ValueError, match=r"lacking\.tar: tar member at byte 0: sample 'k' has no 'cls'"
    ):
        TarShards(str(tmp_path / "lacking.tar"), fields=("npy", "cls")).shard_counts()
    with pytest.raises(ValueError, match="not both"):
        TarShards(str(tmp_path / "bad.tar"), fields=("npy",), label_field="x")


# ---- streaming --------------------------------------------------------------------------

# Reads a shard in a fresh process and prints JSON: its resident memory's growth over the
# read (peak minus the level before), and the seconds to the first batch.
_READ_BIG_SHARD = """
import json, sys, time
from dask_ddp.data import Loader, TarShards, transforms as T
import torch

def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    raise RuntimeError(field + " not in /proc/self/status")

ds = TarShards(sys.argv[1], counts=[int(sys.argv[2])], shuffle_buffer=16)
loader = Loader(ds, 16, transform=T.Compose([T.Resize(32), T.CenterCrop(32), T.PILToTensor()]),
                shuffle=True, num_threads=2, prefetch=2)
next(iter(Loader(ds, 1, transform=loader.transform, shuffle=False, num_threads=1)))  # warm
before = rss("VmRSS:")
t0 = time.monotonic()
first, n = None, 0
for x, y in loader:
    if first is None:
        first = time.monotonic() - t0
    n += len(y)
print(json.dumps({"growth": rss("VmHWM:") - before, "first_batch_s": first, "samples": n}))
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_one_gib_shard_reads_in_bounded_memory(tmp_path: Path) -> None:
    import subprocess
    import sys

    from PIL import Image

    # ~1 MiB JPEGs of noise (incompressible), 1100 of them: a shard over 1 GiB.
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (700, 700, 3), dtype=np.uint8)).save(
        buf, "JPEG", quality=97
    )
    jpeg = buf.getvalue()
    n = (1 << 30) // len(jpeg) + 1
    path = tmp_path / "big.tar"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(n):
            for name, data in ((f"{i:06d}.jpg", jpeg), (f"{i:06d}.cls", str(i).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    assert path.stat().st_size > 1 << 30
    out = subprocess.run(
        [sys.executable, "-c", _READ_BIG_SHARD, f"file://{path}", str(n)],
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["samples"] == n
    assert got["growth"] < 128 << 20, f"resident memory grew by {got['growth'] >> 20} MiB"


# ---- writing ----------------------------------------------------------------------------


def make_image_list(root: Path, n: int) -> tuple[ImageList, list[bytes]]:
    blobs = images(n)
    keys = []
    for i, data in enumerate(blobs):
        key = f"c{i % 3}/img{i:03d}.{'png' if ext(data) == 'png' else 'jpeg'}"
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(data)
        keys.append(key)
    return ImageList(root, keys, list(range(n))), blobs


@pytest.mark.dask
@pytest.mark.timeout(180)
def test_write_shards_on_dask_reads_back_both_ways_and_restarts(tmp_path: Path,
                                                                lease: Any) -> None:
    wds = pytest.importorskip("webdataset")
    source, blobs = make_image_list(tmp_path / "raw", 17)
    out = tmp_path / "out"
    with lease(2) as client:
        ds = write_shards(source, str(out / "shard-{:06d}.tar"), samples_per_shard=5, client=client)
        assert ds.counts == [5, 5, 5, 2]
        assert sorted(os.listdir(out)) == [f"shard-{i:06d}.tar" for i in range(4)]
        assert check_exact(Loader(ds, 4, transform=EXACT, shuffle=False), blobs) == list(range(17))
        # webdataset reads our shards.
        got = {}
        for sample in wds.WebDataset(str(out / "shard-{000000..000003}.tar"), shardshuffle=False):
            img = sample.get("jpg", sample.get("png"))
            got[int(sample["cls"])] = img
        assert got == dict(enumerate(blobs))
        # Restart: complete shards are skipped, a missing one is written again (same bytes).
        before = {p: (out / p).stat().st_mtime_ns for p in os.listdir(out)}
        first = (out / "shard-000002.tar").read_bytes()
        (out / "shard-000002.tar").unlink()
        again = write_shards(
            source, str(out / "shard-{:06d}.tar"), samples_per_shard=5, client=client
        )
        assert again.counts == ds.counts
        assert (out / "shard-000002.tar").read_bytes() == first
        for p, t in before.items():
            if p != "shard-000002.tar":
                assert (out / p).stat().st_mtime_ns == t, f"{p} was rewritten"
    assert not [p for p in os.listdir(out) if not p.endswith(".tar")], "temporary files left"


def test_write_shards_to_s3_and_bad_patterns(tmp_path: Path, s3_bucket: str) -> None:
    source, blobs = make_image_list(tmp_path / "raw", 7)
    ds = write_shards(source, f"s3://{s3_bucket}/train/shard-{{:03d}}.tar", samples_per_shard=3)
    assert [i.key for i in storage.open(f"s3://{s3_bucket}/train").list("")] == [
        "shard-000.tar",
        "shard-001.tar",
        "shard-002.tar",
    ]
    assert check_exact(Loader(ds, 4, transform=EXACT, shuffle=False), blobs) == list(range(7))
    with pytest.raises(ValueError, match="same name"):
        write_shards(source, str(tmp_path / "one.tar"))
    with pytest.raises(ValueError, match="samples_per_shard"):
        write_shards(source, str(tmp_path / "s-{}.tar"), samples_per_shard=0)


def test_write_shards_of_any_member_type_reads_back_both_ways(tmp_path: Path) -> None:
    wds = pytest.importorskip("webdataset")
    samples = [
        {
            "npy": np.full((2, 2), i, dtype=np.float64),
            "cls": i,
            "txt": f"t{i}",
            "json": {"i": i},
            "bin": bytes([i]),
        }
        for i in range(7)
    ]
    ds = write_shards(samples, str(tmp_path / "m-{:03d}.tar"), samples_per_shard=3)
    assert ds.counts == [3, 3, 1] and ds.fields == ("npy", "cls", "txt", "json", "bin")
    arrays, cls, txt, meta, raw = next(iter(Loader(ds, 7, shuffle=False)))
    assert cls.tolist() == list(range(7)) and txt == [f"t{i}" for i in range(7)]
    assert torch.equal(arrays, torch.stack([torch.full((2, 2), float(i)) for i in range(7)]))
    assert meta == [{"i": i} for i in range(7)] and raw == [bytes([i]) for i in range(7)]
    # webdataset decodes them as it writes them.
    back = list(wds.WebDataset(str(tmp_path / "m-{000..002}.tar"), shardshuffle=False).decode())
    assert [int(s["cls"]) for s in back] == list(range(7))
    assert all(np.array_equal(s["npy"], samples[i]["npy"]) for i, s in enumerate(back))
    with pytest.raises(ValueError, match="holds a '.'"):
        write_shards([{"__key__": "a.b", "cls": 1}], str(tmp_path / "x-{}.tar"))
