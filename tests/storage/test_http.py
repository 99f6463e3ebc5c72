"""http(s):// stores against real servers, and retries against a fault-injecting one."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from dask_ddp import storage
from storage_servers import (
    FAULT_OBJECT_SIZE,
    make_self_signed_cert,
    object_bytes,
    start_fault_server,
    start_http_server,
)
from storage_testutil import run_cpp_conformance


@pytest.fixture
def site(http_server: tuple[str, Path]) -> tuple[storage.Store, Path]:
    """A fresh folder on the HTTP server: the read-only store and the folder behind it."""
    url, root = http_server
    name = uuid.uuid4().hex
    (root / name).mkdir()
    return storage.open(f"{url}/{name}", initial_backoff=0.01), root / name


def test_get_range_stat(site: tuple[storage.Store, Path]) -> None:
    store, folder = site
    data = os.urandom(50_000)
    (folder / "img").mkdir()
    (folder / "img" / "a b+c.jpg").write_bytes(data)  # a key needing URL encoding
    assert store.get("img/a b+c.jpg") == data
    # http.server ignores Range: the store cuts the range out of the whole answer.
    assert store.get_range("img/a b+c.jpg", 100, 50) == data[100:150]
    assert store.get_range("img/a b+c.jpg", 49_990) == data[49_990:]
    assert store.stat("img/a b+c.jpg").size == len(data)
    with pytest.raises(ValueError, match="past the end"):
        store.get_range("img/a b+c.jpg", 60_000, 1)
    assert dict(store.get_many(["img/a b+c.jpg"])) == {"img/a b+c.jpg": data}


def test_missing_object_names_the_key(site: tuple[storage.Store, Path]) -> None:
    store, _ = site
    with pytest.raises(FileNotFoundError, match=r"missing/thing\.jpg.*HTTP 404"):
        store.get("missing/thing.jpg")
    with pytest.raises(FileNotFoundError, match=r"missing/thing\.jpg"):
        store.stat("missing/thing.jpg")


def test_list_reads_the_listing_file(site: tuple[storage.Store, Path]) -> None:
    store, folder = site
    with pytest.raises(NotImplementedError, match=storage.LISTING_FILE):
        store.list()
    for name, size in [("b/2.jpg", 20), ("a/1.jpg", 10), ("c.txt", 3)]:
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_bytes(b"x" * size)
    # Sizes may be given; missing ones are fetched with HEAD.
    (folder / storage.LISTING_FILE).write_text("# dataset\nb/2.jpg\t20\na/1.jpg\n\nc.txt\n")
    assert store.list() == [
        storage.ObjectInfo("a/1.jpg", 10),
        storage.ObjectInfo("b/2.jpg", 20),
        storage.ObjectInfo("c.txt", 3),
    ]
    assert [o.key for o in store.list("b/")] == ["b/2.jpg"]


def test_is_read_only(site: tuple[storage.Store, Path]) -> None:
    store, _ = site
    with pytest.raises(NotImplementedError, match="read-only"):
        store.put("k", b"v")
    with pytest.raises(NotImplementedError, match="read-only"):
        store.delete("k")


def test_cpp_conformance_suite(http_server: tuple[str, Path]) -> None:
    url, root = http_server
    run_cpp_conformance("Http/*", {"DDP_TEST_HTTP_URL": url, "DDP_TEST_HTTP_ROOT": str(root)})


def test_killed_server_is_a_connection_error(tmp_path: Path) -> None:
    (tmp_path / "k").write_bytes(b"v")
    server = start_http_server(tmp_path)
    store = storage.open(server.url, max_attempts=2, initial_backoff=0.01)
    assert store.get("k") == b"v"
    server.kill()
    try:
        with pytest.raises(ConnectionError, match=rf"{server.url}/k.*after 2 attempts"):
            store.get("k")
    finally:
        server.close()


def test_unresolvable_host_is_retried_then_named() -> None:
    """Every attempt after a failed name resolution must run again (libcurl refuses an
    option on the reused handle: this was an INTERNAL "configuring a curl handle" error)."""
    url = "http://no-such-host.invalid/data"  # .invalid never resolves (RFC 6761)
    store = storage.open(url, max_attempts=3, initial_backoff=0.01)
    with pytest.raises(ConnectionError, match=r"no-such-host\.invalid/data/k.*after 3 attempts"):
        store.get("k")
    with pytest.raises(ConnectionError, match=r"no-such-host\.invalid/data/[ab].*after 3 att"):
        list(store.get_many(["a", "b"]))  # the batched (curl multi) path


# ---- fault injection: the same checks through the http:// and the s3:// back-ends ------


def _open(kind: str, fault: Any, mode: str, **options: Any) -> storage.Store:
    options.setdefault("initial_backoff", 0.01)
    if kind == "http":
        return storage.open(f"{fault.url}/{mode}", **options)
    # Path-style S3 against the fault server: the bucket is the mode.
    return storage.open(f"s3://{mode}", endpoint_url=fault.url, anon=True, **options)


@pytest.fixture(params=["http", "s3"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _gets(fault: Any, path: str) -> int:
    return fault.counts().get(f"GET {path}", 0)


def test_throttling_is_retried_until_success(kind: str, fault_server: Any) -> None:
    store = _open(kind, fault_server, "slowdown-2")
    key = f"{uuid.uuid4().hex}.bin"
    assert store.get(key) == object_bytes(f"/slowdown-2/{key}")
    assert _gets(fault_server, f"/slowdown-2/{key}") == 3


def test_persistent_throttling_gives_up_naming_key_status_and_code(
    kind: str, fault_server: Any
) -> None:
    store = _open(kind, fault_server, "slowdown-100", max_attempts=3)
    key = f"{uuid.uuid4().hex}.bin"
    match = rf"{key}: HTTP 503.*after 3 attempts"
    if kind == "s3":
        match = rf"{key}: HTTP 503 SlowDown.*after 3 attempts"
    with pytest.raises(ConnectionError, match=match):
        store.get(key)
    assert _gets(fault_server, f"/slowdown-100/{key}") == 3


def test_dropped_connection_is_retried_and_never_truncates(kind: str, fault_server: Any) -> None:
    store = _open(kind, fault_server, "drop-1")
    key = f"{uuid.uuid4().hex}.bin"
    data = store.get(key)
    assert len(data) == FAULT_OBJECT_SIZE
    assert data == object_bytes(f"/drop-1/{key}")
    assert _gets(fault_server, f"/drop-1/{key}") == 2


def test_always_short_body_is_data_loss_not_short_data(kind: str, fault_server: Any) -> None:
    store = _open(kind, fault_server, "drop-always", max_attempts=3)
    key = f"{uuid.uuid4().hex}.bin"
    with pytest.raises(OSError, match=rf"{key}.*after 3 attempts") as info:
        store.get(key)
    assert not isinstance(info.value, ConnectionError)  # DATA_LOSS, not UNAVAILABLE
    assert "DATA_LOSS" in str(info.value)
    with pytest.raises(OSError, match="DATA_LOSS"):
        list(store.get_many([key]))


@pytest.mark.parametrize(
    ("status", "exc"), [(403, PermissionError), (404, FileNotFoundError), (400, ValueError)]
)
def test_client_errors_are_never_retried(
    kind: str, fault_server: Any, status: int, exc: type[Exception]
) -> None:
    store = _open(kind, fault_server, f"status-{status}", max_attempts=5)
    key = f"{uuid.uuid4().hex}.bin"
    with pytest.raises(exc, match=rf"{key}: HTTP {status}"):
        store.get(key)
    assert _gets(fault_server, f"/status-{status}/{key}") == 1


def test_get_many_retries_each_object_on_its_own(kind: str, fault_server: Any) -> None:
    keys = [f"{uuid.uuid4().hex}-{i}" for i in range(30)]
    modes = ["ok", "slowdown-1", "drop-1"]
    got: dict[str, bytes] = {}
    for mode in modes:
        store = _open(kind, fault_server, mode)
        got.update({f"/{mode}/{k}": v for k, v in store.get_many(keys, max_in_flight=8)})
    assert len(got) == len(keys) * len(modes)
    for path, data in got.items():
        assert data == object_bytes(path), path
    counts = fault_server.counts()
    assert all(counts[f"GET /drop-1/{k}"] == 2 for k in keys)
    assert all(counts[f"GET /slowdown-1/{k}"] == 2 for k in keys)


def test_huge_content_length_is_refused_naming_url_and_limit(
    kind: str, fault_server: Any
) -> None:
    """A server announcing 16 GiB: refused from the header under the default 2 GiB limit
    (the engine used to reserve the announced size, a bad_alloc thrown through libcurl)."""
    store = _open(kind, fault_server, "huge-length", max_attempts=3)
    key = f"{uuid.uuid4().hex}.bin"
    limit = rf"over the limit of {2 << 30} bytes \(store option max_body_bytes\)"
    with pytest.raises(OSError, match=rf"huge-length/{key}.*17179869183.*{limit}") as info:
        store.get(key)
    assert "RESOURCE_EXHAUSTED" in str(info.value)
    assert _gets(fault_server, f"/huge-length/{key}") == 1  # never retried
    with pytest.raises(OSError, match=rf"huge-length/{key}.*{limit}"):
        list(store.get_many([key]))


def test_oversize_body_is_cut_at_max_body_bytes(kind: str, fault_server: Any) -> None:
    """No Content-Length, a body over a small limit: aborted once past it; within a
    large enough limit the same object reads whole."""
    key = f"{uuid.uuid4().hex}.bin"
    small = _open(kind, fault_server, "unsized", max_body_bytes=100_000)
    with pytest.raises(OSError, match=rf"unsized/{key}.*over the limit of 100000 bytes"):
        small.get(key)
    with pytest.raises(OSError, match=rf"unsized/{key}.*over the limit of 100000 bytes"):
        list(small.get_many([key]))
    roomy = _open(kind, fault_server, "unsized", max_body_bytes=FAULT_OBJECT_SIZE)
    assert roomy.get(key) == object_bytes(f"/unsized/{key}")


def test_s3_ranges_against_a_range_server(fault_server: Any) -> None:
    store = _open("s3", fault_server, "ok")
    key = "ranged.bin"
    data = object_bytes(f"/ok/{key}")
    assert store.get_range(key, 1000, 10) == data[1000:1010]
    assert store.get_range(key, len(data) - 5) == data[-5:]
    assert store.get_range(key, len(data)) == b""  # 416 at the end: empty, not an error
    with pytest.raises(ValueError, match="past the end"):
        store.get_range(key, len(data) + 1)


def test_failed_multipart_upload_is_aborted(fault_server: Any) -> None:
    store = _open("s3", fault_server, "mpu-fail", multipart_threshold=5 << 20)
    key = f"{uuid.uuid4().hex}.bin"
    with pytest.raises(ValueError, match=rf"{key} \(part [12] of 2\): HTTP 400 InvalidRequest"):
        store.put(key, b"\0" * (12 << 20))
    counts = fault_server.counts()
    assert counts.get(f"DELETE /mpu-fail/{key}?uploadId=up-1") == 1


def test_abandoned_get_many_stops_fetching(fault_server: Any) -> None:
    store = _open("http", fault_server, "ok")
    prefix = uuid.uuid4().hex
    keys = [f"{prefix}/{i}" for i in range(2000)]
    it = store.get_many(keys, max_in_flight=2)
    key, data = next(it)
    assert data == object_bytes(f"/ok/{key}")
    del it  # cancels the batch: the rest is never requested
    fetched = sum(n for k, n in fault_server.counts().items() if k.startswith(f"GET /ok/{prefix}/"))
    assert fetched < 100, fetched


def test_https_with_a_private_ca(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cert, key = make_self_signed_cert(tmp_path)
    with start_fault_server(tls=(cert, key)) as tls:
        assert tls.url.startswith("https://")
        untrusted = storage.open(f"{tls.url}/ok", max_attempts=3)
        with pytest.raises(ConnectionError, match=rf"{tls.url}/ok/k.*(certificate|SSL)") as info:
            untrusted.get("k")
        assert "attempts" not in str(info.value)  # a certificate problem is not retried
        store = storage.open(f"{tls.url}/drop-1", ca_bundle=str(cert), initial_backoff=0.01)
        assert store.get("k") == object_bytes("/drop-1/k")  # retried over a new TLS session
        assert store.get_range("k", 10, 5) == object_bytes("/drop-1/k")[10:15]
        keys = [f"m{i}" for i in range(20)]
        assert dict(store.get_many(keys)) == {k: object_bytes(f"/drop-1/{k}") for k in keys}
        # S3 over https, trusting the CA through the AWS convention.
        monkeypatch.setenv("AWS_CA_BUNDLE", str(cert))
        s3 = storage.open("s3://ok", endpoint_url=tls.url, anon=True)
        assert s3.get("x") == object_bytes("/ok/x")


# ---- S3's own retry rules: the error code decides, not only the HTTP status ------------


def test_s3_request_timeout_400_is_retried_a_plain_http_400_is_not(
    kind: str, fault_server: Any
) -> None:
    store = _open(kind, fault_server, "reqtimeout-1", max_attempts=3)
    key = f"{uuid.uuid4().hex}.bin"
    path = f"/reqtimeout-1/{key}"
    if kind == "http":  # no S3 error codes over plain HTTP: a 400 is final
        with pytest.raises(ValueError, match=rf"{key}: HTTP 400"):
            store.get(key)
        assert _gets(fault_server, path) == 1
        return
    assert store.get(key) == object_bytes(path)
    assert _gets(fault_server, path) == 2
    # Uploads (where S3 really sends it, for a stalled body) and batched gets too.
    put_key = f"{uuid.uuid4().hex}.bin"
    store.put(put_key, b"payload")
    assert fault_server.counts()[f"PUT /reqtimeout-1/{put_key}"] == 2
    keys = [f"{uuid.uuid4().hex}-{i}" for i in range(10)]
    got = dict(store.get_many(keys, max_in_flight=4))
    assert got == {k: object_bytes(f"/reqtimeout-1/{k}") for k in keys}
    assert all(_gets(fault_server, f"/reqtimeout-1/{k}") == 2 for k in keys)


def test_s3_persistent_request_timeout_gives_up_as_a_timeout(fault_server: Any) -> None:
    store = _open("s3", fault_server, "reqtimeout-100", max_attempts=3)
    key = f"{uuid.uuid4().hex}.bin"
    with pytest.raises(TimeoutError, match=rf"{key}: HTTP 400 RequestTimeout.*after 3 attempts"):
        store.get(key)
    assert _gets(fault_server, f"/reqtimeout-100/{key}") == 3


def test_s3_skewed_clock_is_never_retried(fault_server: Any) -> None:
    store = _open("s3", fault_server, "skewed", max_attempts=5)
    key = f"{uuid.uuid4().hex}.bin"
    with pytest.raises(PermissionError, match=rf"{key}: HTTP 403 RequestTimeTooSkewed") as info:
        store.get(key)
    assert "attempts" not in str(info.value)
    assert _gets(fault_server, f"/skewed/{key}") == 1


def test_stalled_transfer_times_out_and_is_retried(kind: str, fault_server: Any) -> None:
    store = _open(kind, fault_server, "stall-1", low_speed_timeout=1)
    key = f"{uuid.uuid4().hex}.bin"
    assert store.get(key) == object_bytes(f"/stall-1/{key}")
    assert _gets(fault_server, f"/stall-1/{key}") == 2


@pytest.mark.parametrize("mode, words", [("list-loop", "repeated a continuation token"),
                                         ("list-notoken", "without NextContinuationToken")])
def test_a_listing_that_never_ends_fails_naming_it(fault_server: Any, mode: str,
                                                   words: str) -> None:
    """An S3 listing whose server repeats its continuation token (or sends none while it
    says the listing goes on) looped for ever, its memory growing; now it fails after
    two pages, naming the bucket and prefix."""
    store = _open("s3", fault_server, mode)
    fault_server.reset()
    with pytest.raises(Exception, match=words) as info:
        store.list("train/")
    assert f"s3://{mode}/train/" in str(info.value)
    assert sum(v for k, v in fault_server.counts().items() if k.startswith("GET /")) <= 3
