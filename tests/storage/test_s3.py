"""s3:// stores against moto's S3 server (a real HTTP server on 127.0.0.1)."""

from __future__ import annotations

import hashlib
import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import boto3
import pytest

from dask_ddp import storage
from storage_testutil import run_cpp_conformance

pytestmark = pytest.mark.s3


def test_lists_more_than_one_page(s3_bucket: str) -> None:
    store = storage.open(f"s3://{s3_bucket}/data")
    keys = [f"train/{i // 100:02d}/{i:05d}.jpg" for i in range(1100)]
    with ThreadPoolExecutor(8) as pool:  # puts release the GIL
        list(pool.map(lambda k: store.put(k, k.encode()), keys))
    store.put("val/0.jpg", b"v")
    listing = store.list("train/")
    assert [o.key for o in listing] == sorted(keys)  # > 1000: several ListObjectsV2 pages
    assert all(o.size == len(o.key) for o in listing)
    assert len(store.list()) == 1101
    assert [o.key for o in store.list("train/03/")] == keys[300:400]
    # The store root is a prefix: boto3 sees the full keys.
    s3 = boto3.client("s3")
    page = s3.list_objects_v2(Bucket=s3_bucket, Prefix="data/val/")
    assert [o["Key"] for o in page["Contents"]] == ["data/val/0.jpg"]


def test_get_range_stat_delete(s3_bucket: str) -> None:
    store = storage.open(f"s3://{s3_bucket}")
    data = os.urandom(100_000)
    store.put("dir/obj with spaces+plus.bin", data)
    assert store.get("dir/obj with spaces+plus.bin") == data
    assert store.get_range("dir/obj with spaces+plus.bin", 10, 20) == data[10:30]
    assert store.get_range("dir/obj with spaces+plus.bin", 99_990) == data[99_990:]
    assert store.get_range("dir/obj with spaces+plus.bin", 100_000) == b""
    with pytest.raises(ValueError, match="obj with spaces"):
        store.get_range("dir/obj with spaces+plus.bin", 100_001)
    assert store.stat("dir/obj with spaces+plus.bin").size == 100_000
    store.delete("dir/obj with spaces+plus.bin")
    assert not store.exists("dir/obj with spaces+plus.bin")
    store.delete("dir/obj with spaces+plus.bin")  # missing: fine, as in S3


def test_multipart_put_of_20_mb(s3_bucket: str) -> None:
    store = storage.open(f"s3://{s3_bucket}/ckpt")
    data = os.urandom(20 << 20)
    store.put("model.pt", memoryview(data))
    head = boto3.client("s3").head_object(Bucket=s3_bucket, Key="ckpt/model.pt")
    assert head["ContentLength"] == len(data)
    assert head["ETag"].strip('"').endswith("-3")  # 3 parts of 8 MiB: a multipart upload
    got = store.get("model.pt")
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()


def test_get_many_in_completion_order(s3_bucket: str) -> None:
    store = storage.open(f"s3://{s3_bucket}")
    want = {f"many/{i}": os.urandom(1000 + i) for i in range(200)}
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda kv: store.put(*kv), want.items()))
    assert dict(store.get_many(want, max_in_flight=16)) == want


def test_not_found_names_the_key_and_the_s3_code(s3_bucket: str) -> None:
    store = storage.open(f"s3://{s3_bucket}/p")
    with pytest.raises(
        FileNotFoundError, match=rf"s3://{s3_bucket}/p/nope\.jpg: HTTP 404 NoSuchKey"
    ):
        store.get("nope.jpg")
    with pytest.raises(FileNotFoundError, match=r"nope\.jpg: HTTP 404"):
        store.stat("nope.jpg")
    with pytest.raises(FileNotFoundError, match="NoSuchBucket"):
        storage.open(f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}").get("k")


def test_anonymous_access(s3_bucket: str) -> None:
    boto3.client("s3").put_object(Bucket=s3_bucket, Key="public.txt", Body=b"hi", ACL="public-read")
    storage.open(f"s3://{s3_bucket}").put("private.txt", b"no")
    anon = storage.open(f"s3://{s3_bucket}", anon=True)
    assert anon.get("public.txt") == b"hi"
    with pytest.raises(PermissionError, match=rf"s3://{s3_bucket}/private\.txt: HTTP 403"):
        anon.get("private.txt")


def test_missing_credentials_is_a_clear_error(
    s3_server: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("AWS_SHARED_CREDENTIALS_FILE", raising=False)
    monkeypatch.delenv("AWS_CONFIG_FILE", raising=False)
    # Instance metadata, the last resort, is tested in test_storage_s3_credentials.py.
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(PermissionError, match=r"no AWS credentials for s3://b/x.*anon=True"):
        storage.open("s3://b/x")
    monkeypatch.setenv("AWS_PROFILE", "missing")
    with pytest.raises(PermissionError, match="AWS_PROFILE='missing'"):
        storage.open("s3://b/x")


def test_bad_s3_urls(s3_server: str) -> None:
    with pytest.raises(ValueError, match="invalid bucket name"):
        storage.open("s3://")
    with pytest.raises(ValueError, match="must start with http"):
        storage.open("s3://b", endpoint_url="ftp://x")


def test_cpp_conformance_suite(s3_bucket: str, s3_server: str) -> None:
    run_cpp_conformance(
        "S3/*", {"DDP_TEST_S3_ENDPOINT": s3_server, "DDP_TEST_S3_BUCKET": s3_bucket}
    )


# ---- a server that checks signatures ----------------------------------------------------


@pytest.fixture
def auth_bucket(s3_auth_server: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str, str]:
    """A bucket on the signature-checking server, with its valid credentials in the env."""
    endpoint, key, secret = s3_auth_server.server.url, s3_auth_server.key, s3_auth_server.secret
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    bucket = f"auth-{uuid.uuid4().hex[:12]}"
    # Explicit keys: boto3's default session caches the first credentials it found.
    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
    )
    s3.create_bucket(Bucket=bucket)
    return bucket, key, secret


def test_signed_requests_are_accepted(auth_bucket: tuple[str, str, str]) -> None:
    bucket, _, _ = auth_bucket
    store = storage.open(f"s3://{bucket}/a prefix", multipart_threshold=5 << 20)
    store.put("k ey+1.bin", b"x" * 1000)
    store.put("big.bin", b"y" * (11 << 20))  # multipart: initiate, parts, complete
    assert store.get_range("k ey+1.bin", 5, 5) == b"x" * 5
    assert [o.key for o in store.list()] == ["big.bin", "k ey+1.bin"]
    assert store.stat("big.bin").size == 11 << 20
    store.delete("big.bin")


def test_wrong_secret_is_403_naming_the_key(
    auth_bucket: tuple[str, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket, _, secret = auth_bucket
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    store = storage.open(f"s3://{bucket}", max_attempts=3)
    with pytest.raises(
        PermissionError, match=rf"s3://{bucket}/secret\.txt: HTTP 403 SignatureDoesNotMatch"
    ) as info:
        store.get("secret.txt")
    assert "not-the-secret" not in str(info.value) and secret not in str(info.value)
    assert "after" not in str(info.value)  # a 4xx is never retried


def test_unknown_access_key_is_403(
    auth_bucket: tuple[str, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket, _, _ = auth_bucket
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWNKEY000000")
    with pytest.raises(PermissionError, match=r"k\.bin: HTTP 403 InvalidAccessKeyId"):
        storage.open(f"s3://{bucket}").put("k.bin", b"v")


def test_profile_from_the_shared_credentials_file(
    auth_bucket: tuple[str, str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bucket, key, secret = auth_bucket
    creds = tmp_path / "credentials"
    creds.write_text(
        f"[default]\naws_access_key_id = WRONG\naws_secret_access_key = WRONG\n\n"
        f"[training]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.setenv("AWS_PROFILE", "training")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ignored-when-a-profile-is-named")
    storage.open(f"s3://{bucket}").put("from-profile", b"ok")
    monkeypatch.delenv("AWS_PROFILE")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(PermissionError, match="InvalidAccessKeyId"):  # [default] is wrong
        storage.open(f"s3://{bucket}").get("from-profile")


def test_cpp_conformance_suite_with_signature_checks(auth_bucket: tuple[str, str, str]) -> None:
    bucket, _, _ = auth_bucket
    run_cpp_conformance(
        "S3/*",
        {"DDP_TEST_S3_ENDPOINT": os.environ["AWS_ENDPOINT_URL_S3"], "DDP_TEST_S3_BUCKET": bucket},
    )


def test_temporary_credentials_send_the_session_token(
    auth_bucket: tuple[str, str, str], s3_auth_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket, _, _ = auth_bucket
    key, secret, token = s3_auth_server.session
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_SESSION_TOKEN", token)
    store = storage.open(f"s3://{bucket}")
    store.put("temp.txt", b"t")
    assert store.get("temp.txt") == b"t"
    monkeypatch.setenv("AWS_SESSION_TOKEN", token[:-4] + "AAAA")
    with pytest.raises(PermissionError, match=r"temp\.txt: HTTP 400 InvalidToken") as info:
        storage.open(f"s3://{bucket}").get("temp.txt")
    assert token[:-4] not in str(info.value)  # the token never appears in messages
