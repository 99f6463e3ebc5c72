"""How a live group tells a lost peer from a failure of its own (internal).

A collective of a group whose member died fails on the survivors; they re-form the group
instead of failing the job. :func:`is_peer_error` says which errors are such a failure.
"""

from __future__ import annotations


class LiveRecoveryError(RuntimeError):
    """The group could not re-form (too few survivors, no agreement in time): the job
    falls back to a whole-group restart."""


class MemberLost(Exception):
    """Members of the generation being formed were recorded dead on the store."""

    def __init__(self, uids: list[int]) -> None:
        super().__init__(f"members {uids} were lost")
        self.uids = list(uids)


#: Words of a collective's error text that mean a peer went away or stopped answering,
#: where torch gives no type: gloo's transport ("Connection reset by peer", "Connection
#: closed by peer", a timeout), and an NCCL error of a torch that raised it untyped.
_PEER_WORDS = ("connection", "closed", "reset", "timed out", "timeout", "broken pipe",
               "peer", "gloo", "nccl")


def is_peer_error(exc: BaseException) -> bool:
    """Whether ``exc``, raised by a collective of the group, means a peer was lost.

    By type where torch gives one: ``DistBackendError`` (NCCL's errors, a communicator
    aborted or its watchdog's timeout) and ``DistNetworkError`` (a connection to a peer or
    the store broke). Gloo's transport errors reach Python as a plain ``RuntimeError``
    (torch 2.14: "[gloo/transport/tcp/pair.cc] Read error ...: Connection reset by peer"),
    so where torch gives no type the error's text is matched (:data:`_PEER_WORDS`).
    """
    typed = _dist_error_types()
    if typed and isinstance(exc, typed):
        return True
    text = str(exc).lower()
    return any(s in text for s in _PEER_WORDS)


def _dist_error_types() -> tuple[type[BaseException], ...]:
    """torch's typed errors of a lost peer (none when torch.distributed is absent)."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - a live group runs with torch
        return ()
    return tuple(t for t in (getattr(dist, "DistBackendError", None),
                             getattr(dist, "DistNetworkError", None)) if t is not None)
