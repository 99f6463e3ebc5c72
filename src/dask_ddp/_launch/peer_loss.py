"""Whether a rank's error came from a lost peer: the launcher's one test (internal).

A collective whose peer died, froze or stopped answering fails on the ranks still in it.
Two places ask whether an error is such a failure, with one answer:

- a rank's supervisor (:mod:`dask_ddp._launch.outcome`), of the error its rank reported
  (its type's name and text), of torch's error file or of its last stderr lines: such a
  rank is likely the victim of a peer's fault, so it waits a moment to learn that fault
  and raises it instead (:mod:`dask_ddp._launch.root_cause`);
- a live group's member (:mod:`dask_ddp._launch.live.errors`), of an exception a
  collective of its group raised: the survivors re-form instead of failing the job.

By type where torch gives one: its ``torch.distributed`` errors (:data:`PEER_ERROR_TYPES`,
matched by name, so a type read from a rank's report tests as the exception does). Gloo's
transport errors reach Python as a plain ``RuntimeError`` (torch 2.14: "[.../gloo/
transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:62097", "[.../gloo/
transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms for recv operation to
complete"), and a torch that raises NCCL's errors untyped names NCCL in them: where torch
gives no type the error's text is matched (:data:`PEER_ERROR_PHRASES`), in phrases a
transport writes (not words such as "closed" or "peer" alone: a supervisor tests any
error text its rank reported, a user's own included). A leaf module (it imports neither
torch nor the rest of the launcher): the live group's rank process imports it through
:mod:`dask_ddp._launch.live.errors`.
"""

from __future__ import annotations

from collections.abc import Iterable

#: torch.distributed's typed errors of a collective, a connection or the store that broke
#: (``DistBackendError``: NCCL's errors, a communicator aborted or its watchdog's timeout;
#: ``DistNetworkError``: a connection to a peer or the store; ``DistStoreError``: a wait
#: on the store that timed out, a new group's peer that never came; ``DistError``: their
#: base).
PEER_ERROR_TYPES = ("DistError", "DistBackendError", "DistNetworkError", "DistStoreError")

#: Phrases of an error's text that say a peer went away or stopped answering, where torch
#: gives no type: gloo's and NCCL's names (gloo's errors name its source file), and what a
#: transport says of a lost connection or a timeout.
PEER_ERROR_PHRASES = ("gloo", "nccl", "connection reset", "connection closed", "closed by peer",
                      "broken pipe", "socket timeout", "connection refused", "timed out")


def says_peer_lost(type_names: Iterable[str], text: str) -> bool:
    """Whether an error of type ``type_names`` (its class's name, or the names along its
    class's MRO) with the text ``text`` says a peer was lost (see the module)."""
    if any(name in PEER_ERROR_TYPES for name in type_names):
        return True
    low = text.lower()
    return any(phrase in low for phrase in PEER_ERROR_PHRASES)


def is_peer_error(exc: BaseException) -> bool:
    """Whether ``exc`` (raised by a collective, or the store) says a peer was lost: by its
    class or a base of it, or by its text (see the module)."""
    return says_peer_lost((t.__name__ for t in type(exc).__mro__), str(exc))
