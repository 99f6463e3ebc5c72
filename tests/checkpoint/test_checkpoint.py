"""Checkpoints to real storage (file://, moto S3), including writers killed mid-write."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dask_ddp import checkpoint
from dask_ddp.checkpoint import load_checkpoint, save_checkpoint, wait_checkpoints

pytestmark = pytest.mark.timeout(300)


def state(step: int, n: int = 1000) -> dict[str, torch.Tensor]:
    return {"w": torch.full((n,), float(step)), "step": torch.tensor(step)}


def check_consistent(obj: dict[str, torch.Tensor]) -> int:
    step = int(obj["step"])
    assert torch.equal(obj["w"], torch.full_like(obj["w"], float(step)))
    return step


@pytest.fixture
def file_url(tmp_path: Path) -> str:
    return (tmp_path / "store").as_uri()


def test_save_then_load_latest_keeps_last_k(file_url: str, tmp_path: Path) -> None:
    assert load_checkpoint(file_url) is None
    for step in range(5):
        fut = save_checkpoint(state(step), step, storage=file_url, keep=2)
        assert fut is not None
    wait_checkpoints()
    assert check_consistent(load_checkpoint(file_url)) == 4
    assert checkpoint.list_checkpoints(file_url) == [3, 4]
    assert check_consistent(load_checkpoint(file_url, step=3)) == 3
    files = sorted(p.name for p in (tmp_path / "store" / "checkpoints").iterdir())
    assert files == [
        "step-000000000003.json",
        "step-000000000003.pt",
        "step-000000000004.json",
        "step-000000000004.pt",
    ]


def test_job_storage_default_and_other_ranks(
    file_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DASK_DDP_STORAGE", file_url)
    monkeypatch.setenv("RANK", "1")
    assert save_checkpoint(state(1), 1) is None  # rank 0 saves by default
    monkeypatch.setenv("RANK", "0")
    fut = save_checkpoint(state(7), 7)
    assert fut is not None and fut.result(60).endswith("step-000000000007.pt")
    assert check_consistent(load_checkpoint()) == 7
    monkeypatch.delenv("DASK_DDP_STORAGE")
    with pytest.raises(ValueError, match="no checkpoint storage"):
        load_checkpoint()


class Custom:
    def __init__(self) -> None:
        self.x = 3


def test_weights_only_unless_told(file_url: str) -> None:
    save_checkpoint({"obj": Custom()}, 1, storage=file_url).result(60)  # type: ignore[union-attr]
    import pickle

    with pytest.raises(pickle.UnpicklingError):
        load_checkpoint(file_url)
    assert load_checkpoint(file_url, weights_only=False)["obj"].x == 3


def test_corrupt_newest_falls_back(file_url: str, tmp_path: Path) -> None:
    for step in (1, 2):
        save_checkpoint(state(step), step, storage=file_url).result(60)  # type: ignore[union-attr]
    data = tmp_path / "store" / "checkpoints" / "step-000000000002.pt"
    data.write_bytes(data.read_bytes()[:-10])  # truncated behind the manifest's back
    assert check_consistent(load_checkpoint(file_url)) == 1


@pytest.mark.s3
def test_unavailable_newest_raises_instead_of_resuming_older(
    s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 503 storm on the newest checkpoint is not "no checkpoint": the restore raises,
    naming the object, rather than silently resuming from an older step (it used to)."""
    from dask_ddp.checkpoint import Checkpointer
    from storage_servers import FlakyProxy

    url = f"s3://{s3_bucket}/run"
    for step in (1, 2):
        save_checkpoint(state(step), step, storage=url).result(60)  # type: ignore[union-attr]
    newest = f"/{s3_bucket}/run/checkpoints/step-000000000002.pt"
    with FlakyProxy(os.environ["AWS_ENDPOINT_URL_S3"],
                    lambda method, path: method == "GET" and path == newest) as proxy, \
            monkeypatch.context() as m:
        m.setenv("AWS_ENDPOINT_URL_S3", proxy.url)
        with pytest.raises(ConnectionError, match="step-000000000002.pt"):
            load_checkpoint(url)
        assert proxy.failed >= checkpoint.READ_ATTEMPTS  # each whole try: the store's retries
        with pytest.raises(ConnectionError, match="step-000000000002.pt"):
            Checkpointer(torch.nn.Linear(2, 2), storage=url).restore()
    # A missing newest object (pruned meanwhile) still falls back to the older step.
    from dask_ddp import storage

    storage.open(url).delete("checkpoints/step-000000000002.pt")
    assert check_consistent(load_checkpoint(url)) == 1


@pytest.mark.s3
def test_transient_errors_on_restore_are_retried(
    s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from storage_servers import FlakyProxy

    url = f"s3://{s3_bucket}/run"
    for step in (1, 2):
        save_checkpoint(state(step), step, storage=url).result(60)  # type: ignore[union-attr]
    newest = f"/{s3_bucket}/run/checkpoints/step-000000000002.pt"
    fails = iter([True, True])  # two 503s, then the object

    def fail(method: str, path: str) -> bool:
        return method == "GET" and path == newest and next(fails, False)

    with FlakyProxy(os.environ["AWS_ENDPOINT_URL_S3"], fail) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.url)
        assert check_consistent(load_checkpoint(url)) == 2
        assert proxy.failed == 2


WRITER = """
import sys, torch
from dask_ddp.checkpoint import save_checkpoint
url, start = sys.argv[1], int(sys.argv[2])
step = start
while True:
    save_checkpoint({"w": torch.full((1_000_000,), float(step)), "step": torch.tensor(step)},
                    step, storage=url, keep=2)
    step += 1
"""


def kill_writers_mid_write(url: str, rounds: int = 3) -> None:
    """Start a writer, load concurrently, SIGKILL it at varying times; repeat."""
    start = 0
    for i in range(rounds):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, url, str(start)])
        try:
            # Its first checkpoint (the process needs a moment to import torch) ...
            deadline = time.monotonic() + 120
            while not any(s >= start for s in checkpoint.list_checkpoints(url)):
                assert time.monotonic() < deadline and proc.poll() is None
                assert i == 0 or load_checkpoint(url) is not None
                time.sleep(0.02)
            # ... then loads while it writes more, until it is killed at a varying point.
            deadline = time.monotonic() + 0.5 + 0.37 * i
            loaded = []
            while time.monotonic() < deadline:
                obj = load_checkpoint(url)
                assert obj is not None, "a checkpoint was visible and then vanished"
                loaded.append(check_consistent(obj))
                time.sleep(0.01)
            assert loaded == sorted(loaded)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        obj = load_checkpoint(url)
        assert obj is not None, f"round {i}: nothing loadable after the writer was killed"
        start = check_consistent(obj) + 1


def test_latest_loadable_while_writer_killed_file(file_url: str) -> None:
    kill_writers_mid_write(file_url)


@pytest.mark.s3
def test_latest_loadable_while_writer_killed_s3(s3_bucket: str) -> None:
    url = f"s3://{s3_bucket}/run1"
    save_checkpoint(state(0), 0, storage=url).result(60)  # type: ignore[union-attr]
    assert check_consistent(load_checkpoint(url)) == 0
    kill_writers_mid_write(url, rounds=2)


def test_training_thread_not_blocked_by_upload(file_url: str) -> None:
    obj = {"w": torch.randn(8_000_000)}  # 32 MB
    t0 = time.perf_counter()
    fut = save_checkpoint(obj, 1, storage=file_url)
    returned = time.perf_counter() - t0
    assert fut is not None
    fut.result(60)
    assert os.path.exists(fut.result().removeprefix("file://"))
    assert returned < 30  # not a speed test: see benchmarks/bench_results.py
