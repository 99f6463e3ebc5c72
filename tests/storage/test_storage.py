"""dask_ddp.storage on the local back-ends (file://, plain paths, memory://)."""

from __future__ import annotations

import os
import pickle
import threading
import uuid
from pathlib import Path

import pytest

from dask_ddp import storage


@pytest.fixture(params=["path", "file_url", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> storage.Store:
    if request.param == "path":
        return storage.open(str(tmp_path / "root"))
    if request.param == "file_url":
        return storage.open(f"file://{tmp_path / 'root'}")
    return storage.open(f"memory://test-{uuid.uuid4().hex}")


def test_put_get_list_stat_delete(store: storage.Store) -> None:
    store.put("a/b/one.bin", b"\x00\x01payload")
    store.put("a/two.txt", bytearray(b"xy"))
    store.put("c", memoryview(b"abcdef")[1:4])
    assert store.get("a/b/one.bin") == b"\x00\x01payload"
    assert store.get("c") == b"bcd"
    listing = [(i.key, i.size) for i in store.list()]
    assert listing == [("a/b/one.bin", 9), ("a/two.txt", 2), ("c", 3)]
    assert [i.key for i in store.list("a/")] == ["a/b/one.bin", "a/two.txt"]
    info = store.stat("a/two.txt")
    assert (info.key, info.size) == ("a/two.txt", 2)
    assert store.exists("c") and not store.exists("nope")
    store.delete("c")
    store.delete("c")  # missing: no error
    assert not store.exists("c")


def test_ranges(store: storage.Store) -> None:
    data = bytes(range(256)) * 4
    store.put("r", data)
    assert store.get_range("r", 10, 5) == data[10:15]
    assert store.get_range("r", 1000) == data[1000:]
    assert store.get_range("r", 1000, 100) == data[1000:]  # clamped
    assert store.get_range("r", len(data)) == b""
    with pytest.raises(ValueError, match="r"):
        store.get_range("r", len(data) + 1, 1)
    with pytest.raises(ValueError, match="offset"):
        store.get_range("r", -1)


def test_missing_key_names_the_key(store: storage.Store) -> None:
    with pytest.raises(FileNotFoundError, match="missing/key.bin"):
        store.get("missing/key.bin")
    with pytest.raises(FileNotFoundError, match="missing/key.bin"):
        store.stat("missing/key.bin")


def test_get_many_yields_each_key_and_raises_missing(store: storage.Store) -> None:
    want = {f"k/{i:03d}": os.urandom(100 + i) for i in range(50)}
    for k, v in want.items():
        store.put(k, v)
    got = dict(store.get_many(want, max_in_flight=4))
    assert got == want
    it = store.get_many(["k/000", "k/missing"])
    with pytest.raises(FileNotFoundError, match="k/missing"):
        for _ in it:
            pass
    assert list(store.get_many([])) == []


def test_get_many_abandoned_early_does_not_hang(store: storage.Store) -> None:
    for i in range(200):
        store.put(f"x/{i}", b"v" * 10)
    it = store.get_many([f"x/{i}" for i in range(200)], max_in_flight=1)
    assert next(it)[1] == b"v" * 10
    del it  # the background fetch is cancelled and joined


def test_blocking_calls_release_the_gil(store: storage.Store) -> None:
    # Many threads doing store calls at once finish, and each sees whole objects.
    store.put("shared", b"a" * 100_000)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(20):
                assert store.get("shared") == b"a" * 100_000
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_file_put_is_atomic_and_creates_parents(tmp_path: Path) -> None:
    store = storage.open(tmp_path)  # a path object works too
    store.put("deep/er/ckpt.pt", b"1" * 1000)
    store.put("deep/er/ckpt.pt", b"2" * 10)
    assert (tmp_path / "deep/er/ckpt.pt").read_bytes() == b"2" * 10
    assert sorted(p.name for p in (tmp_path / "deep/er").iterdir()) == ["ckpt.pt"]
    assert store.url == f"file://{tmp_path}"


@pytest.mark.parametrize(
    ("url", "exc", "match"),
    [
        ("gs://bucket/x", ValueError, "unsupported URL scheme 'gs'"),
        ("file://relative/path", ValueError, "file:///absolute/path"),
        ("", ValueError, "empty store URL"),
    ],
)
def test_bad_urls(url: str, exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        storage.open(url)


def test_bad_keys_and_options(tmp_path: Path) -> None:
    store = storage.open(str(tmp_path))
    with pytest.raises(ValueError, match=r"\.\./escape"):
        store.put("../escape", b"x")
    with pytest.raises(TypeError, match="bogus"):
        storage.open(str(tmp_path), bogus=1)
    with pytest.raises(TypeError, match="bytes"):
        store.put("k", "a str")  # type: ignore[arg-type]


def test_permission_error(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root ignores file permissions")
    (tmp_path / "ro").mkdir(mode=0o500)
    with pytest.raises(PermissionError, match="ro"):
        storage.open(str(tmp_path / "ro")).put("k", b"v")


def test_store_pickles_as_url_and_options(tmp_path: Path) -> None:
    store = storage.open(tmp_path / "p", max_attempts=2)
    store.put("k", b"v")
    clone = pickle.loads(pickle.dumps(store))
    assert clone.url == store.url and clone.get("k") == b"v"
    mem = storage.open("memory://pickle-test")
    mem.put("k", b"m")
    assert pickle.loads(pickle.dumps(mem)).get("k") == b"m"  # same process: same objects
