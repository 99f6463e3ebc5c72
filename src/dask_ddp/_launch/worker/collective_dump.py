"""The flight recorder's dump of a rank that a collective's timeout ended (internal).

An NCCL rank whose collective times out is torn down by torch's watchdog
(``TORCH_NCCL_ASYNC_ERROR_HANDLING``) after it wrote the ring of its last collectives to
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` + its rank (``TORCH_NCCL_DUMP_ON_TIMEOUT``). The
launcher points that file into the rank's work directory (:func:`dump_environment`); when
the rank dies, the supervisor reads it back (:func:`dump_summary`) and the rank's error
lists the collectives each rank was in, the way NCCL's own tooling
(``torch.distributed.flight_recorder``) reads them.

The file is torch's pickle of plain dicts, lists, text and numbers. It is read with an
unpickler that admits no class or function at all, and bounded in size: the work directory
is the rank's own (0700), but the reader runs in the Dask worker and trusts nothing.
"""

from __future__ import annotations

import io
import os
import pickle
from typing import Any

#: The dump's file name in the rank's work directory, before the rank's number (torch
#: appends the rank).
DUMP_PREFIX = "collectives-rank-"
#: Where torch's watchdog writes the dump: a path in the job's own work directory, read when
#: a process group is made (never on import, so a warm template's key leaves it out).
DUMP_VARIABLE = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
#: Largest dump read (a 2000-entry ring with stack traces is a few MiB).
MAX_DUMP_BYTES = 16 << 20
#: Collectives listed in an error, newest last.
SHOWN = 8


def dump_environment(workdir: str, env: dict[str, str]) -> None:
    """Point the watchdog's dump into ``workdir`` unless the job or worker set it."""
    env.setdefault(DUMP_VARIABLE, os.path.join(workdir, DUMP_PREFIX))


class _PlainUnpickler(pickle.Unpickler):
    """Plain data only: any class or function in the stream is refused, never imported."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"the dump names {module}.{name}: only plain data is read")


def read_dump(path: str) -> dict[str, Any]:
    """The flight recorder's dump at ``path``.

    Raises
    ------
    OSError
        The file cannot be read.
    ValueError
        It is larger than :data:`MAX_DUMP_BYTES`, or not a dump of plain data.
    """
    with open(path, "rb") as f:
        data = f.read(MAX_DUMP_BYTES + 1)
    if len(data) > MAX_DUMP_BYTES:
        raise ValueError(f"{path}: over {MAX_DUMP_BYTES} bytes, not read")
    try:
        dump = _PlainUnpickler(io.BytesIO(data)).load()
    except Exception as e:  # noqa: BLE001 - any malformed stream is one ValueError
        raise ValueError(f"{path}: not a flight recorder dump ({e})") from None
    if not isinstance(dump, dict) or not isinstance(dump.get("entries", []), list):
        raise ValueError(f"{path}: not a flight recorder dump (no list of entries)")
    return dump


def _entry_line(entry: Any) -> str:
    if not isinstance(entry, dict):
        return "?"
    group = entry.get("process_group")
    group = group[0] if isinstance(group, (list, tuple)) and group else "?"
    # A retired entry completed (gloo leaves its state at "scheduled").
    state = "completed" if entry.get("retired") else str(entry.get("state", "?"))
    sizes = entry.get("input_sizes")
    shown = f" sizes {str(sizes)[:80]}" if sizes else ""
    return (f"{str(entry.get('profiling_name', '?'))[:60]} "
            f"#{entry.get('collective_seq_id', '?')} of process group {str(group)[:40]!r}: "
            f"{state[:20]}{shown}")


def dump_summary(workdir: str, rank: int) -> str:
    """The rank's last collectives from its dump in ``workdir``, as lines for its error;
    ``""`` when there is no dump (the rank did not die of a collective's timeout)."""
    path = os.path.join(workdir, f"{DUMP_PREFIX}{rank}")
    if not os.path.exists(path):
        return ""
    try:
        dump = read_dump(path)
    except (OSError, ValueError) as e:
        return f"\n\nthe flight recorder's dump of rank {rank} is unreadable: {e}"
    entries = [e for e in dump.get("entries", []) if isinstance(e, dict)]
    if not entries:
        return f"\n\nthe flight recorder's dump of rank {rank} holds no collective"
    last = entries[-SHOWN:]
    lines = "\n".join(f"  {_entry_line(e)}" for e in last)
    more = f" (of {len(entries)})" if len(entries) > len(last) else ""
    return (f"\n\nlast collectives of rank {rank} in the flight recorder's dump{more}, "
            f"newest last:\n{lines}")
