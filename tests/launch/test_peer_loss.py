"""The launcher's one test of a lost peer (_launch/wire/peer_loss.py), as the rank decides it
with the exception in hand (its report's verdict, a live group's collective): by torch's
error types along the exception's chain, gloo's transport error by its exact shape, never
a user's own words (no cluster). The gloo texts are torch 2.14's, from a gloo group of two
processes whose peer was SIGKILLed or stopped answering; the store's error is a real one."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from dask_ddp._launch.rank.live.errors import LiveRecoveryError, MemberLost
from dask_ddp._launch.rank.live.errors import is_peer_error as live_is_peer_error
from dask_ddp._launch.wire.peer_loss import chain, is_peer_error, text_says_peer_lost
from launch_util import store_timeout

pytestmark = [pytest.mark.timeout(30)]

CLOSED = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] "
          "Connection closed by peer [127.0.0.1]:62097. This is typically caused by a "
          "remote worker crashing.")
GLOO_TIMEOUT = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer."
                "cc:78] Timed out waiting 5000ms for recv operation to complete")



#: What a survivor's collective raised when its peer's process was SIGKILLed, or stopped
#: answering; what a new group's setup raised when a peer never came; what a store client
#: raised when the store's process died.
PEER_LOST = [
    RuntimeError(CLOSED),
    RuntimeError(GLOO_TIMEOUT),
    # A new or reconfigured group whose peer went away while it connected (torch's words).
    RuntimeError("Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/"
                 "pair.cc:144] no error"),
    RuntimeError("Gloo connectFullMesh failed with Connection reset by peer"),
    dist.DistNetworkError("Failed to recv, got 0 bytes. Connection was likely closed. Did "
                          "the remote server shutdown or crash?"),
    dist.DistBackendError("[Rank 0] Watchdog caught collective operation timeout"),
    dist.DistBackendError("NCCL communicator was aborted on rank 1."),
    dist.DistError("a peer left"),
]

#: A rank's own faults (among them a user's words that the text matching took for a lost
#: peer), and a live group's that it cannot re-form from.
OWN = [
    ValueError("bad shape (3, 4)"),
    KeyError("weight"),
    RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("fetching shard 3 from the bucket timed out"),
    RuntimeError("NCCL is not available on this build: use backend='gloo'"),
    TimeoutError("the evaluation server timed out"),
    RuntimeError("Connection reset by peer"),  # the user's own HTTP client
    RuntimeError("gloo: the user's own message naming gloo"),
    LiveRecoveryError("waited 60 s for generation 2's members to be ready"),
    MemberLost([1]),
]


@pytest.mark.parametrize("exc", PEER_LOST, ids=lambda e: f"{type(e).__name__}-{str(e)[-20:]}")
def test_a_lost_peer_is_told_by_type_or_gloo_s_shape(exc: BaseException) -> None:
    assert live_is_peer_error is is_peer_error  # one test, not two
    assert is_peer_error(exc)


def test_a_real_store_timeout_is_a_lost_peer() -> None:
    assert is_peer_error(store_timeout())


@pytest.mark.parametrize("exc", OWN, ids=lambda e: f"{type(e).__name__}-{str(e)[:20]}")
def test_a_rank_s_own_fault_is_not_a_lost_peer(exc: BaseException) -> None:
    assert not is_peer_error(exc)


def test_a_subclass_of_torch_s_errors_is_one_but_not_a_namesake() -> None:
    class StoreGone(dist.DistStoreError):
        pass

    class DistBackendError(RuntimeError):  # the user's own class of that name
        pass

    assert is_peer_error(StoreGone("key not found"))
    assert not is_peer_error(DistBackendError("mine"))


def test_gloo_s_shape_is_a_plain_runtime_error_that_starts_so() -> None:
    class Mine(RuntimeError):
        pass

    assert not is_peer_error(Mine(CLOSED))  # not torch's plain RuntimeError
    assert not is_peer_error(RuntimeError(f"retrying after: {CLOSED}"))  # quoted, not raised
    assert not is_peer_error(RuntimeError("[data/gloo/loader.py:3] timed out"))
    assert not is_peer_error(RuntimeError("my Gloo connectFullMesh failed "))


def raise_in(handler: type[BaseException], cause: BaseException, *,
             explicit: bool = False, suppress: bool = False) -> BaseException:
    """A user's ValueError raised while handling ``cause`` (``explicit``: ``from cause``;
    ``suppress``: ``from None``)."""
    try:
        try:
            raise cause
        except handler as exc:
            if suppress:
                raise ValueError("the step failed") from None
            if explicit:
                raise ValueError("the step failed") from exc
            raise ValueError("the step failed")  # noqa: B904 (the implicit context is the case)
    except ValueError as outer:
        return outer
    raise AssertionError("unreachable")


def test_the_chain_is_walked_as_a_traceback_prints_it() -> None:
    broke = dist.DistBackendError("[Rank 1] NCCL error")
    assert is_peer_error(raise_in(dist.DistError, broke, explicit=True))
    assert is_peer_error(raise_in(RuntimeError, RuntimeError(CLOSED)))
    # The user hid the collective's error (``from None``): their own error stands.
    assert not is_peer_error(raise_in(dist.DistError, broke, suppress=True))
    assert not is_peer_error(raise_in(RuntimeError, RuntimeError("shard timed out")))


def test_a_chain_with_a_cycle_ends() -> None:
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__context__, b.__context__ = b, a
    assert [str(e) for e in chain(a)] == ["a", "b"]
    assert not is_peer_error(a)


def test_a_dead_rank_s_text_alone() -> None:
    # A rank that died without a report: its last stderr lines, matched as text.
    tail = ("Traceback ...\nRuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:"
            "589] Read error [10.0.0.2]:40000: Connection reset by peer")
    assert text_says_peer_lost(tail)
    assert text_says_peer_lost("[Rank 0] Watchdog caught collective operation timeout: "
                               "WorkNCCL(SeqNum=7, OpType=ALLREDUCE)")
    assert not text_says_peer_lost("Traceback ...\nSystemExit: 2")
