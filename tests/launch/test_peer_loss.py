"""The launcher's one test of a lost peer (_launch/peer_loss.py): a supervisor asks it of
its rank's reported error, a live group of its collective's exception; both answer alike
(no cluster). The texts are torch 2.14's, from a gloo group of two processes."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from dask_ddp._launch.live.errors import LiveRecoveryError, MemberLost
from dask_ddp._launch.live.errors import is_peer_error as live_is_peer_error
from dask_ddp._launch.peer_loss import is_peer_error, says_peer_lost

pytestmark = [pytest.mark.timeout(30)]

#: What a survivor's collective raised when its peer's process was SIGKILLed, or stopped
#: answering; what a new group's setup raised when a peer never came; what a store client
#: raised when the store's process died.
PEER_LOST = [
    RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] "
                 "Connection closed by peer [127.0.0.1]:62097. This is typically caused by "
                 "a remote worker crashing."),
    RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
                 "unbound_buffer.cc:78] Timed out waiting 5000ms for recv operation to "
                 "complete"),
    RuntimeError("Connection reset by peer"),
    RuntimeError("NCCL communicator was aborted on rank 1."),
    dist.DistStoreError("wait timeout after 4000ms, keys: /0//1//cpu//0/1"),
    dist.DistNetworkError("Failed to recv, got 0 bytes. Connection was likely closed. Did "
                          "the remote server shutdown or crash?"),
    dist.DistBackendError("[Rank 0] Watchdog caught collective operation timeout"),
]

#: A rank's own faults, and a live group's that it cannot re-form from.
OWN = [
    ValueError("bad shape (3, 4)"),
    KeyError("weight"),
    RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    LiveRecoveryError("waited 60 s for generation 2's members to be ready"),
    MemberLost([1]),
]


@pytest.mark.parametrize("exc", PEER_LOST, ids=lambda e: type(e).__name__)
def test_a_lost_peer_is_told_alike_by_both(exc: BaseException) -> None:
    assert live_is_peer_error is is_peer_error  # one test, not two
    assert is_peer_error(exc)
    # As the supervisor reads it from its rank's report: the type's name and the text.
    assert says_peer_lost((type(exc).__name__,), str(exc))


@pytest.mark.parametrize("exc", OWN, ids=lambda e: type(e).__name__)
def test_a_rank_s_own_fault_is_not_a_lost_peer(exc: BaseException) -> None:
    assert not is_peer_error(exc)
    assert not says_peer_lost((type(exc).__name__,), str(exc))


def test_a_subclass_of_torch_s_errors_is_one_too() -> None:
    # The live side tests the class and its bases (as isinstance did); the report names
    # the class alone.
    class StoreGone(dist.DistStoreError):
        pass

    assert is_peer_error(StoreGone("key not found"))
    assert says_peer_lost(("DistStoreError",), "")
    assert not says_peer_lost(("StoreGone",), "key not found")


def test_stderr_text_alone() -> None:
    # A rank that died without a report: its last stderr lines.
    tail = "Traceback ...\nRuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc] " \
           "Read error [10.0.0.2]:40000: Connection reset by peer"
    assert says_peer_lost((), tail)
    assert not says_peer_lost((), "Traceback ...\nSystemExit: 2")
