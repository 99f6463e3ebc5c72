"""Shared pytest fixtures: real servers and clusters, started once per session."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

#: Fixtures that start something outside the test process, and the marker each implies. A
#: test using one (directly or through another fixture) gets the marker, so
#: ``make test-quick`` (``-m "not dask and not s3 and not server and not slow"``) never
#: starts a cluster or a server. Tests that start a LocalCluster in their body carry the
#: ``dask`` marker themselves; :func:`_unmarked_tests_start_no_cluster` holds them to it.
FIXTURE_MARKERS = {
    "client": "dask",
    "cluster": "dask",
    "s3_server": "s3",
    "s3_bucket": "s3",
    "s3_auth_server": "s3",
    "fault_server": "server",
    "http_server": "server",
}


#: The modules that take longest (``make test``'s durations on 2 cores), longest first.
#: They run first: ``make test`` hands whole modules to its processes in collection order
#: (pytest-xdist's ``--dist loadscope``), so the long ones start at once and the short ones
#: fill in beside them, instead of a long module starting last and running alone.
LONGEST_FIRST = (
    "examples/test_demo.py", "launch/test_chaos_live.py", "launch/test_chaos.py",
    "launch/test_elastic_job.py",
    "dashboard/test_dashboard_browser.py", "launch/test_frameworks.py",
    "examples/test_examples.py", "dashboard/test_dashboard.py", "launch/test_restarts.py",
    "launch/test_waits.py", "launch/test_stall.py", "checkpoint/test_dcp.py",
    "examples/test_example_fsdp2.py", "data/table/test_table_example.py",
    "examples/test_example_predict.py", "docs/test_docs_site.py", "docs/test_doc_code.py",
    "launch/test_live_job.py", "launch/test_live_regroup.py", "launch/test_live_join.py",
)


def _rank_of_module(item: pytest.Item) -> int:
    path = item.path.as_posix()
    for i, name in enumerate(LONGEST_FIRST):
        if path.endswith("tests/" + name):
            return i
    return len(LONGEST_FIRST)


def _cuda_missing() -> str | None:
    """Why tests marked ``gpu`` cannot run here, or None where CUDA is usable."""
    import torch

    if not torch.cuda.is_available():
        return f"needs a CUDA GPU (torch {torch.__version__}: torch.cuda.is_available() is False)"
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
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
    items.sort(key=_rank_of_module)  # stable: a module's tests keep their order


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


#: A LocalCluster (a SpecCluster) closes a worker's nanny for good when no worker of its
#: name is registered ``lost-worker-timeout`` (15 s) after one was removed: a worker killed
#: twice within 15 s (the chaos tests' rhythm) lost its nanny while it restarted the second,
#: and the test its cluster's worker. Read in the test's process, where the cluster lives.
CLUSTER_CONFIG = {"distributed.deploy.lost-worker-timeout": "1 hour"}


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
