"""dask-ddp: PyTorch DistributedDataParallel on Dask, fed by a C++ data engine.

The public API:

- launching: :func:`dask_ddp.dispatch.run` (seed-compatible), :func:`submit`, :class:`Job`,
  :func:`run_command`, :func:`rank_info`
- data: :mod:`dask_ddp.data` (``ImageList``, ``ImageFolder``, ``S3ImageFolder``, ``Loader``,
  ``transforms``)
- storage: :mod:`dask_ddp.storage` (object stores by URL)
- results: :mod:`dask_ddp.results` (``DaskResultsHandler``, ``report``, checkpoints)
"""

from __future__ import annotations

from . import dispatch
from ._env import RankInfo, rank_info
from ._errors import GangStartError, JobError, RankAbortedError, RankFailedError, WorkerLostError
from .dispatch import ElasticJob, Job, Restart, run_command, submit

__version__ = "0.1.0"

__all__ = [
    "ElasticJob",
    "GangStartError",
    "Job",
    "JobError",
    "RankAbortedError",
    "RankFailedError",
    "RankInfo",
    "Restart",
    "WorkerLostError",
    "__version__",
    "dispatch",
    "rank_info",
    "run_command",
    "submit",
]

# -- results, metrics and checkpoints (owned by the results issue) --------------------
from .checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from .results import report  # noqa: E402

__all__ += ["load_checkpoint", "report", "save_checkpoint"]

# -- fault tolerance: exact resume (owned by the elastic issue) -------------------------
from .elastic import Checkpointer, restore_training_state, training_state  # noqa: E402

__all__ += ["Checkpointer", "restore_training_state", "training_state"]
