"""Map-style image datasets over any object store: local folders, file://, s3://, http(s).

``ImageList`` is the general one: images named by keys under a root URL, with integer
labels, e.g. read from a manifest (a CSV or TSV of paths and labels) by
:meth:`ImageList.from_csv`. ``ImageFolder`` is an ``ImageList`` whose keys and labels
come from class folders, as torchvision's: classes are the first folder level under the
root (sorted). Both have ``classes``, ``class_to_idx``, ``samples`` and ``targets``;
``ds[i]`` is ``(PIL.Image in RGB, label)`` with ``transform`` / ``target_transform``
applied, so any torchvision transform works. Bytes come through the C++ store
(:mod:`dask_ddp.storage`), the same for a local folder and a bucket. Datasets pickle
without their store and reopen it lazily, so they work in a torch ``DataLoader`` with
``num_workers > 0``.

For speed, hand the dataset to :class:`dask_ddp.data.Loader`, which decodes and
transforms in C++ threads instead of Python processes.
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from torch.utils.data import Dataset

from dask_ddp import storage
from dask_ddp.data import manifest
from dask_ddp.data.process_store import ProcessStore

__all__ = ["IMG_EXTENSIONS", "ImageFolder", "ImageList", "S3ImageFolder"]

logger = logging.getLogger(__name__)

#: The extensions torchvision's ImageFolder accepts (case-insensitive). The map-style
#: path decodes all of them with PIL; the Loader's engine decodes JPEG and PNG.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class ImageList(Dataset[tuple[Any, Any]]):
    """Images named by keys under a root URL, with integer labels.

    The dataset a manifest describes (see :meth:`from_csv`); :class:`ImageFolder` is the
    one class folders describe. ``ds[i]`` is ``(PIL.Image in RGB, label)`` with the
    transforms applied; :class:`~dask_ddp.data.Loader` reads it (or a ``Subset`` of it)
    in C++ threads instead.

    Parameters
    ----------
    root
        Where the keys are: a local folder, ``file:///path``, ``s3://bucket/prefix``,
        ``http(s)://host/base`` or ``memory://name`` (see :mod:`dask_ddp.storage`).
    keys
        Each image's path relative to ``root``, with ``/`` separators. An absolute path
        or URL is accepted when it lies under ``root`` (it is made relative); a key
        leaving ``root`` (a ``..`` segment, an absolute path or URL elsewhere) is a
        ``ValueError``. ``.`` segments are dropped (``./a.jpg`` is ``a.jpg``).
    targets
        The label of each image, integers ``>= 0``.
    transform
        Applied to the PIL image (any torchvision transform).
    target_transform
        Applied to the label.
    classes
        Class names, indexed by label. Default: ``"0"``, ``"1"``, ... up to the largest
        label, so ``len(ds.classes)`` is the number of classes.
    anon
        S3: unsigned requests (public buckets).
    storage_options
        Options of the store (:func:`dask_ddp.storage.open`): ``endpoint_url``,
        ``region``, ``ca_bundle``, ``max_attempts``, ... The
        :class:`~dask_ddp.data.Loader` reads through the same store, options included.

    Attributes
    ----------
    classes : list of str
        Class names, indexed by label.
    class_to_idx : dict
        Class name to label.
    samples : list of (str, int)
        (path or URL, label) per image, in the order of ``keys``.
    targets : list of int
        The labels, in sample order.
    manifest_url : str or None
        The manifest it was read from (:meth:`from_csv`), else ``None``.

    Raises
    ------
    ValueError
        For no keys, a key leaving ``root``, a negative label, a label outside
        ``classes`` or ``keys`` and ``targets`` of different lengths; a malformed
        ``root`` URL.
    TypeError
        For a label that is not an integer.

    Notes
    -----
    A key naming no object is found when the image is read: ``ds[i]`` raises
    ``FileNotFoundError`` naming its URL, and the Loader raises the same, or, with
    ``on_error="skip"``, leaves it out and counts it in ``loader.skipped`` (manifests
    go stale; an :class:`ImageFolder` lists what exists, so there it always raises).

    Examples
    --------
    >>> ds = ImageList("memory://imagelist-doc", ["cats/1.jpg", "dogs/7.jpg"], [0, 1],
    ...                classes=["cat", "dog"])
    >>> ds.samples
    [('memory://imagelist-doc/cats/1.jpg', 0), ('memory://imagelist-doc/dogs/7.jpg', 1)]
    """

    #: With the Loader's ``on_error="skip"``, a key naming no object is skipped too.
    _skip_missing: ClassVar[bool] = True
    manifest_url: str | None

    def __init__(
        self,
        root: str | os.PathLike[str],
        keys: Sequence[str],
        targets: Sequence[int],
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        *,
        classes: Sequence[str] | None = None,
        anon: bool = False,
        storage_options: Mapping[str, Any] | None = None,
        _manifest: manifest.Manifest | None = None,
    ) -> None:
        # _manifest (internal, passed by from_csv only): the manifest root, keys, targets
        # and classes were read from; its reader opened the store and checked each line.
        m = _manifest
        self._open_root(root, transform, target_transform, anon, storage_options,
                        store=None if m is None else m.store)
        self._set_samples(keys, targets, classes, checked=m is not None)
        if m is not None:
            self.manifest_url = m.url

    @classmethod
    def from_csv(
        cls,
        manifest_url: str | os.PathLike[str],
        root: str | os.PathLike[str] | None = None,
        *,
        key_column: str = "path",
        label_column: str = "label",
        delimiter: str = ",",
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        classes: Sequence[str] | None = None,
        anon: bool = False,
        encoding: str = "utf-8-sig",
        storage_options: Mapping[str, Any] | None = None,
    ) -> ImageList:
        """The images a manifest lists: a CSV (or TSV, ``delimiter="\\t"``) with a header.

        Parameters
        ----------
        manifest_url
            The manifest's URL or path, read through :mod:`dask_ddp.storage`
            (``s3://bucket/lists/train.csv`` works).
        root
            Where the keys are. Default: the manifest's folder.
        key_column
            The column of image keys, relative to ``root`` (absolute paths or URLs under
            ``root`` are accepted).
        label_column
            The column of labels: integers ``>= 0``, or class names, which become the
            sorted ``classes`` with ``class_to_idx`` as in :class:`ImageFolder`. Which of
            the two is decided by the first row.
        delimiter
            The field separator (``","``; ``"\\t"`` for TSV).
        transform, target_transform
            As for :class:`ImageList`.
        classes
            The class names, indexed by label; labels are then names from it (or
            integer indices into it). Keeps labels stable across manifests (train and
            validation lists that do not contain every class).
        anon
            S3: unsigned requests, for the manifest and the images.
        encoding
            The manifest's text encoding (the default also drops a UTF-8 byte order
            mark, as spreadsheet exports write).
        storage_options
            Store options for the manifest and the images (see :class:`ImageList`).

        Returns
        -------
        ImageList

        Raises
        ------
        ValueError
            Naming the manifest URL and the line: an empty manifest, a missing column, a
            short row, a bad label, a key leaving ``root``.
        FileNotFoundError
            If the manifest does not exist.

        Examples
        --------
        >>> from dask_ddp import storage
        >>> storage.open("memory://from-csv-doc").put(
        ...     "train.csv", b"path,label\\nimg/1.jpg,dog\\nimg/2.jpg,cat\\n")
        >>> ds = ImageList.from_csv("memory://from-csv-doc/train.csv")
        >>> ds.classes, ds.targets, ds.samples[0][0]
        (['cat', 'dog'], [1, 0], 'memory://from-csv-doc/img/1.jpg')
        """
        m = manifest.read_csv(
            os.fspath(manifest_url),
            None if root is None else os.fspath(root),
            key_column=key_column,
            label_column=label_column,
            delimiter=delimiter,
            classes=classes,
            anon=anon,
            encoding=encoding,
            storage_options=storage_options,
        )
        ds = ImageList(m.root, m.keys, m.targets, transform, target_transform,
                       classes=m.classes, anon=anon, storage_options=storage_options,
                       _manifest=m)
        logger.debug(
            "%s: %d images in %d classes", storage.redact_url(m.url), len(ds), len(ds.classes)
        )
        return ds

    # -- construction ---------------------------------------------------------------------
    def _open_root(
        self,
        root: str | os.PathLike[str],
        transform: Callable[[Any], Any] | None,
        target_transform: Callable[[Any], Any] | None,
        anon: bool,
        storage_options: Mapping[str, Any] | None,
        store: storage.Store | None = None,
    ) -> None:
        self._opened = ProcessStore(os.fspath(root), anon=anon,
                                    storage_options=storage_options, store=store)
        self.url = self.root = self._opened.url
        self.transform = transform
        self.target_transform = target_transform
        self.anon = anon
        self.storage_options = self._opened.storage_options
        self.manifest_url = None
        self._opened.get()  # a malformed URL fails here, not in a DataLoader worker
        parsed = storage.parse_url(self.url)
        self._local_root: str | None = parsed.location if parsed.local else None

    def _set_samples(self, keys: Sequence[str], targets: Sequence[int],
                     classes: Sequence[str] | None, *, checked: bool) -> None:
        # checked: the keys are relative and the targets ints >= 0 (listed or parsed)
        name = f"{type(self).__name__}({storage.redact_url(self.url)!r})"
        root = None if checked else manifest.Root(self.url, self.store.url)
        self._keys, self.targets, self.classes = manifest.checked_samples(
            name, root, keys, targets, classes
        )
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self._make_samples()

    def _make_samples(self) -> None:
        # Derived from the keys: not pickled (under half the size for a large manifest).
        pairs = zip(self._keys, self.targets, strict=True)
        if self._local_root is not None:
            root = os.path.join(self._local_root, "")  # os.path.join(root, key), hoisted
            self.samples = [(root + k, t) for k, t in pairs]
        else:
            base = self.store.url.rstrip("/") + "/"
            self.samples = [(base + k, t) for k, t in pairs]
        self.imgs = self.samples

    # -- the store, reopened lazily in each process --------------------------------------
    @property
    def store(self) -> storage.Store:
        """The store the keys are under, opened in this process (a forked or unpickled
        copy opens its own)."""
        return self._opened.get()

    @property
    def keys(self) -> list[str]:
        """The images' keys, relative to the root, in the dataset's order."""
        return self._keys

    @property
    def skips_missing(self) -> bool:
        """Whether the Loader's ``on_error="skip"`` also skips a key naming no object (a
        manifest naming removed files); an ``ImageFolder`` listed its objects, so one
        missing there is a storage error."""
        return self._skip_missing

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()  # its ProcessStore pickles without the handle
        state.pop("samples", None)  # rebuilt from the keys
        state.pop("imgs", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._make_samples()

    # -- Dataset --------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._keys)

    def load(self, index: int) -> Any:
        """The image at ``index`` as an RGB ``PIL.Image`` (no transform).

        Raises
        ------
        FileNotFoundError
            If the key names no object (the message names its URL).
        OSError, ValueError
            If the bytes are not a decodable image (the message names its URL).
        """
        from PIL import Image

        key = self._keys[index]
        data = self.store.get(key)
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
            f"{type(self).__name__}({storage.redact_url(self.url)!r}, {len(self)} images, "
            f"{len(self.classes)} classes)"
        )


class ImageFolder(ImageList):
    """Images in per-class folders under a root URL, as ``torchvision.datasets.ImageFolder``.

    An :class:`ImageList` whose keys are the image files found under ``url`` (other
    files are skipped) and whose labels are their first folder's index in the sorted
    folder names.

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
    storage_options
        Options of the store, e.g. ``{"endpoint_url": ..., "region": ...}`` (see
        :class:`ImageList`); the Loader reads through the same store.

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

    # Listed objects exist: one missing later means the data changed under the reader.
    _skip_missing: ClassVar[bool] = False

    def __init__(
        self,
        url: str | os.PathLike[str],
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        *,
        anon: bool = False,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        self._open_root(url, transform, target_transform, anon, storage_options)
        keys: list[str] = []
        class_of: list[str] = []
        listed = self.store.list("")
        shown = storage.redact_url(self.url)  # for messages and logs: no credentials
        if not listed:
            raise FileNotFoundError(
                f"nothing under {shown}: no such folder, or an empty or wrong bucket/prefix"
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
                f"{shown} ({len(listed)} other objects; expected <root>/<class>/<image>, "
                f"e.g. {listed[0].key!r} is not one)"
            )
        classes = sorted(set(class_of))
        index = {c: i for i, c in enumerate(classes)}
        # Listed keys are the store's own: read them as they are.
        self._set_samples(keys, [index[c] for c in class_of], classes, checked=True)
        logger.debug("%s: %d images in %d classes", shown, len(keys), len(self.classes))


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
    storage_options
        Store options, e.g. ``{"endpoint_url": ..., "region": ...}`` (see
        :func:`dask_ddp.storage.open`).
    """

    def __init__(
        self,
        s3_bucket: str,
        s3_prefix: str,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        anon: bool = False,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        if not s3_bucket or "/" in s3_bucket:
            raise ValueError(f"s3_bucket must be a bucket name, got {s3_bucket!r}")
        self.s3_bucket = s3_bucket
        self.s3_prefix = s3_prefix.strip("/")
        url = f"s3://{s3_bucket}/{self.s3_prefix}" if self.s3_prefix else f"s3://{s3_bucket}"
        super().__init__(
            url, transform, target_transform, anon=anon, storage_options=storage_options
        )

    @property
    def all_files(self) -> list[str]:
        """Keys of the images in the bucket (the seed's attribute)."""
        p = f"{self.s3_prefix}/" if self.s3_prefix else ""
        return [p + k for k in self._keys]
