"""The typed records of live recovery that cross a process (internal).

Each is frozen, and both sides import it: a :class:`Generation` (written by the group's
members on the store, read by the client), an :class:`Admission` (written by the members
that admit a joining rank, read by that rank), and :class:`LiveLeft` (what the supervisor
of a rank that left returns to the client), and a :class:`LiveStart` (written by a rank's
supervisor into its work directory, read by the rank). What comes from the store is checked as it
is read: the store is shared with the job's ranks.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

#: A live rank's :class:`LiveStart` in its work directory.
LIVE_FILE = "live.json"


def _object(text: str | bytes, what: str) -> dict[str, Any]:
    raw = json.loads(text)
    if not isinstance(raw, dict):
        raise ValueError(f"{what} must be a JSON object, got {text!r:.80}")
    return raw


@dataclasses.dataclass(frozen=True)
class Generation:
    """One membership change of a live job.

    Attributes
    ----------
    generation : int
        1 for the first change; the group of the job's start is generation 0 (the group's
        ranks see it as ``rank_info().generation``).
    time : float
        When the change was decided (Unix time).
    cause : str
    lost, joined : tuple of int
        The members (original ranks) that left or came.
    world_size : int
        The new group's size.
    step : int
        The committed step the new group continued from.
    recovery_s : float
        From the first survivor noticing the loss to the state agreed on rank 0.
    """

    generation: int
    time: float
    cause: str
    lost: tuple[int, ...]
    joined: tuple[int, ...]
    world_size: int
    step: int
    recovery_s: float

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> Generation:
        """Checked: the store is shared with the job's ranks."""
        raw = _object(text, "a generation record")
        return cls(generation=int(raw["generation"]), time=float(raw["time"]),
                   cause=str(raw["cause"])[:500], lost=tuple(int(x) for x in raw["lost"]),
                   joined=tuple(int(x) for x in raw["joined"]),
                   world_size=int(raw["world_size"]), step=int(raw["step"]),
                   recovery_s=float(raw["recovery_s"]))


@dataclasses.dataclass(frozen=True)
class Admission:
    """A joining rank's admission: the generation it was taken into, and the group's
    count of membership changes with it (its ``rank_info().generation``)."""

    generation: int
    changes: int

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> Admission:
        """Checked: the store is shared with the job's ranks."""
        raw = _object(text, "an admission record")
        return cls(generation=int(raw["generation"]), changes=int(raw["changes"]))


@dataclasses.dataclass(frozen=True)
class LiveLeft:
    """What the supervisor of a rank that left a live job returns (not the function's
    value: the job's result leaves it out)."""

    rank: int
    reason: str


@dataclasses.dataclass(frozen=True)
class LiveStart:
    """How a rank of a job whose policy regroups starts its live group: the part of the
    job's options it needs (``min_workers``, ``max_workers``), the job's store, and
    whether it joins a running group. Its supervisor writes it into the rank's work
    directory; a rank without one starts a plain process group."""

    store: str
    min_size: int = 1
    max_size: int | None = None
    join: bool = False

    def write(self, workdir: str) -> None:
        with open(os.path.join(workdir, LIVE_FILE), "w") as f:
            json.dump(dataclasses.asdict(self), f)

    @classmethod
    def read(cls, workdir: str) -> LiveStart | None:
        """The rank's record in ``workdir``, or ``None`` when it has none; checked (a
        record that is not one raises :class:`ValueError` naming the file)."""
        path = os.path.join(workdir, LIVE_FILE)
        try:
            with open(path) as f:
                text = f.read()
        except FileNotFoundError:
            return None
        try:
            raw = _object(text, "a live start record")
            cap = raw["max_size"]
            return cls(store=str(raw["store"]), min_size=int(raw["min_size"]),
                       max_size=None if cap is None else int(cap), join=bool(raw["join"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path} is not a live start record: {exc}") from exc
