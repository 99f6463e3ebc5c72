"""Where engine loaders are made: one place for the Loaders, live recovery's deals and
``predict``.

An :class:`ImageSource` is what an engine image loader reads (a store, keys under it and
their labels, whether a missing key is a bad sample); :meth:`ImageSource.loader` makes the
engine loader over it with a pipeline and options, for any rank layout or subset of its
samples. Tar shards make theirs with :meth:`~dask_ddp.data.TarShards.engine_loader`.
:func:`sample_layout` says what one sample of a pipeline looks like without reading any.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import Subset

from dask_ddp import _core, storage
from dask_ddp.data.datasets import ImageList

if TYPE_CHECKING:
    from dask_ddp.data.unread import Samples

__all__ = ["ImageSource", "resolve_dataset", "sample_layout"]

Op = tuple[str, list[float]]


def resolve_dataset(dataset: object) -> tuple[ImageList, list[int] | None]:
    """The image list behind ``dataset`` and the indices of it to read (None: all).

    An :class:`ImageList` (an ``ImageFolder`` is one), or a ``torch.utils.data.Subset``
    of one (a train/eval split), which reads just its indices; nested subsets compose.

    Raises
    ------
    TypeError
        ``dataset`` is neither.
    IndexError
        A subset's index is out of range.
    """
    if isinstance(dataset, ImageList):
        return dataset, None
    if isinstance(dataset, Subset):
        folder, inner = resolve_dataset(dataset.dataset)
        n = len(folder) if inner is None else len(inner)
        picked = [int(i) for i in dataset.indices]
        bad = [i for i in picked if not -n <= i < n]
        if bad:
            raise IndexError(f"Subset index {bad[0]} out of range for a dataset of {n} samples")
        picked = [i % n for i in picked]
        return folder, picked if inner is None else [inner[i] for i in picked]
    raise TypeError(
        f"Loader reads an ImageList, ImageFolder or S3ImageFolder (or a torch Subset of one), "
        f"not {type(dataset).__name__}; for other datasets use a torch DataLoader"
    )


@dataclasses.dataclass(frozen=True)
class ImageSource:
    """What an engine image loader reads.

    Attributes
    ----------
    store
        The store the keys are under (opened in this process).
    keys
        Keys relative to the store's root, in the dataset's order.
    labels
        One integer per key.
    skip_missing
        With ``on_error="skip"``, a key naming no object is a bad sample (a manifest that
        names removed files) rather than a storage error.
    """

    store: storage.Store
    keys: Sequence[str]
    labels: Sequence[int]
    skip_missing: bool = False

    @classmethod
    def of(cls, dataset: object) -> ImageSource:
        """The source of an image list or a ``Subset`` of one (see :func:`resolve_dataset`)."""
        folder, indices = resolve_dataset(dataset)
        keys, labels = folder.keys, folder.targets
        if indices is not None:
            keys = [keys[i] for i in indices]
            labels = [labels[i] for i in indices]
        return cls(folder.store, keys, labels, folder.skips_missing)

    def subset(self, positions: Samples) -> ImageSource:
        """The samples at ``positions``, in that order."""
        picked = [int(i) for i in positions]
        return dataclasses.replace(self, keys=[self.keys[i] for i in picked],
                                   labels=[self.labels[i] for i in picked])

    def loader(self, ops: Sequence[Op], *, skip_errors: bool = False, **options: Any) -> Any:
        """An engine loader (``dask_ddp._core.ImageLoader``) over these samples.

        ``options`` are the engine's (``batch_size``, ``shuffle``, ``seed``, ``rank``,
        ``world_size``, ``drop_last``, ``num_threads``, ``prefetch``, ``max_side``, ...);
        a missing key is skipped as a bad sample when both ``skip_errors`` and
        :attr:`skip_missing` say so.
        """
        return _core.ImageLoader(self.store.engine, list(self.keys), list(self.labels),
                                 list(ops), skip_errors=skip_errors,
                                 skip_missing=skip_errors and self.skip_missing, **options)

    def restart(self, engine: Any) -> None:
        """Make ``engine`` (one :meth:`loader` made over the same store, with the same
        ``skip_errors``) read these samples from its next epoch, keeping its threads and
        buffers (``ImageLoader.restart``)."""
        engine.restart(list(self.keys), list(self.labels))


def sample_layout(ops: Sequence[Op]) -> tuple[tuple[int, ...], torch.dtype]:
    """The shape and dtype of one sample the engine makes with ``ops`` (nothing read)."""
    probe = _core.ImageLoader(storage.open("memory://dask-ddp-sample-layout").engine, ["x"],
                              [0], list(ops), batch_size=1, shuffle=False, num_threads=1)
    try:
        shape = tuple(int(d) for d in probe.sample_shape)
        return shape, torch.float32 if probe.float_output else torch.uint8
    finally:
        probe.close()
