"""s3:// credentials from where workloads run: web identity (EKS), containers, EC2.

Real parts only: moto's server answers STS AssumeRoleWithWebIdentity and serves S3; the
container and instance-metadata endpoints are a real HTTP server on 127.0.0.1
(:class:`storage_servers.CredentialServer`) handing out keys that moto's
signature-checking server accepts, so a request signed with anything else fails.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import boto3
import pytest

from dask_ddp import storage
from storage_servers import CredentialServer, ServerProcess, free_port, object_bytes

pytestmark = pytest.mark.s3

_CREDENTIAL_VARS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_ROLE_SESSION_NAME",
    "AWS_ENDPOINT_URL_STS",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    "AWS_EC2_METADATA_DISABLED",
    "AWS_EC2_METADATA_SERVICE_ENDPOINT",
    "AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE",
)

# A web identity token as Kubernetes mounts it (a JWT; moto accepts any).
_JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6bWw6dHJhaW5lciJ9.c2ln"
_ROLE_ARN = "arn:aws:iam::123456789012:role/trainer"


@pytest.fixture
def no_fixed_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No keys in the environment and no shared files: only the temporary sources."""
    for var in _CREDENTIAL_VARS:
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return tmp_path


# ---- web identity: STS AssumeRoleWithWebIdentity on moto -------------------------------


class RecordingMoto:
    """moto's server (STS and S3) recording every request it gets, headers included."""

    def __init__(self, folder: Path) -> None:
        self.recording = folder / "moto-recording.jsonl"
        port = free_port()
        env = {
            **os.environ,
            "MOTO_ENABLE_RECORDING": "True",
            "MOTO_RECORDER_FILEPATH": str(self.recording),
        }
        self.server = ServerProcess(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            port,
            env=env,
            cwd=str(folder),
        )
        self.url = self.server.url

    def requests(self) -> list[dict[str, Any]]:
        """The recorded requests, oldest first."""
        if not self.recording.exists():
            return []
        return [json.loads(line) for line in self.recording.read_text().splitlines() if line]


@pytest.fixture(scope="module")
def recording_moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RecordingMoto]:
    moto = RecordingMoto(tmp_path_factory.mktemp("moto-rec"))
    with moto.server:
        yield moto


def _body(request: dict[str, Any]) -> str:
    body = request.get("body") or ""
    return base64.b64decode(body).decode() if request.get("body_encoded") else str(body)


def _header(request: dict[str, Any], name: str) -> str | None:
    for k, v in request["headers"].items():
        if k.lower() == name.lower():
            return str(v)
    return None


def test_web_identity_assumes_the_role_through_sts_and_signs_with_its_keys(
    recording_moto: RecordingMoto,
    no_fixed_credentials: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    token_file = no_fixed_credentials / "token"
    token_file.write_text(_JWT + "\n")
    monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token_file))
    monkeypatch.setenv("AWS_ROLE_ARN", _ROLE_ARN)
    monkeypatch.setenv("AWS_ROLE_SESSION_NAME", "epoch-runner")
    # One endpoint for every service (STS and S3), as with LocalStack or moto.
    monkeypatch.setenv("AWS_ENDPOINT_URL", recording_moto.url)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    bucket = f"wi-{uuid.uuid4().hex[:12]}"
    boto3.client(
        "s3",
        endpoint_url=recording_moto.url,
        region_name="us-east-1",
        aws_access_key_id="setup",
        aws_secret_access_key="setup",
    ).create_bucket(Bucket=bucket)

    store = storage.open(f"s3://{bucket}/runs")
    store.put("epoch-1/metrics.json", b'{"loss": 0.5}')
    assert store.get("epoch-1/metrics.json") == b'{"loss": 0.5}'
    assert [o.key for o in store.list()] == ["epoch-1/metrics.json"]

    recorded = recording_moto.requests()
    sts = [i for i, r in enumerate(recorded) if "AssumeRoleWithWebIdentity" in _body(r)]
    assert len(sts) == 1  # fetched once, cached for the store's requests
    form = parse_qs(_body(recorded[sts[0]]))
    assert form["RoleArn"] == [_ROLE_ARN]
    assert form["RoleSessionName"] == ["epoch-runner"]
    assert form["WebIdentityToken"] == [_JWT]  # the file's content, newline trimmed
    assert _header(recorded[sts[0]], "Authorization") is None  # the call is unsigned
    # Every S3 request after it is signed with the keys STS returned, with their token.
    s3 = [r for r in recorded[sts[0] + 1 :] if f"/{bucket}" in r["url"]]
    assert len(s3) == 3  # put, get, list
    auth = [_header(r, "Authorization") or "" for r in s3]
    creds = {a.split("Credential=")[1].split("/")[0] for a in auth}
    tokens = {_header(r, "X-Amz-Security-Token") for r in s3}
    assert len(creds) == 1 and len(tokens) == 1
    (key_id,) = creds
    assert key_id.startswith("ASIA")  # STS temporary keys, not anything from the env
    (token,) = tokens
    assert token and len(token) > 100


def test_web_identity_errors_name_the_source_never_the_token(
    fault_server: Any,
    s3_server: str,
    no_fixed_credentials: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    missing = no_fixed_credentials / "no-such-token"
    monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(missing))
    with pytest.raises(ValueError, match="AWS_ROLE_ARN is not"):
        storage.open("s3://b")
    monkeypatch.setenv("AWS_ROLE_ARN", _ROLE_ARN)
    with pytest.raises(PermissionError, match=rf"web identity token file {missing}: cannot read"):
        storage.open("s3://b")
    token_file = no_fixed_credentials / "token"
    token_file.write_text(_JWT)
    monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token_file))
    # An STS that refuses: the fault server's 403 AccessDenied.
    sts = f"{fault_server.url}/status-403"
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", sts)
    with pytest.raises(PermissionError) as info:
        storage.open("s3://b", initial_backoff=0.01)
    message = str(info.value)
    assert f"STS AssumeRoleWithWebIdentity at {sts} for role {_ROLE_ARN}: HTTP 403" in message
    assert "AccessDenied" in message and "s3://b" in message
    assert _JWT not in message and _JWT[:20] not in message
    assert fault_server.counts()["POST /status-403/"] >= 1
    # An STS that is down is retried, then a connection error naming it.
    dead = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", dead)
    with pytest.raises(
        ConnectionError, match=rf"STS AssumeRoleWithWebIdentity at {dead}.*3 attempts"
    ):
        storage.open("s3://b")


# ---- container credentials and EC2 instance metadata -----------------------------------


@pytest.fixture
def auth_env(
    s3_auth_server: Any, no_fixed_credentials: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, Any]:
    """A bucket on moto's signature-checking server; no credentials in the environment.

    Returns (bucket, an IAM client signed with the server's allow-all user).
    """
    endpoint = s3_auth_server.server.url
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    signed = {
        "endpoint_url": endpoint,
        "region_name": "us-east-1",
        "aws_access_key_id": s3_auth_server.key,
        "aws_secret_access_key": s3_auth_server.secret,
    }
    bucket = f"cred-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", **signed).create_bucket(Bucket=bucket)
    return bucket, boto3.client("iam", **signed)


def _new_user(iam: Any) -> str:
    """An IAM user allowed everything, with no keys yet; returns its name."""
    user = f"rotating-{uuid.uuid4().hex[:8]}"
    iam.create_user(UserName=user)
    policy = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
    }
    iam.put_user_policy(UserName=user, PolicyName="all", PolicyDocument=json.dumps(policy))
    return user


def _new_key(iam: Any, user: str) -> tuple[str, str, None]:
    k = iam.create_access_key(UserName=user)["AccessKey"]
    return str(k["AccessKeyId"]), str(k["SecretAccessKey"]), None


def test_container_credentials_with_a_token_file_are_rotated_before_expiry(
    auth_env: tuple[str, Any], no_fixed_credentials: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket, iam = auth_env
    user = _new_user(iam)
    first = _new_key(iam, user)
    # EKS Pod Identity style: a full URI and an authorization token file.
    token_file = no_fixed_credentials / "eks-pod-identity-token"
    token_file.write_text("pod-identity-token-1\n")
    lifetime = 8.0  # refreshed halfway through: after about 4 s
    with CredentialServer(first, lifetime=lifetime, auth_token="pod-identity-token-1") as agent:
        monkeypatch.setenv(
            "AWS_CONTAINER_CREDENTIALS_FULL_URI", f"{agent.url}/container/credentials"
        )
        monkeypatch.setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", str(token_file))
        opened = time.monotonic()
        store = storage.open(f"s3://{bucket}")
        store.put("w.bin", b"weights")
        assert store.get("w.bin") == b"weights"
        assert agent.count("GET /container/credentials") == 1  # cached between requests

        # The platform rotates: new keys at the agent, the old ones revoked, and the
        # agent's token rotated in its file (read again at every fetch).
        agent.keys = _new_key(iam, user)
        token_file.write_text("pod-identity-token-2\n")
        agent.auth_token = "pod-identity-token-2"
        iam.delete_access_key(UserName=user, AccessKeyId=first[0])
        if time.monotonic() - opened < lifetime / 2 - 1:
            # Before the refresh is due the store still signs with the revoked keys.
            with pytest.raises(PermissionError, match="InvalidAccessKeyId"):
                store.get("w.bin")
            assert agent.count("GET /container/credentials") == 1
        time.sleep(max(0.0, opened + lifetime / 2 + 0.5 - time.monotonic()))
        assert store.get("w.bin") == b"weights"  # refreshed: signed with the new keys
        assert agent.count("GET /container/credentials") == 2
        assert dict(store.get_many(["w.bin"] * 3)) == {"w.bin": b"weights"}
        assert agent.count("GET /container/credentials") == 2


def test_container_credentials_errors_name_the_endpoint_never_the_token(
    s3_server: str, no_fixed_credentials: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with CredentialServer(("AK", "SK", None), auth_token="right-token") as agent:
        url = f"{agent.url}/container/credentials"
        monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", url)
        monkeypatch.setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN", "wrong-token-value")
        with pytest.raises(PermissionError) as info:
            storage.open("s3://b")
        assert f"container credentials at {url}: HTTP 401 Unauthorized" in str(info.value)
        assert "wrong-token-value" not in str(info.value)
        assert "right-token" not in str(info.value)
    monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", "http://169.254.1.1/creds")
    with pytest.raises(ValueError, match="plain http is only allowed"):
        storage.open("s3://b")


def test_instance_metadata_v2_credentials_are_refreshed_before_expiry(
    auth_env: tuple[str, Any], s3_auth_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket, _ = auth_env
    # The role's temporary keys (with a session token) that the server accepts.
    lifetime = 6.0  # refreshed halfway through: after about 3 s
    with CredentialServer(s3_auth_server.session, lifetime=lifetime, role="ml-node") as imds:
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.url)
        opened = time.monotonic()
        store = storage.open(f"s3://{bucket}/ec2")
        store.put("a", b"1")
        assert [o.key for o in store.list()] == ["a"]
        creds = "GET /latest/meta-data/iam/security-credentials/ml-node"
        if time.monotonic() - opened < lifetime / 2 - 1:  # else a loaded machine was slow
            assert imds.count("PUT /latest/api/token") == 1
            assert imds.count("GET /latest/meta-data/iam/security-credentials/") == 1
            assert imds.count(creds) == 1
        time.sleep(max(0.0, opened + lifetime / 2 + 0.5 - time.monotonic()))
        assert store.get("a") == b"1"
        assert imds.count(creds) == 2
        assert imds.count("PUT /latest/api/token") == 2  # a new session token each time

        # IMDSv2 only: without the session token the endpoint answers 401.
        import urllib.error
        import urllib.request

        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"{imds.url}/latest/meta-data/iam/security-credentials/")
        assert info.value.code == 401
        info.value.close()


def test_instance_metadata_is_the_last_resort_and_can_be_disabled(
    s3_server: str, no_fixed_credentials: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", dead)
    start = time.monotonic()
    with pytest.raises(PermissionError) as info:
        storage.open("s3://b/x")
    assert time.monotonic() - start < 5
    message = str(info.value)
    assert "no AWS credentials for s3://b/x" in message
    assert "AWS_WEB_IDENTITY_TOKEN_FILE" in message and "anon=True" in message
    assert f"EC2 instance metadata at {dead}" in message
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(PermissionError) as info:
        storage.open("s3://b/x")
    assert "EC2 instance metadata at" not in str(info.value)
    assert storage.open("s3://b/x", anon=True).url == "s3://b/x"


def test_expired_token_answer_fetches_fresh_keys_and_retries(
    fault_server: Any, no_fixed_credentials: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with CredentialServer(("ASIAKEY", "secret", "session-token")) as agent:
        monkeypatch.setenv(
            "AWS_CONTAINER_CREDENTIALS_FULL_URI", f"{agent.url}/container/credentials"
        )
        # The fault server ignores signatures: only the ExpiredToken answer matters here.
        store = storage.open("s3://expired-1", endpoint_url=fault_server.url, initial_backoff=0.01)
        key = f"{uuid.uuid4().hex}.bin"
        assert store.get(key) == object_bytes(f"/expired-1/{key}")
        assert fault_server.counts()[f"GET /expired-1/{key}"] == 2
        assert agent.count("GET /container/credentials") == 2  # dropped and fetched again


def test_agent_gone_keeps_valid_keys_then_fails_naming_it_once_expired(
    s3_bucket: str, no_fixed_credentials: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lifetime = 10.0  # refresh due after 5 s, expired after 10 s: wide windows under load
    agent = CredentialServer(("ASIAKEY", "secret", "session-token"), lifetime=lifetime)
    url = f"{agent.url}/container/credentials"
    monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", url)
    try:
        opened = time.monotonic()
        store = storage.open(f"s3://{s3_bucket}", initial_backoff=0.01)
        store.put("k", b"v")
    finally:
        agent.close()
    # Refresh due but the agent is gone: the keys still valid go on signing.
    time.sleep(max(0.0, opened + lifetime / 2 + 0.5 - time.monotonic()))
    assert store.get("k") == b"v"
    # Expired and no agent: each request fails naming the credential source.
    time.sleep(max(0.0, opened + lifetime + 0.5 - time.monotonic()))
    with pytest.raises(
        ConnectionError, match=rf"s3://{s3_bucket}/k: container credentials at {url}"
    ):
        store.get("k")
    with pytest.raises(ConnectionError, match="container credentials at"):
        dict(store.get_many(["k", "k2"]))
