"""Map-style image datasets over any object store: local folders, file://, s3://, http(s).

``ImageFolder`` follows torchvision's: classes are the first folder level under the root
(sorted), with ``classes``, ``class_to_idx``, ``samples`` and ``targets``; ``ds[i]`` is
``(PIL.Image in RGB, label)`` with ``transform`` / ``target_transform`` applied, so any
torchvision transform works. Bytes come through the C++ store (:mod:`dask_ddp.storage`),
the same for a local folder and a bucket. Datasets pickle without their store and reopen
it lazily, so they work in a torch ``DataLoader`` with ``num_workers > 0``.

For speed, hand the dataset to :class:`dask_ddp.data.Loader`, which decodes and
transforms in C++ threads instead of Python processes.
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Callable
from typing import Any

from torch.utils.data import Dataset

from dask_ddp import storage

__all__ = ["IMG_EXTENSIONS", "ImageFolder", "S3ImageFolder"]

logger = logging.getLogger(__name__)

#: The extensions torchvision's ImageFolder accepts (case-insensitive). The map-style
#: path decodes all of them with PIL; the Loader's engine decodes JPEG and PNG.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def _is_local(url: str) -> bool:
    return url.startswith("file://") or "://" not in url


class ImageFolder(Dataset[tuple[Any, Any]]):
    """Images in per-class folders under a root URL, as ``torchvision.datasets.ImageFolder``.

    Parameters
    ----------
    url
        A local folder, ``file:///path``, ``s3://bucket/prefix``, ``memory://name`` or an
        ``http(s)://`` base serving a listing file (see :mod:`dask_ddp.storage`).
    transform
        Applied to the PIL image (any torchvision transform).
    target_transform
        Applied to the label.
    anon
        S3: unsigned requests (public buckets).

    Attributes
    ----------
    classes : list of str
        Sorted class (folder) names.
    class_to_idx : dict
        Class name to label.
    samples : list of (str, int)
        (path or URL, label) per image, sorted by key.
    targets : list of int
        The labels, in sample order.

    Raises
    ------
    FileNotFoundError
        If no image is found in a class folder under ``url``.
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        *,
        anon: bool = False,
    ) -> None:
        self.url = os.fspath(url)
        self.root = self.url
        self.transform = transform
        self.target_transform = target_transform
        self.anon = anon
        self._store: storage.Store | None = None
        self._store_pid = 0
        store = self._get_store()
        keys: list[str] = []
        class_of: list[str] = []
        listed = store.list("")
        if not listed:
            raise FileNotFoundError(
                f"nothing under {self.url}: no such folder, or an empty or wrong "
                "bucket/prefix"
            )
        for info in listed:
            key = info.key
            if "/" not in key or not key.lower().endswith(IMG_EXTENSIONS):
                continue  # files at the root belong to no class; non-images are skipped
            keys.append(key)
            class_of.append(key.split("/", 1)[0])
        if not keys:
            raise FileNotFoundError(
                f"no image files ({', '.join(IMG_EXTENSIONS)}) in class folders under "
                f"{self.url} ({len(listed)} other objects; expected <root>/<class>/<image>, "
                f"e.g. {listed[0].key!r} is not one)"
            )
        self.classes = sorted(set(class_of))
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self._keys = keys
        self.targets = [self.class_to_idx[c] for c in class_of]
        base = store.url
        local_root = self.url[len("file://") :] if self.url.startswith("file://") else self.url
        if _is_local(self.url):
            self.samples = [
                (os.path.join(local_root, k), t) for k, t in zip(keys, self.targets, strict=True)
            ]
        else:
            self.samples = [
                (f"{base.rstrip('/')}/{k}", t) for k, t in zip(keys, self.targets, strict=True)
            ]
        self.imgs = self.samples
        logger.debug("%s: %d images in %d classes", self.url, len(keys), len(self.classes))

    # -- the store, reopened lazily in each process --------------------------------------
    def _get_store(self) -> storage.Store:
        # A forked DataLoader worker inherits the parent's handle but not its threads and
        # connections: open a fresh store in each process.
        if self._store is None or self._store_pid != os.getpid():
            self._store = storage.open(self.url, anon=self.anon)
            self._store_pid = os.getpid()
        return self._store

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_store"] = None  # a C++ handle: reopen after unpickling
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    # -- Dataset --------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._keys)

    def load(self, index: int) -> Any:
        """The image at ``index`` as an RGB ``PIL.Image`` (no transform)."""
        from PIL import Image

        key = self._keys[index]
        data = self._get_store().get(key)
        try:
            with Image.open(io.BytesIO(data)) as img:
                return img.convert("RGB")
        except (OSError, ValueError, SyntaxError) as e:
            raise type(e)(f"{self.samples[index][0]}: cannot decode image: {e}") from e

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        img = self.load(index)
        target: Any = self.targets[index]
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.url!r}, {len(self)} images, {len(self.classes)} classes)"
        )


class S3ImageFolder(ImageFolder):
    """The seed's ``S3ImageFolder``: images under ``s3://s3_bucket/s3_prefix`` in class
    folders, over the C++ S3 store (endpoint and credentials from the AWS environment).

    Parameters
    ----------
    s3_bucket
        Bucket name.
    s3_prefix
        Key prefix of the dataset root (class folders below it).
    transform, target_transform
        As for :class:`ImageFolder` (torchvision transforms work).
    anon
        Unsigned requests, for public buckets.
    """

    def __init__(
        self,
        s3_bucket: str,
        s3_prefix: str,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        anon: bool = False,
    ) -> None:
        if not s3_bucket or "/" in s3_bucket:
            raise ValueError(f"s3_bucket must be a bucket name, got {s3_bucket!r}")
        self.s3_bucket = s3_bucket
        self.s3_prefix = s3_prefix.strip("/")
        url = f"s3://{s3_bucket}/{self.s3_prefix}" if self.s3_prefix else f"s3://{s3_bucket}"
        super().__init__(url, transform, target_transform, anon=anon)

    @property
    def all_files(self) -> list[str]:
        """Keys of the images in the bucket (the seed's attribute)."""
        p = f"{self.s3_prefix}/" if self.s3_prefix else ""
        return [p + k for k in self._keys]
