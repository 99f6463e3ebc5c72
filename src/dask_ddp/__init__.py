"""dask-ddp: PyTorch DistributedDataParallel on Dask, fed by a C++ data engine.

The public API:

- launching: :func:`dask_ddp.dispatch.run` (seed-compatible), :func:`submit`, :func:`rank_info`
- data: :mod:`dask_ddp.data` (``ImageFolder``, ``S3ImageFolder``, ``Loader``, ``transforms``)
- storage: :mod:`dask_ddp.storage` (object stores by URL)
- results: :mod:`dask_ddp.results` (``DaskResultsHandler``, ``report``, checkpoints)
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
