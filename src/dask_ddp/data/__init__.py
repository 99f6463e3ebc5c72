"""Datasets over object stores and the C++ batch loader.

- :class:`ImageFolder`, :class:`S3ImageFolder`: map-style datasets (PIL images, any
  torchvision transform, torch ``DataLoader`` compatible).
- :class:`Loader`: decode and transform in C++ threads; batches as tensors.
- :mod:`dask_ddp.data.transforms`: the transforms the Loader runs.
"""

from __future__ import annotations

from dask_ddp.data import transforms
from dask_ddp.data.datasets import IMG_EXTENSIONS, ImageFolder, S3ImageFolder
from dask_ddp.data.loader import Loader

__all__ = ["IMG_EXTENSIONS", "ImageFolder", "Loader", "S3ImageFolder", "transforms"]
