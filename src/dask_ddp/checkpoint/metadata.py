"""A sharded checkpoint's ``.metadata``, read without running the code it could name.

DCP writes its metadata with :mod:`pickle`, and ``pickle.loads`` of bytes from storage runs
whatever callable they name: a file put into the bucket would run code in every process that
reads the checkpoint list. :func:`load_metadata` unpickles with an allow-list instead: DCP's
metadata classes, the storage-info record of its file format, ``torch.Size``, torch's dtypes
and layouts; any other global is refused with an error naming the object and the global.
(Full checkpoints load with ``torch.load(weights_only=True)``, torch's own restricted
unpickler.)
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata

_DCP = "torch.distributed.checkpoint.metadata"

#: The globals a DCP metadata object is made of (torch 2.4 and later).
_ALLOWED = frozenset({
    (_DCP, "Metadata"),
    (_DCP, "MetadataIndex"),
    (_DCP, "StorageMeta"),
    (_DCP, "TensorProperties"),
    (_DCP, "TensorStorageMetadata"),
    (_DCP, "BytesStorageMetadata"),
    (_DCP, "ChunkStorageMetadata"),
    (_DCP, "_MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
    ("torch", "Size"),
    ("collections", "OrderedDict"),
})


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, where: str) -> None:
        super().__init__(io.BytesIO(data))
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED or (
                module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"{self.where}: refused to load {module}.{name}: a checkpoint's metadata may "
            "name only DCP's metadata classes (not a DCP checkpoint, or a tampered one)")


def load_metadata(data: bytes, where: str) -> Metadata:
    """The DCP :class:`Metadata` pickled in ``data`` (read from ``where``, for errors).

    Raises
    ------
    pickle.UnpicklingError
        ``data`` names a global outside DCP's metadata classes.
    ValueError
        ``data`` is not DCP metadata.
    """
    try:
        metadata = _MetadataUnpickler(data, where).load()
    except pickle.UnpicklingError:
        raise
    except Exception as exc:  # truncated or not a pickle: many exception types
        raise ValueError(f"{where} is not DCP metadata ({type(exc).__name__}: {exc})") from exc
    if not isinstance(metadata, Metadata):
        raise ValueError(f"{where} is not DCP metadata (a {type(metadata).__name__})")
    return metadata
