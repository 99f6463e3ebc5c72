"""A storage URL's password never reaches a log line or an error of the checkpoints.

Worker logs are shown on Dask's dashboard: a ``user:password@`` in a checkpoint URL must be
taken out wherever the checkpoint code names its URL. The checkpoints are written into a
real folder served by a real HTTP server and read back over ``http://user:password@...``
(the HTTP store sends the credentials; the server ignores them).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import torch

import dask_ddp
from dask_ddp.checkpoint import (
    StorageReader,
    latest_sharded_step,
    load_checkpoint,
    load_sharded,
    save_checkpoint,
    save_sharded,
    wait_checkpoints,
)

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
]

PASSWORD = "Sup3rSecretPw"


def test_no_password_in_logs_or_errors(http_server: tuple[str, Path], tmp_path: Path,
                                       caplog: pytest.LogCaptureFixture) -> None:
    base, root = http_server
    folder = root / f"redact-{tmp_path.name}"
    local = folder.as_uri()
    remote = base.replace("http://", f"http://reader:{PASSWORD}@") + f"/{folder.name}"
    caplog.set_level(logging.DEBUG)
    errors: list[str] = []

    # Saved locally (HTTP is read-only), loaded over the password URL: full and sharded.
    save_checkpoint({"w": torch.ones(4)}, step=1, storage=local)
    save_checkpoint({"w": torch.ones(4) * 2}, step=2, storage=local)
    wait_checkpoints()
    save_sharded({"w": torch.arange(8.0)}, 3, storage=local)
    model = torch.nn.Linear(2, 2)
    dask_ddp.Checkpointer(model, storage=f"{local}/trainer", sharded=True).save(5, note="x")
    _write_index(folder)
    _write_index(folder / "trainer")
    assert torch.equal(load_checkpoint(storage=remote)["w"], torch.ones(4) * 2)
    target = {"w": torch.zeros(8)}
    assert load_sharded(target, storage=remote) == 3
    assert latest_sharded_step(remote) == 3
    restored = dask_ddp.Checkpointer(torch.nn.Linear(2, 2), storage=f"{remote}/trainer",
                                     sharded=True).restore()
    assert restored.get("note") == "x", restored

    # Failing loads: a corrupt newest full checkpoint (a warning names its URL), a sharded
    # step whose metadata is garbage, a missing checkpoint folder.
    newest = sorted(p for p in folder.glob("checkpoints/*2*") if "json" not in p.name)
    assert newest, sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))
    for p in newest if newest[0].is_file() else newest[0].iterdir():
        if "json" not in p.name and "manifest" not in p.name:
            p.write_bytes(b"not a checkpoint")
    assert torch.equal(load_checkpoint(storage=remote)["w"], torch.ones(4))
    metadata = next(folder.rglob("step-000000000003/.metadata"))
    metadata.write_bytes(b"garbage")
    assert latest_sharded_step(remote) is None
    for fail in (lambda: StorageReader(remote + "/nowhere").read_metadata(),
                 lambda: StorageReader(remote + "/checkpoints/step-000000000003").read_metadata(),
                 lambda: load_sharded({"w": torch.zeros(8)}, storage=remote + "/missing")):
        with pytest.raises(Exception) as info:
            fail()
        errors.append(_chain(info.value))
    shutil.rmtree(folder)

    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "reader" in logged or errors, "nothing named the URL: the test checks nothing"
    assert any("step" in e or "nowhere" in e or "missing" in e for e in errors), errors
    for text, what in ((logged, "a log line"), *((e, "an error") for e in errors)):
        assert PASSWORD not in text, f"{what} shows the password:\n{text[:2000]}"


def _chain(exc: BaseException | None) -> str:
    """The messages of an exception and its causes and contexts."""
    parts: list[str] = []
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        parts.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    return "\n".join(parts)


def _write_index(folder: Path) -> None:
    """The HTTP store's listing file: one key and its size per line."""
    lines = [f"{p.relative_to(folder).as_posix()}\t{p.stat().st_size}"
             for p in sorted(folder.rglob("*")) if p.is_file()]
    (folder / "_index.txt").write_text("\n".join(lines) + "\n")
