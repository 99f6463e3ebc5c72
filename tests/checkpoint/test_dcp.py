"""Sharded checkpoints (DCP) through our stores: real gloo ranks, real FSDP2, moto S3, files.

- 2 FSDP2 ranks save (sync to files, async to moto S3) -> 1 rank (this process) and 2 ranks
  load the same model and optimizer state;
- a rank SIGKILLed mid-save leaves a partial step the lookup ignores, the previous one
  loads;
- transient errors are retried; a failing upload fails the save and writes no metadata;
- the writer's format is DCP's own (FileSystemReader reads it), reads are ranged GETs.
"""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

import dask_ddp
from dask_ddp import storage
from dask_ddp.checkpoint import (
    StorageReader,
    StorageWriter,
    latest_sharded_step,
    list_sharded_checkpoints,
    step_url,
)

pytestmark = [
    pytest.mark.timeout(600),  # two or three 2-rank launches; slow on a loaded machine
    # dcp.save/load without a process group (one process, on purpose) always warn.
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
]


def assert_same(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{where}: {set(a) ^ set(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    else:
        assert a == b, where


def load_here(url: str) -> dict[str, Any]:
    """Restore into a plain (unsharded) model in this process: a 1-rank job."""
    import dcp_util

    model = dcp_util.make_model(fsdp=False)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    ckpt = dask_ddp.Checkpointer(model, opt, storage=url, sharded=True)
    extra = ckpt.restore()
    return {**dcp_util.full_state(model, opt), "extra": extra, "step": ckpt.restored_step}


def check_round_trip(url: str, out: Path, async_save: bool, kill: bool) -> None:
    import dcp_util

    args = {"out": str(out), "storage": url, "async": async_save,
            "kill_at": 3 if kill else 0}
    saved = dcp_util.launch(2, "save", args)
    if kill:
        assert saved[1].returncode == -9, saved[1].stderr[-3000:]  # SIGKILLed mid-save
        assert saved[0].returncode != 0  # its peer's save failed (not hung)
        store = storage.open(url)
        step3 = [o.key for o in store.list("checkpoints/step-000000000003/")]
        assert any(k.endswith(".distcp") for k in step3), step3  # objects were written...
        assert not any(k.endswith(".metadata") for k in step3), step3  # ...not metadata
    else:
        assert [p.returncode for p in saved] == [0, 0], dcp_util.failed(saved)
    assert list_sharded_checkpoints(url) == [2]
    assert latest_sharded_step(url) == 2
    reference = torch.load(out / "saved-r0.pt", weights_only=True)
    assert_same(reference, torch.load(out / "saved-r1.pt", weights_only=True))
    assert len(reference["optim"]["state"]) == 6  # Adam state of every parameter

    one = load_here(url)
    assert one["step"] == 2 and one["extra"] == {"step": 2, "note": "two"}
    assert_same(reference["model"], one["model"], "1-rank model")
    assert_same(reference["optim"], one["optim"], "1-rank optim")

    loaded = dcp_util.launch(2, "load", {"out": str(out), "storage": url})
    assert [p.returncode for p in loaded] == [0, 0], dcp_util.failed(loaded)
    for rank in range(2):
        two = torch.load(out / f"loaded2-r{rank}.pt", weights_only=True)
        assert two["step"] == 2
        assert_same(reference["model"], two["model"], f"2-rank model r{rank}")
        assert_same(reference["optim"], two["optim"], f"2-rank optim r{rank}")


@pytest.mark.slow
def test_fsdp2_files_sync_and_kill_mid_save(tmp_path: Path) -> None:
    """Sync save to files; then rank 1 is killed saving step 3: step 2 still loads."""
    check_round_trip((tmp_path / "store").as_uri(), tmp_path, async_save=False, kill=True)


@pytest.mark.slow
@pytest.mark.s3
def test_fsdp2_s3_async(tmp_path: Path, s3_bucket: str) -> None:
    check_round_trip(f"s3://{s3_bucket}/run", tmp_path, async_save=True, kill=False)


def small_state(scale: float) -> dict[str, Any]:
    return {"w": torch.arange(3000.0) * scale, "b": {"x": torch.ones(50, 7) * scale},
            "n": int(scale), "s": f"state-{scale}"}


def test_format_is_dcp_and_save_again_replaces(tmp_path: Path) -> None:
    url = (tmp_path / "ck").as_uri()
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "notes.txt").write_text("not the writer's")  # never deleted
    dcp.save(small_state(1.0), storage_writer=StorageWriter(url, object_size=4096), no_dist=True)
    dcp.save(small_state(2.0), storage_writer=StorageWriter(url, object_size=1 << 20),
             no_dist=True)
    # One object now: the first save's three were cleared before the second wrote.
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == [
        ".metadata", "__0_0.distcp", "notes.txt"]
    for reader in (StorageReader(url), dcp.FileSystemReader(tmp_path / "ck")):
        target = small_state(0.0)
        dcp.load(target, storage_reader=reader, no_dist=True)
        assert_same(small_state(2.0), target)


def test_http_reader_fetches_only_its_ranges(tmp_path: Path, http_server: Any) -> None:
    base, root = http_server
    folder = root / "dcp-http"
    dcp.save(small_state(3.0), storage_writer=StorageWriter(folder.as_uri()), no_dist=True)
    target = {"w": torch.zeros(3000)}  # a part of the checkpoint
    reader = StorageReader(f"{base}/dcp-http")
    dcp.load(target, storage_reader=reader, no_dist=True,
             planner=dcp.DefaultLoadPlanner(allow_partial_load=True))
    assert torch.equal(target["w"], torch.arange(3000.0) * 3.0)


def test_ranges_are_merged_and_partial() -> None:
    from dask_ddp.checkpoint.dcp import _ranges

    class Item:
        def __init__(self, i: int) -> None:
            self.storage_index = i

    from torch.distributed.checkpoint.filesystem import _StorageInfo

    data = {0: _StorageInfo("a", 0, 10), 1: _StorageInfo("a", 10, 5),
            2: _StorageInfo("a", 5_000_000, 7), 3: _StorageInfo("b", 100, 3)}
    got = [(k, s, e, [r.storage_index for r in rs])
           for k, s, e, rs in _ranges([Item(2), Item(1), Item(0), Item(3)], data)]  # type: ignore[arg-type]
    assert got == [("a", 0, 15, [0, 1]), ("a", 5_000_000, 5_000_007, [2]), ("b", 100, 103, [3])]


def fault_counts(server: Any) -> dict[str, int]:
    with urllib.request.urlopen(f"{server.url}/_stats") as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def test_transient_errors_are_retried(fault_server: Any) -> None:
    # Every path answers 503 SlowDown twice; the store is told not to retry, so the
    # writer's own whole-object retries must carry the save.
    url = "s3://slowdown-2/ckpt"
    writer = StorageWriter(url, endpoint_url=fault_server.url, anon=True, max_attempts=1,
                           put_attempts=3)
    dcp.save(small_state(1.0), storage_writer=writer, no_dist=True)
    counts = fault_counts(fault_server)
    assert counts["PUT /slowdown-2/ckpt/__0_0.distcp"] == 3
    assert counts["PUT /slowdown-2/ckpt/.metadata"] >= 1


def test_failed_upload_fails_the_save_without_metadata(fault_server: Any) -> None:
    # Multipart uploads whose parts are refused: the save must fail, naming the URL and
    # the rank, and never write the metadata.
    url = "s3://mpu-fail/ckpt"
    writer = StorageWriter(url, endpoint_url=fault_server.url, anon=True,
                           multipart_threshold=1024)
    with pytest.raises(BaseException) as info:  # DCP raises CheckpointException
        dcp.save(small_state(1.0), storage_writer=writer, no_dist=True)
    msg = str(info.value)
    assert "s3://mpu-fail/ckpt/__0_0.distcp" in msg and "rank 0" in msg, msg
    puts = [k for k in fault_counts(fault_server) if k.startswith("PUT /mpu-fail/ckpt/")]
    assert puts and not any(".metadata" in k for k in puts), puts


def test_bad_urls_and_options() -> None:
    with pytest.raises(ValueError, match="unsupported URL 'http://x/y'"):
        StorageWriter("http://x/y")
    with pytest.raises(ValueError, match="thread_count"):
        StorageReader("s3://b/p", thread_count=0)
    with pytest.raises(ValueError, match=r"async_save=True\) needs sharded=True"):
        dask_ddp.Checkpointer(torch.nn.Linear(1, 1), async_save=True)
    assert StorageWriter.validate_checkpoint_id("s3://b/x")
    assert not StorageWriter.validate_checkpoint_id("https://b/x")
    assert StorageReader.validate_checkpoint_id("https://b/x")
    assert step_url("s3://b/run/", 7) == "s3://b/run/checkpoints/step-000000000007"


def test_no_checkpoint_restores_nothing(tmp_path: Path) -> None:
    url = (tmp_path / "empty").as_uri()
    assert latest_sharded_step(url) is None
    assert load_here(url)["step"] is None


def test_steps_retention_and_incomplete_steps(tmp_path: Path) -> None:
    from dask_ddp.checkpoint import load_sharded, save_sharded

    url = (tmp_path / "run").as_uri()
    root = tmp_path / "run" / "checkpoints"
    # A partial step (objects, no .metadata) as a killed save leaves it.
    (root / "step-000000000001").mkdir(parents=True)
    (root / "step-000000000001" / "__0_0.distcp").write_bytes(b"partial")
    for step in (2, 3, 4):
        assert save_sharded(small_state(float(step)), step, storage=url, keep=2).endswith(
            f"checkpoints/step-{step:012d}")
    # keep=2: steps 3 and 4 remain; step 2 and the partial step 1 are gone.
    # (The file store leaves the emptied folders behind.)
    assert sorted({p.parent.name for p in root.rglob("*") if p.is_file()}) == [
        "step-000000000003", "step-000000000004"]
    assert list_sharded_checkpoints(url) == [3, 4]
    target = small_state(0.0)
    assert load_sharded(target, storage=url) == 4
    assert_same(small_state(4.0), target)
    # Step 4 loses an object: it no longer counts, step 3 is the newest complete one.
    (root / "step-000000000004" / "__0_0.distcp").unlink()
    assert latest_sharded_step(url) == 3
    target = small_state(0.0)
    assert load_sharded(target, storage=url) == 3
    assert_same(small_state(3.0), target)


@pytest.mark.s3
def test_unavailable_metadata_raises_instead_of_resuming_older(
    s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 503 storm on the newest step's metadata is not "no checkpoint there": the lookup
    raises, naming the object, instead of settling for the older step (it used to)."""
    from dask_ddp.checkpoint import save_sharded
    from storage_servers import FlakyProxy

    url = f"s3://{s3_bucket}/run"
    for step in (1, 2):
        save_sharded(small_state(float(step)), step, storage=url)
    metadata = f"/{s3_bucket}/run/checkpoints/step-000000000002/.metadata"
    with FlakyProxy(os.environ["AWS_ENDPOINT_URL_S3"],
                    lambda method, path: method == "GET" and path == metadata) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.url)
        with pytest.raises(ConnectionError, match="step-000000000002/.metadata"):
            latest_sharded_step(url)
        assert proxy.failed > 0


class _RunsCode:
    """A pickle that runs ``touch MARKER`` when loaded: what a file put into a bucket can be."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_metadata_that_names_code_is_refused_not_run(tmp_path: Path) -> None:
    """A ``.metadata`` holding any global beyond DCP's metadata classes is never unpickled:
    the newest-step lookup skips it (an older good step wins) and the reader refuses it,
    naming the object and the global; the code it names never runs."""
    import pickle

    from dask_ddp.checkpoint import save_sharded

    url = (tmp_path / "run").as_uri()
    save_sharded(small_state(1.0), 1, storage=url)
    step2 = tmp_path / "run" / "checkpoints" / "step-000000000002"
    step2.mkdir(parents=True)
    marker = tmp_path / "ran"
    (step2 / ".metadata").write_bytes(pickle.dumps(_RunsCode(marker)))
    assert latest_sharded_step(url) == 1
    with pytest.raises(pickle.UnpicklingError, match=r"step-000000000002/\.metadata.*system"):
        StorageReader(step_url(url, 2)).read_metadata()
    assert not marker.exists(), "the checkpoint's metadata ran code in this process"
    # A real checkpoint's metadata still reads (dtypes, sizes, storage records).
    assert len(StorageReader(step_url(url, 1)).read_metadata().state_dict_metadata) > 0
