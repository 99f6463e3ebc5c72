"""dask-ddp: PyTorch DistributedDataParallel on Dask, fed by a C++ data engine.

The public API:

- launching: :func:`dask_ddp.dispatch.run` (seed-compatible), :func:`submit`, :class:`Job`,
  :class:`ElasticJob`, :func:`run_command`, :func:`rank_info`
- data: :mod:`dask_ddp.data` (``ImageList``, ``ImageFolder``, ``S3ImageFolder``,
  ``TarShards``, ``Loader``, ``transforms``)
- storage: :mod:`dask_ddp.storage` (object stores by URL)
- results: :mod:`dask_ddp.results` (``DaskResultsHandler``, ``report``)
- inference: :func:`dask_ddp.predict` (a model over a Dask DataFrame, Array or image
  dataset, lazily), :class:`Evaluate` (checkpoints scored while a job trains)
- checkpoints: :mod:`dask_ddp.checkpoint` (``save_checkpoint``, ``load_checkpoint``,
  ``Checkpointer`` for exact resume, sharded checkpoints through DCP)
- errors: :mod:`dask_ddp.errors`

Every name is imported on first use (PEP 562): a rank process that calls ``report()``
imports the results channel's writer, not the launcher (distributed, tornado,
cloudpickle), and ``import dask_ddp`` alone costs milliseconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dask_ddp._lazy import attribute_loader, public_dir

if TYPE_CHECKING:
    from dask_ddp import (
        checkpoint,
        data,
        dispatch,
        errors,
        predict,
        recovery,
        results,
        storage,
    )
    from dask_ddp._identity import RankInfo, rank_info
    from dask_ddp.checkpoint import (
        Checkpointer,
        load_checkpoint,
        restore_training_state,
        save_checkpoint,
        training_state,
    )
    from dask_ddp.dispatch import ElasticJob, Job, Restart, run_command, submit
    from dask_ddp.errors import (
        GangStartError,
        JobError,
        RankAbortedError,
        RankFailedError,
        StallError,
        WorkerLostError,
    )
    from dask_ddp.predict import Evaluate
    from dask_ddp.results import report

__version__ = "0.1.0"

_WHERE = {
    **{m: f"dask_ddp.{m}" for m in ("checkpoint", "data", "dispatch", "errors", "recovery",
                                    "results", "storage")},
    **{n: f"dask_ddp._identity:{n}" for n in ("RankInfo", "rank_info")},
    **{n: f"dask_ddp.dispatch:{n}"
       for n in ("ElasticJob", "Job", "Restart", "run_command", "submit")},
    **{n: f"dask_ddp.errors:{n}"
       for n in ("GangStartError", "JobError", "RankAbortedError", "RankFailedError",
                 "StallError", "WorkerLostError")},
    **{n: f"dask_ddp.checkpoint:{n}"
       for n in ("Checkpointer", "load_checkpoint", "restore_training_state",
                 "save_checkpoint", "training_state")},
    "report": "dask_ddp.results:report",
    # A package callable as its function: dask_ddp.predict(model, data, ...).
    "predict": "dask_ddp.predict",
    "Evaluate": "dask_ddp.predict.evaluate:Evaluate",
}

__all__ = [
    "Checkpointer", "ElasticJob", "Evaluate", "GangStartError", "Job", "JobError",
    "RankAbortedError", "RankFailedError", "RankInfo", "Restart", "StallError",
    "WorkerLostError", "__version__", "checkpoint", "data", "dispatch", "errors",
    "load_checkpoint", "predict", "rank_info", "recovery", "report",
    "restore_training_state", "results", "run_command", "save_checkpoint", "storage", "submit",
    "training_state",
]
__getattr__ = attribute_loader(__name__, _WHERE)
__dir__ = public_dir(__name__)
