"""Shared pytest fixtures: real servers and clusters, started once per session."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from scheduling import (  # noqa: F401 - pytest hooks and fixtures, found here by name
    lease,
    order_tests,
    pytest_configure,
    pytest_runtest_logreport,
    pytest_runtest_makereport,
    pytest_runtest_setup,
    pytest_sessionfinish,
    pytest_terminal_summary,
    pytest_testnodedown,
    session_cluster,
)

#: Fixtures that start something outside the test process, and the marker each implies. A
#: test using one (directly or through another fixture) gets the marker, so
#: ``make test-quick`` (``-m "not dask and not s3 and not server and not slow"``) never
#: starts a cluster or a server. Tests that start a LocalCluster in their body carry the
#: ``dask`` marker themselves; :func:`_unmarked_tests_start_no_cluster` holds them to it.
FIXTURE_MARKERS = {
    "client": "dask",
    "cluster": "dask",
    "lease": "dask",
    "s3_server": "s3",
    "s3_bucket": "s3",
    "s3_auth_server": "s3",
    "fault_server": "server",
    "http_server": "server",
}


def _cuda_missing() -> str | None:
    """Why tests marked ``gpu`` cannot run here, or None where CUDA is usable."""
    import torch

    if not torch.cuda.is_available():
        return f"needs a CUDA GPU (torch {torch.__version__}: torch.cuda.is_available() is False)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_tests = []
    for item in items:
        for name in getattr(item, "fixturenames", ()):
            marker = FIXTURE_MARKERS.get(name)
            if marker is not None and item.get_closest_marker(marker) is None:
                item.add_marker(marker)
        if item.get_closest_marker("gpu") is not None:
            gpu_tests.append(item)
    # Tests marked gpu run where CUDA is (make gpu-check on a GPU machine) and are skipped
    # elsewhere, naming why; torch is asked only when such a test was collected.
    reason = _cuda_missing() if gpu_tests else None
    if reason is not None:
        for item in gpu_tests:
            item.add_marker(pytest.mark.skip(reason=reason))
    order_tests(config, items)


@pytest.fixture(autouse=True)
def _unmarked_tests_start_no_cluster(request: pytest.FixtureRequest,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A test without the ``dask`` marker that starts a LocalCluster fails, naming the fix."""
    if request.node.get_closest_marker("dask") is not None:
        return
    from distributed.deploy.spec import SpecCluster

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(
            f"{request.node.nodeid} starts a Dask cluster but is not marked 'dask': add "
            "pytest.mark.dask (make test-quick must start no cluster)")

    monkeypatch.setattr(SpecCluster, "__init__", refuse)


from waits import FAST_LAUNCH_WAITS  # noqa: E402 - kept with the fixture that uses it

#: The launcher's waits in tests: the fast profile of tests/waits.py (a timing test states
#: its waits as multiples of it). Read in the client when a job is built and carried to
#: the workers and ranks in the job's options.
SHORT_LAUNCH_WAITS = FAST_LAUNCH_WAITS


# The clusters' own configuration (lost-worker-timeout), set for a test's own clusters here
# and for the whole test process (the session cluster outlives a test): tests/cluster_lease.py.
from cluster_lease import CLUSTER_CONFIG  # noqa: E402


@pytest.fixture(autouse=True)
def _short_launch_waits() -> Iterator[None]:
    import dask

    with dask.config.set({**SHORT_LAUNCH_WAITS, **CLUSTER_CONFIG}):
        yield


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """Wait until something accepts connections on 127.0.0.1:port, or fail."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listened on 127.0.0.1:{port} within {timeout}s")


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """A real moto S3 server (``moto_server``) on 127.0.0.1 and a free port.

    Yields the endpoint URL. The AWS environment variables the stores read are set for
    the session, so code under test finds the server through the AWS conventions.
    """
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, proc)
        endpoint = f"http://127.0.0.1:{port}"
        saved = {k: os.environ.get(k) for k in _AWS_VARS}
        os.environ.update(
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_REGION="us-east-1",
            AWS_DEFAULT_REGION="us-east-1",
            AWS_ENDPOINT_URL_S3=endpoint,
        )
        os.environ.pop("AWS_SESSION_TOKEN", None)
        os.environ.pop("AWS_PROFILE", None)
        try:
            yield endpoint
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


_AWS_VARS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ENDPOINT_URL",
    "AWS_PROFILE",
)


@pytest.fixture
def s3_bucket(s3_server: str) -> str:
    """A new, empty bucket on the moto server; yields its name."""
    import uuid

    import boto3

    name = f"test-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket=name)
    return name


# ---- storage servers (tests/storage_servers.py) -----------------------------------------

from pathlib import Path  # noqa: E402 - kept with the fixtures that use it
from typing import Any  # noqa: E402


@pytest.fixture(scope="session")
def fault_server() -> Iterator[Any]:
    """The fault-injecting HTTP/S3 look-alike of tests/storage_servers.py."""
    from storage_servers import start_fault_server

    with start_fault_server() as server:
        yield server


@pytest.fixture(scope="session")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """Python's http.server on a fresh directory; yields (base URL, directory)."""
    from storage_servers import start_http_server

    root = tmp_path_factory.mktemp("http-root")
    with start_http_server(root) as server:
        yield server.url, root


@pytest.fixture(scope="session")
def s3_auth_server() -> Iterator[Any]:
    """moto's S3 server checking SigV4 signatures: a storage_servers.AuthServer."""
    from storage_servers import start_moto_auth_server

    auth = start_moto_auth_server()
    with auth.server:
        yield auth
