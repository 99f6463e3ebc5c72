"""Whether a rank's error came from a lost peer: the launcher's one test (internal).

A collective whose peer died, froze or stopped answering fails on the ranks still in it.
The rank that raised decides, at its exception handler, with the exception in hand
(:func:`is_peer_error`):

- a rank process (:mod:`dask_ddp._launch.rank.main`) writes its verdict into its report
  (:attr:`~dask_ddp._launch.wire.rank_report.RankReport.peer_lost`); its supervisor
  (:mod:`dask_ddp._launch.worker.outcome`) reads the verdict, and such a rank, likely the victim
  of a peer's fault, waits a moment to learn that fault and raises it instead
  (:mod:`dask_ddp._launch.wire.root_cause`);
- a live group's member (:mod:`dask_ddp._launch.rank.live.errors`) asks it of an exception a
  collective of its group raised: the survivors re-form instead of failing the job.

By type: torch's ``torch.distributed`` errors (:data:`PEER_ERROR_TYPES`, a class of
torch's or a subclass of one), anywhere along the exception's chain (its ``__cause__``,
else its ``__context__``, as a traceback prints it). Gloo's transport errors reach Python
as a plain ``RuntimeError`` (torch 2.14: "[.../gloo/transport/tcp/pair.cc:561] Connection
closed by peer [127.0.0.1]:62097", "[.../gloo/transport/tcp/unbound_buffer.cc:78] Timed
out waiting 5000ms for recv operation to complete"), in every case: a synchronous
collective (its innermost frame is ``distributed_c10d.py``), DDP's ``backward()`` (the
autograd engine's frame) and ``work.wait()`` called by the user's own code (the user's
frame: torch's C++ raised it, which leaves no frame). So frames cannot tell such an error
from the user's, and that one shape is told by its text instead, narrowly: exactly a
``RuntimeError`` whose text starts with the position in gloo's transport sources that
gloo's errors start with, or with torch's words for gloo's failure to connect a group
(:data:`GLOO_TRANSPORT`). A user's ``RuntimeError("... timed
out")`` or one naming NCCL is a rank's own fault.

A rank that died before it could write its report (killed, or NCCL's watchdog ended it)
or ran a command (which writes none) leaves only text: torch's error file or its last
stderr lines, which its supervisor tests with :func:`text_says_peer_lost`, in phrases a
transport writes. A leaf module (it imports neither torch nor the rest of the launcher):
the rank and the live group's rank process import it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

#: torch.distributed's typed errors of a collective, a connection or the store that broke
#: (``DistBackendError``: NCCL's errors, a communicator aborted or its watchdog's timeout;
#: ``DistNetworkError``: a connection to a peer or the store; ``DistStoreError``: a wait
#: on the store that timed out, a new group's peer that never came; ``DistError``: their
#: base), matched as torch's own classes (their module is torch's).
PEER_ERROR_TYPES = ("DistError", "DistBackendError", "DistNetworkError", "DistStoreError")

#: The start of a gloo transport error's text: the bracketed position in gloo's transport
#: sources (``[<build path>/gloo/transport/<tcp, uv, ibverbs>/<file>:<line>]``), or torch's
#: words for gloo's failure to connect a (new or reconfigured) group's peers, whatever
#: gloo said ("Gloo connectFullMesh failed with ...", torch's ProcessGroupGloo).
GLOO_TRANSPORT = re.compile(r"\[[^\]\n]*/gloo/transport/[^\]\n]*\]|Gloo connectFullMesh failed ")

#: Phrases of a dead rank's text (its error file, its last stderr lines) that say a peer
#: went away or stopped answering: gloo's and NCCL's names (gloo's errors name its source
#: file), and what a transport says of a lost connection or a timeout. Only for a rank
#: that left no report.
PEER_ERROR_PHRASES = ("gloo", "nccl", "connection reset", "connection closed", "closed by peer",
                      "broken pipe", "socket timeout", "connection refused", "timed out")



class LiveRecoveryError(RuntimeError):
    """The live group could not re-form (too few survivors, no agreement in time): the
    job falls back to a whole-group restart. Defined here, with the other verdicts on a
    rank's end, so that a rank's report (a leaf) can tell it without importing the live
    group; :mod:`dask_ddp._launch.rank.live.errors` is where the group raises it from."""


def chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling, as a traceback
    prints them: ``__cause__``, else ``__context__`` unless suppressed (``from None``)."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        yield link
        link = link.__cause__ if link.__cause__ is not None else (
            None if link.__suppress_context__ else link.__context__)


def is_torch_peer_type(cls: type) -> bool:
    """Whether ``cls`` is one of torch's errors of :data:`PEER_ERROR_TYPES` or a subclass."""
    return any(t.__name__ in PEER_ERROR_TYPES and t.__module__.split(".")[0] == "torch"
               for t in cls.__mro__)


def is_gloo_transport_error(exc: BaseException) -> bool:
    """Whether ``exc`` is gloo's transport error as torch raises it: exactly a
    ``RuntimeError`` whose text starts as :data:`GLOO_TRANSPORT` says."""
    return type(exc) is RuntimeError and GLOO_TRANSPORT.match(str(exc)) is not None


def is_peer_error(exc: BaseException) -> bool:
    """Whether ``exc`` (raised in a rank: its function's error, a collective's, the
    store's) says a peer was lost: one of torch's typed errors, or gloo's transport
    error, anywhere along its chain (see the module)."""
    return any(is_torch_peer_type(type(link)) or is_gloo_transport_error(link)
               for link in chain(exc))


def text_says_peer_lost(text: str) -> bool:
    """Whether ``text`` (what a rank that left no report left: torch's error file, its
    last stderr lines) says a peer was lost, by :data:`PEER_ERROR_PHRASES`."""
    low = text.lower()
    return any(phrase in low for phrase in PEER_ERROR_PHRASES)
