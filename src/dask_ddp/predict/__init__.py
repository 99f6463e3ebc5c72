"""Batch inference on Dask collections: :func:`predict` and evaluation while training.

- :func:`predict` (``dask_ddp.predict``): a model's outputs over a Dask DataFrame or
  Array, or an image dataset read by the C++ engine, as a lazy Dask collection aligned
  with the input's partitions (``api``).
- :func:`skipped`: how many samples ``on_error="skip"`` left out
  (``skips``).
- :class:`Evaluate`: score each checkpoint a job saves on the cluster while it trains;
  the scores arrive as the job's ``eval/...`` metrics (``evaluate``).

The rooms: ``api`` (the public function), ``graphs`` (the collections), ``model`` (the
per-worker model cache, keyed by model and device, and threads), ``devices`` (a task's
GPU among the worker's visible ones), ``precision`` (autocast and TF32 per task),
``weights`` (checkpoints), ``tables`` (the DataFrame and Array path), ``images`` (the
engine's image path), ``engines`` (a worker thread's engine, kept across partitions),
``sources`` (any data Source, read by a Loader), ``outputs`` (output layouts), ``shapes``
(the output's shape on the meta device or from a probe task), ``forward`` (the batched
forward, GPU outputs copied back through pinned buffers and events), ``heap`` (glibc's
heap kept for reuse while a model runs in a Dask worker), ``skips`` (skip counts), ``evaluate``.

The package is callable: ``dask_ddp.predict(model, data, ...)`` is
:func:`dask_ddp.predict.api.predict`, whichever of the package or the function a
``dask_ddp.predict`` lookup finds (importing a submodule binds the package there).
"""

from __future__ import annotations

import copyreg
import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

from dask_ddp._lazy import attribute_loader

if TYPE_CHECKING:
    from dask_ddp.predict.api import predict
    from dask_ddp.predict.evaluate import Evaluate
    from dask_ddp.predict.model import cache_info
    from dask_ddp.predict.skips import skipped

_WHERE = {
    "predict": "dask_ddp.predict.api:predict",
    "Evaluate": "dask_ddp.predict.evaluate:Evaluate",
    "cache_info": "dask_ddp.predict.model:cache_info",
    "skipped": "dask_ddp.predict.skips:skipped",
}

__all__ = ["Evaluate", "cache_info", "predict", "skipped"]
__getattr__ = attribute_loader(__name__, _WHERE)


class _CallablePackage(types.ModuleType):
    """This package, callable as :func:`~dask_ddp.predict.api.predict`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from dask_ddp.predict.api import predict as run

        return run(*args, **kwargs)


def _by_name(package: _CallablePackage) -> tuple[Any, tuple[str]]:
    return importlib.import_module, (package.__name__,)


sys.modules[__name__].__class__ = _CallablePackage
# Pickled by name, as modules are (a function shipped to workers may refer to it).
copyreg.pickle(_CallablePackage, _by_name)
