"""Evaluation while training: each checkpoint a job saves, scored on the cluster as it trains.

Give a :class:`~dask_ddp.Checkpointer` an ``evaluate=Evaluate(...)``. When rank 0 saves a
checkpoint (every ``every``-th), a thread of rank 0 waits for it to be complete in
storage, then scores it on the Dask cluster (:func:`dask_ddp.predict` of the model with the
checkpoint's weights over the evaluation data, then ``score``), while training goes on:
the tasks run wherever Dask has free threads (``workers=``/``resources=`` place them),
and rank 0 only waits. The scores are reported as the job's metrics ``eval/<name>`` with
the checkpoint's step, so they appear in ``metrics.jsonl``, ``Job.metrics()``, the
progress bar and the job page beside the training metrics of that step. (Ray Train's
``ValidationConfig`` does the same for its checkpoints.)

The evaluation's model runs on the CPU unless ``device=`` says otherwise: the tasks may land
on a worker whose GPU a training rank is using, and a model there would be a second CUDA
context on that GPU, taking memory the training may need. ``device="cuda"`` uses a GPU of
the worker running the task (as :func:`dask_ddp.predict` picks one), meant with
``workers=``/``resources=`` that keep the tasks on workers whose GPUs the training does not
use; ``device=None`` is :func:`dask_ddp.predict`'s own default.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Evaluate"]

logger = logging.getLogger(__name__)


class Evaluate:
    """Score the checkpoints a :class:`~dask_ddp.Checkpointer` saves, on the cluster.

    Parameters
    ----------
    model
        What builds the model (as for :func:`dask_ddp.predict`: a function of no
        arguments, or an ``nn.Module`` whose weights the checkpoint replaces). Or, with
        ``data=None``, a function ``fn(storage, step) -> dict`` that scores the checkpoint
        itself (it runs in rank 0's evaluation thread; ``distributed.get_client()`` gives
        it the cluster).
    data
        The evaluation data, any input of :func:`dask_ddp.predict` (a Dask DataFrame or
        Array, an image dataset).
    score
        ``score(outputs, data) -> {name: value}``: the outputs are ``predict``'s lazy
        result; values may be numbers or lazy Dask scalars (computed together on the
        cluster), e.g. ``{"mse": ((out["out"] - data["y"]) ** 2).mean()}``.
    every
        Score every ``every``-th checkpoint saved (1: each).
    workers, resources
        Where the evaluation's tasks may run (Dask's ``client.compute`` options), e.g.
        the workers not training.
    device
        Where the evaluation's model runs (:func:`dask_ddp.predict`'s ``device=``).
        Default ``"cpu"``: never a second CUDA context on a GPU the training uses. Give
        ``"cuda"`` (a GPU of the worker running the task) together with ``workers=`` or
        ``resources=`` that keep the tasks off the training's GPUs, or ``"cuda:N"`` for a
        GPU index the training does not use.
    **predict_options
        Passed to :func:`dask_ddp.predict` (``batch_size``, ``columns``...).

    Notes
    -----
    Evaluations run one at a time, in the order of their steps; call
    :meth:`Checkpointer.wait` (or :meth:`wait`) before the training function returns so
    the last ones are reported. A failing evaluation is logged and reported as
    ``eval/error`` = 1 at its step; :meth:`wait` raises its error.

    Examples
    --------
    >>> ev = dask_ddp.Evaluate(make_model, val_ddf, columns=features,
    ...                        score=lambda out, df: {"mse": ((out["out"] - df["y"]) ** 2).mean()})
    >>> ckpt = dask_ddp.Checkpointer(model, opt, evaluate=ev)  # doctest: +SKIP
    """

    def __init__(self, model: Any, data: Any = None, *,
                 score: Callable[[Any, Any], Mapping[str, Any]] | None = None, every: int = 1,
                 workers: Any = None, resources: Mapping[str, float] | None = None,
                 device: str | None = "cpu", **predict_options: Any) -> None:
        if every < 1:
            raise ValueError(f"Evaluate: every must be >= 1, got {every}")
        if data is not None and score is None:
            raise ValueError("Evaluate: give score=fn(outputs, data) -> {name: value} with data")
        if data is None and (score is not None or predict_options):
            raise ValueError("Evaluate: without data, model is fn(storage, step) -> dict; "
                             "score and predict options need data")
        self.model = model
        self.data = data
        self.score = score
        self.every = int(every)
        self.workers = workers
        self.resources = dict(resources) if resources else None
        self.device = device
        self.predict_options = predict_options
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._saved = 0
        self._lock = threading.Lock()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: list[concurrent.futures.Future[dict[str, float]]] = []
        self._client: Any = None

    def __getstate__(self) -> dict[str, Any]:
        keep = ("model", "data", "score", "every", "workers", "resources", "device",
                "predict_options")
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    # -- the Checkpointer's hook ------------------------------------------------------------
    def checkpoint_saved(self, step: int, storage: str, upload: Any = None) -> None:
        """Called by rank 0's Checkpointer after it started saving ``step`` to ``storage``
        (``upload``: a future completing when the checkpoint is in storage)."""
        with self._lock:
            self._saved += 1
            if (self._saved - 1) % self.every:
                return
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="dask-ddp-evaluate")
                atexit.register(self.wait)
            self._pending.append(self._executor.submit(self._run, step, storage, upload))

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the evaluations started so far; raises the first one's error."""
        with self._lock:
            pending, self._pending = self._pending, []
        for fut in pending:
            fut.result(timeout)

    # -- in the evaluation thread -------------------------------------------------------------
    def _cluster(self) -> Any:
        if self._client is None:
            from distributed import Client

            address = os.environ.get("DASK_DDP_SCHEDULER")
            if not address:
                raise RuntimeError("Evaluate runs in a dask-ddp job's rank (DASK_DDP_SCHEDULER "
                                   "is not set)")
            self._client = Client(address, set_as_default=False, timeout="30s")
        return self._client

    def _scores(self, step: int, storage: str) -> Mapping[str, Any]:
        client = self._cluster()
        if self.data is None:
            with client.as_current():
                return dict(self.model(storage, step))
        from dask.base import is_dask_collection

        from dask_ddp.predict.api import predict

        with client.as_current():
            out = predict(self.model, self.data, checkpoint=storage, checkpoint_step=step,
                          device=self.device, **self.predict_options)
            assert self.score is not None
            wanted = dict(self.score(out, self.data))
        lazy = [k for k, v in wanted.items() if is_dask_collection(v)]
        futures = client.compute([wanted[k] for k in lazy], workers=self.workers,
                                 resources=self.resources)
        return {**wanted, **dict(zip(lazy, client.gather(futures), strict=True))}

    def _run(self, step: int, storage: str, upload: Any) -> dict[str, float]:
        from dask_ddp.results import report

        try:
            if upload is not None and hasattr(upload, "result"):
                upload.result()  # scored once it is complete in storage
            scores = {f"eval/{k}": float(v) for k, v in self._scores(step, storage).items()}
        except Exception:
            logger.exception("evaluating checkpoint step %d failed", step)
            report({"eval/error": 1}, step=step)
            raise
        logger.info("checkpoint step %d scored: %s", step, scores)
        report(scores, step=step)
        return scores
