"""Store URLs: one parser in the engine used by every layer, and credentials in URLs
never reaching logs, messages or reprs."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest

from dask_ddp import storage
from dask_ddp.data import ImageFolder, ImageList, Loader
from dask_ddp.data import transforms as T
from images import encode, photo
from storage_servers import free_port

SECRET = "hunter2-s3cr3t"


@pytest.mark.parametrize(
    ("url", "scheme", "location", "local"),
    [
        ("file:///data/x", "file", "/data/x", True),
        # RFC 8089's localhost: a path in C++ but "localhost/x" in Python before.
        ("file://localhost/data/x", "file", "/data/x", True),
        ("/abs/path", "file", "/abs/path", True),
        ("relative/dir", "file", "relative/dir", True),
        ("s3://bucket/prefix", "s3", "s3://bucket/prefix", False),
        ("http://host:8080/base", "http", "http://host:8080/base", False),
        ("https://host/base", "https", "https://host/base", False),
        ("memory://name/pre", "memory", "name/pre", False),
    ],
)
def test_parse_url(url: str, scheme: str, location: str, local: bool) -> None:
    assert storage.parse_url(url) == storage.StoreUrl(scheme, location, local)
    assert storage.is_local(url) is local


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("ftp://host/x", r"unsupported URL scheme 'ftp' in 'ftp://host/x' \(supported: file://"),
        ("GS://bucket/key", "unsupported URL scheme 'gs'"),
        ("", "empty store URL"),
    ],
)
def test_unknown_scheme_is_named(url: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        storage.parse_url(url)
    with pytest.raises(ValueError):
        storage.open(url)


def test_file_url_naming_a_host_is_refused() -> None:
    with pytest.raises(ValueError, match="file://server/share.*names a host"):
        storage.parse_url("file://server/share")


def test_localhost_file_url_and_relative_paths_agree_everywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store, the dataset's sample paths and manifest keys all read file://localhost/x
    as the path /x, and a relative root relative to the working directory."""
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.jpg").write_bytes(encode(photo(40, 30), "jpeg"))
    for root in (f"file://localhost{tmp_path}", f"file://{tmp_path}", str(tmp_path)):
        ds = ImageFolder(root)
        assert ds.samples == [(str(tmp_path / "c" / "a.jpg"), 0)], root
        assert ds.load(0).size == (40, 30)
        listed = ImageList(root, [str(tmp_path / "c" / "a.jpg")], [0])  # absolute key
        assert listed.samples == ds.samples
    monkeypatch.chdir(tmp_path)
    ds = ImageFolder("c/..")
    assert ds.samples[0][0].endswith("c/a.jpg") and ds.load(0).size == (40, 30)


def _no_secret(text: str) -> None:
    assert SECRET not in text, text


def test_credentials_in_urls_never_reach_logs_messages_or_reprs(
    http_server: tuple[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    base, root = http_server
    name = uuid.uuid4().hex
    (root / name / "c").mkdir(parents=True)
    (root / name / "c" / "a.jpg").write_bytes(encode(photo(40, 30), "jpeg"))
    (root / name / "_index.txt").write_text("c/a.jpg\n")
    (root / name / "train.csv").write_text("path,label\nc/a.jpg,0\n")
    secret_http = base.replace("http://", f"http://user:{SECRET}@") + f"/{name}"
    closed = f"http://user:{SECRET}@127.0.0.1:{free_port()}"
    messages: list[str] = []

    def fails(fn: object, *args: object, **kwargs: object) -> None:
        with pytest.raises(Exception) as info:  # noqa: PT011 - any error; its text matters
            fn(*args, **kwargs)  # type: ignore[operator]
        messages.append(str(info.value))

    # http(s): the store, its errors, datasets over it, a manifest, the Loader.
    store = storage.open(secret_http, max_attempts=1)
    messages += [store.url, repr(store)]
    fails(store.get, "missing.jpg")
    fails(storage.open(closed, max_attempts=1).get, "k")
    fails(list, storage.open(closed, max_attempts=1).get_many(["a", "b"]))
    ds = ImageFolder(secret_http)
    tf = T.Compose([T.Resize(8), T.CenterCrop(8), T.ToTensor()])
    loader = Loader(ds, batch_size=1, transform=tf)
    assert len(list(loader)) == 1
    messages += [repr(ds), repr(loader), *(p for p, _ in ds.samples)]
    listed = ImageList.from_csv(f"{secret_http}/train.csv")
    messages += [repr(listed)]
    fails(ImageList.from_csv, f"{secret_http}/missing.csv")
    fails(ImageList, secret_http, [f"http://u:{SECRET}@elsewhere/x.jpg"], [0])
    fails(ImageList, secret_http, ["a.jpg"], [-1])
    fails(ImageFolder, f"{secret_http}/c")  # no listing file there
    fails(storage.open, secret_http, no_such_option=1)
    # s3: credentials in the URL, in the endpoint, a bad endpoint; other schemes.
    fails(storage.open, f"s3://AKIAEXAMPLE:{SECRET}@bucket/p", anon=True)
    fails(storage.open, "s3://bucket", endpoint_url=f"ftp://u:{SECRET}@host", anon=True)
    s3 = storage.open("s3://bucket", endpoint_url=closed, anon=True, max_attempts=1)
    fails(s3.get, "k")
    fails(s3.list)
    fails(storage.open, f"ftp://u:{SECRET}@host/x")
    fails(storage.open, f"file://u:{SECRET}@host/x")
    fails(storage.parse_url, f"gs://u:{SECRET}@bucket/x")
    assert storage.redact_url(f"https://u:{SECRET}@h/x") == "https://h/x"

    assert len(messages) > 20
    for m in messages:
        _no_secret(m)
    assert "opening store" in caplog.text  # the debug log ran, and is clean
    _no_secret(caplog.text)
