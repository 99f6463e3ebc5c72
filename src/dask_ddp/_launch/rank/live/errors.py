"""How a live group tells a lost peer from a failure of its own (internal).

A collective of a group whose member died fails on the survivors; they re-form the group
instead of failing the job. :func:`is_peer_error` says which errors are such a failure:
the launcher's one test of a lost peer (:mod:`dask_ddp._launch.wire.peer_loss`), which a rank
asks too, of the error it ends with (its report's verdict: a rank whose collective broke
waits for its peer's fault). Its torch error types and gloo's transport error's shape are
held there, not here.
"""

from __future__ import annotations

from dask_ddp._launch.wire.peer_loss import LiveRecoveryError, is_peer_error

__all__ = ["LiveRecoveryError", "MemberLost", "is_peer_error"]


class MemberLost(Exception):
    """Members of the generation being formed were recorded dead on the store."""

    def __init__(self, uids: list[int]) -> None:
        super().__init__(f"members {uids} were lost")
        self.uids = list(uids)
