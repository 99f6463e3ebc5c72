"""WebDataset tar shards: read by the C++ engine, written in parallel on Dask.

::

    from dask_ddp.data import Loader, TarShards, write_shards, transforms as T

    ds = TarShards("s3://bucket/train/shard-{000000..001023}.tar")
    loader = Loader(ds, batch_size=64, transform=T.Compose([...]), shuffle=True, seed=0)

    write_shards(ImageFolder("s3://bucket/raw"), "s3://bucket/train/shard-{:06d}.tar",
                 samples_per_shard=1000, client=client)

Format (WebDataset's): consecutive tar members sharing a key (the member name up to the
first ``.`` of its file name) form a sample; ``key.jpg``/``.jpeg``/``.png`` is its
image, ``key.cls`` its integer label as text (or, with ``label_field``, that integer
field of ``key.json``); other members are ignored, unless ``fields`` names the members
that make a sample (any type: images, ``.npy`` arrays, integers, text, JSON, bytes).
The order of an epoch is computed from the number of samples in each shard (counted
once, see :attr:`TarShards.counts`), so it is exact on resume: see :class:`TarShards`.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import tarfile
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dask_ddp import _core, storage
from dask_ddp.data.datasets import ImageList
from dask_ddp.data.process_store import ProcessStore

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["TarShards", "expand_shard_urls", "write_shards"]

logger = logging.getLogger(__name__)

_BRACE = re.compile(r"\{(\d+)\.\.(\d+)\}")
_IMAGES = ("jpg", "jpeg", "png")
_IMAGE_EXT = {".jpg": "jpg", ".jpeg": "jpg", ".png": "png"}


def expand_shard_urls(pattern: str) -> list[str]:
    """Expand brace ranges: ``"shard-{000000..000003}.tar"`` -> four URLs.

    The width of the first number sets the zero padding; several ranges expand as a
    product, left to right. Raises ``ValueError`` for a descending range.
    """
    m = _BRACE.search(pattern)
    if m is None:
        return [pattern]
    lo, hi = int(m.group(1)), int(m.group(2))
    if hi < lo:
        raise ValueError(f"shard pattern {pattern!r}: range {m.group(0)} is descending")
    width = len(m.group(1))
    head, tail = pattern[: m.start()], pattern[m.end() :]
    return [u for i in range(lo, hi + 1) for u in expand_shard_urls(f"{head}{i:0{width}d}{tail}")]


def _split_root(urls: Sequence[str]) -> tuple[str, list[str]]:
    """The directory URL common to every shard, and each shard's key below it."""
    cut = os.path.commonprefix(list(urls)).rfind("/")
    if cut < 0:
        return ".", list(urls)
    root = urls[0][:cut] or "/"
    if root.endswith((":/", "//")):
        raise ValueError(f"no store root in shard URL {storage.redact_url(urls[0])!r}")
    return root, [u[cut + 1 :] for u in urls]


class TarShards:
    """A dataset of WebDataset tar shards, for :class:`~dask_ddp.data.Loader`.

    Parameters
    ----------
    urls
        A brace pattern (``"s3://b/train/shard-{000000..001023}.tar"``), a list of shard
        URLs (all in one store), or a prefix URL (``"s3://b/train/"``, a directory) whose
        ``*.tar`` objects are the shards, sorted by key (over http the prefix needs an
        ``_index.txt`` listing, see :mod:`dask_ddp.storage`). Any store: ``s3://``,
        ``http(s)://``, ``file://`` or a path.
    transform
        The Loader's transform when it is given none (from :mod:`dask_ddp.data.transforms`).
    label_field
        Take each sample's label from this integer field of its ``.json`` member instead
        of its ``.cls`` member. A sample without a label gets -1.
    fields
        The members that make a sample, by extension, and the order of the tuple the
        Loader yields per batch (alternatives with ``;``: ``"jpg;png"``), e.g.
        ``("jpg", "cls")`` or ``("npy", "cls", "txt")``; every one is required (a sample
        without one is bad input). An image field (jpg, jpeg, png) is decoded and
        transformed as usual (a batch tensor); ``npy`` arrays are parsed by the engine
        and stacked into one tensor per batch (same shape and dtype required); ``cls`` and
        ``idx`` integers make an int64 tensor; any other member arrives per sample in a
        list: ``txt`` as ``str``, ``json`` parsed, anything else as ``bytes``. Default
        (None): ``(image, label)`` as above.
    counts
        Samples per shard, when known (e.g. from :func:`write_shards`, or ``counts`` of
        an earlier instance); otherwise they are counted on first use by streaming every
        shard once (headers parsed, images not decoded). Counting in the client and
        passing the dataset to the ranks (it pickles with its counts) avoids counting
        in every rank.
    shuffle_buffer
        Samples mixed within a rank's stream (WebDataset's ``shuffle(n)``); <= 1: none.
    range_bytes
        Shards are read as streams of ranged GETs of this many bytes, parsed as they
        arrive: a rank holds at most ``3 * 2 * range_bytes`` of shard bytes at once (its
        current shard and the next two, two ranges ahead each), plus the samples parsed
        and not yet due (the shuffle buffer's and the batches in flight, encoded), plus
        the largest sample being parsed, whatever the shard size.
    anon, storage_options
        As for the other datasets: unsigned S3 requests; store options (``endpoint_url``,
        ``region``, ``max_in_flight``, ...).

    Notes
    -----
    Order of an epoch (with ``shuffle``): the shards are shuffled by (seed, epoch) and
    their samples, concatenated in that order, are split across ranks at sample
    granularity as ``DistributedSampler`` splits indices: each rank takes a contiguous run
    of ``ceil(N / W)`` samples (``floor(N / W)`` with ``drop_last``), so ranks differ by at
    most one sample before padding, whatever the shard sizes. Without ``drop_last`` the
    last rank's run is padded with the epoch's first samples (at most W - 1 repeats); with
    it, at most W - 1 samples of the tail are dropped. Every rank yields the **same number
    of batches** (an uneven split would hang DDP). A shard on the boundary between two
    ranks is read by both, each parsing past the other's samples without decoding them
    (at most W - 1 such shards per epoch, plus the head for the padding). Each rank
    streams its samples through the shuffle buffer (random by (seed, epoch, rank)).

    Resume: ``Loader.state_dict()`` mid-epoch and ``load_state_dict()`` on the same world
    size continue with exactly the samples of the uninterrupted epoch, in the same order.
    On another world size, the rest of that epoch reads exactly the samples no rank had
    yielded (as ``(shard, begin, end)`` runs), split across the new ranks the same way.
    """

    def __init__(
        self,
        urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        transform: Any = None,
        label_field: str | None = None,
        fields: Sequence[str] | None = None,
        counts: Sequence[int] | None = None,
        shuffle_buffer: int = 1000,
        range_bytes: int = 8 << 20,
        anon: bool = False,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self.anon = bool(anon)
        self.storage_options = dict(storage_options or {})
        self.transform = transform
        self.label_field = label_field or ""
        self.fields: tuple[str, ...] | None = None
        if fields is not None:
            if isinstance(fields, str):
                raise TypeError(f"fields must be a sequence of extensions, e.g. ({fields!r},)")
            self.fields = tuple(str(f).lower().lstrip(".") for f in fields)
            if not self.fields or any(not f for f in self.fields):
                raise ValueError(f"fields must name at least one member extension, got {fields!r}")
            if label_field:
                raise ValueError(
                    "give label_field or fields (e.g. fields=('jpg', 'cls')), not both"
                )
        self.shuffle_buffer = int(shuffle_buffer)
        if range_bytes < 1:
            raise ValueError(f"range_bytes must be >= 1, got {range_bytes}")
        self.range_bytes = int(range_bytes)
        if isinstance(urls, (str, os.PathLike)):
            pattern = os.fspath(urls)
            if pattern.endswith(".tar") or _BRACE.search(pattern):
                listed = expand_shard_urls(pattern)
            else:
                listed = self._list_prefix(pattern)
        else:
            listed = [os.fspath(u) for u in urls]
        if not listed:
            raise ValueError(f"TarShards: no shards in {urls!r}")
        self.url, self.keys = _split_root(listed)
        self._opened = ProcessStore(self.url, anon=self.anon,
                                    storage_options=self.storage_options)
        self.storage_options = self._opened.storage_options  # one dict: what it opens with
        self._opened.get()  # a malformed URL fails here
        self._counts: dict[bool, list[int]] = {}
        #: Samples left out when counting with ``skip_errors`` (the Loader's ``on_error="skip"``).
        self.skipped = 0
        if counts is not None:
            given = [int(c) for c in counts]
            if len(given) != len(self.keys):
                raise ValueError(f"TarShards: {len(given)} counts for {len(self.keys)} shards")
            if any(c < 0 for c in given):
                raise ValueError("TarShards: counts must be >= 0")
            self._counts = {False: given, True: given}

    def _list_prefix(self, prefix: str) -> list[str]:
        store = storage.open(prefix, anon=self.anon, **self.storage_options)
        base = store.url.rstrip("/")
        found = sorted(i.key for i in store.list("") if i.key.endswith(".tar"))
        if not found:
            raise ValueError(f"TarShards: no *.tar objects under {storage.redact_url(prefix)!r}")
        return [f"{base}/{k}" for k in found]

    @property
    def store(self) -> storage.Store:
        """The store the shards are under, opened in this process (a forked or unpickled
        copy opens its own)."""
        return self._opened.get()

    @property
    def image_field(self) -> int | None:
        """The position of the image among :attr:`fields` (None: no image field); 0
        without ``fields``."""
        if self.fields is None:
            return 0
        for i, f in enumerate(self.fields):
            if any(alt in _IMAGES for alt in f.split(";")):
                return i
        return None

    @property
    def urls(self) -> list[str]:
        """The shards' URLs, in dataset order."""
        base = self.store.url.rstrip("/")
        return [f"{base}/{k}" for k in self.keys]

    def shard_counts(self, skip_errors: bool = False) -> list[int]:
        """Samples per shard (counted once by fetching each shard, unless given).

        With ``skip_errors`` bad samples are not counted (the Loader's ``on_error="skip"``).
        """
        if skip_errors not in self._counts:
            t0 = time.monotonic()
            counts, skipped = _core.tar_shard_counts(
                self.store.engine, self.keys, skip_errors, self.label_field,
                range_bytes=self.range_bytes, fields=list(self.fields or ()))
            self._counts[skip_errors] = list(counts)
            self.skipped = int(skipped)
            logger.info(
                "%s: counted %d samples in %d shards in %.1fs (pass counts= to skip this)",
                storage.redact_url(self.url), sum(counts), len(counts), time.monotonic() - t0)
        return self._counts[skip_errors]

    @property
    def counts(self) -> list[int]:
        """Samples per shard."""
        return self.shard_counts(False)

    def __len__(self) -> int:
        """Samples in all shards."""
        return sum(self.counts)

    def unread_segments(
        self,
        epoch: int,
        position: int,
        *,
        world_size: int,
        shuffle: bool,
        seed: int,
        drop_last: bool,
        epoch_segments: Sequence[tuple[int, int, int]] | None = None,
        skip_errors: bool = False,
    ) -> list[tuple[int, int, int]]:
        """The samples of the epoch no rank had yielded once each rank yielded ``position``
        samples (world size ``world_size``), as ``(shard, begin, end)`` runs in the epoch's
        order."""
        segments = None if epoch_segments is None else [
            (int(a), int(b), int(c)) for a, b, c in epoch_segments]
        return [
            (int(a), int(b), int(c))
            for a, b, c in _core.shard_unread_segments(
                self.shard_counts(skip_errors),
                segments,
                epoch,
                position,
                world_size,
                shuffle=shuffle,
                seed=seed,
                drop_last=drop_last,
                shuffle_buffer=self.shuffle_buffer,
            )
        ]

    def engine_loader(self, ops: list[Any], *, skip_errors: bool, **kwargs: Any) -> Any:
        """An engine loader (``dask_ddp._core.TarShardLoader``) over these shards, with the
        engine options ``kwargs`` (``batch_size``, ``rank``, ``world_size``, ...)."""
        return _core.TarShardLoader(
            self.store.engine,
            self.keys,
            self.shard_counts(skip_errors),
            ops,
            skip_errors=skip_errors,
            shuffle_buffer=self.shuffle_buffer,
            label_field=self.label_field,
            range_bytes=self.range_bytes,
            fields=list(self.fields or ()),
            **kwargs,
        )

    def batch_tuple(self, item: tuple[Any, ...]) -> tuple[Any, ...]:
        """The Loader's tuple for a batch from the engine (images, labels, index, fields),
        in the order of :attr:`fields` (text decoded, JSON parsed)."""
        images, labels = item[0], item[1]
        if self.fields is None:
            return images, labels
        others = iter(item[3])
        out: list[Any] = []
        for i, f in enumerate(self.fields):
            if i == self.image_field:
                out.append(images)
                continue
            value = next(others)
            ext = f.split(";")[0]
            if ext == "txt":
                value = [b.decode("utf-8") for b in value]
            elif ext == "json":
                value = [json.loads(b) for b in value]
            out.append(value)
        return tuple(out)

    def __repr__(self) -> str:
        return f"TarShards({storage.redact_url(self.url)!r}, {len(self.keys)} shards)"


# ---- writing ------------------------------------------------------------------------------


def _tar_bytes(members: list[tuple[str, bytes]]) -> bytes:
    """A tar (ustar/pax as Python writes it) holding ``members`` in order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0  # deterministic bytes: a rerun writes the same shard
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _member_bytes(ext: str, value: Any, where: str) -> bytes:
    """A sample's value as the bytes of its ``ext`` member: bytes as they are, text as
    UTF-8, integers as decimal text, numpy arrays as ``.npy``, else JSON."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value).encode()
    if type(value).__module__ == "numpy" or ext == "npy":
        import numpy as np

        buf = io.BytesIO()
        np.save(buf, np.asarray(value), allow_pickle=False)
        return buf.getvalue()
    try:
        return json.dumps(value).encode()
    except TypeError as e:
        raise TypeError(f"{where}: member {ext!r} holds {type(value).__name__}: {e}") from None


def _sample_members(
    source: Sequence[dict[str, Any]], first: int, stop: int
) -> list[tuple[str, bytes]]:
    """The tar members of samples ``[first, stop)`` of a sequence of dicts."""
    members: list[tuple[str, bytes]] = []
    for i in range(first, stop):
        sample = source[i]
        key = str(sample.get("__key__", f"{i:09d}"))
        if "." in key.rsplit("/", 1)[-1]:
            raise ValueError(f"sample {i}: key {key!r} holds a '.' (it would end the key)")
        for ext, value in sample.items():
            if ext.startswith("__"):
                continue
            members.append((f"{key}.{ext}", _member_bytes(ext, value, f"sample {i}")))
    return members


def write_one_shard(
    source: ImageList | Sequence[dict[str, Any]],
    first: int,
    stop: int,
    out_url: str,
    out_options: dict[str, Any],
) -> tuple[str, int, bool]:
    """Write samples ``[first, stop)`` of ``source`` as one shard at ``out_url``.

    The task function of :func:`write_shards` (named, as the dashboard shows it). Image
    bytes are read through the engine (no decode) and the shard is written with one
    atomic ``put`` (a file: temporary then rename; S3: one PUT or a completed multipart
    upload), so a shard that exists is complete and is skipped. Returns (url, samples,
    written).
    """
    cut = out_url.rfind("/")
    out = storage.open(out_url[:cut], **out_options)
    key = out_url[cut + 1 :]
    if out.exists(key):
        return out_url, stop - first, False
    if not isinstance(source, ImageList):
        out.put(key, _tar_bytes(_sample_members(source, first, stop)))
        return out_url, stop - first, True
    store = source.store
    keys = source.keys[first:stop]
    data = dict(store.get_many(keys))
    members: list[tuple[str, bytes]] = []
    for i, k in enumerate(keys):
        name = f"{first + i:09d}"
        ext = _IMAGE_EXT.get(os.path.splitext(k)[1].lower())
        if ext is None:
            raise ValueError(f"{store.url}/{k}: not a .jpg, .jpeg or .png image")
        members.append((f"{name}.{ext}", data[k]))
        members.append((f"{name}.cls", str(source.targets[first + i]).encode()))
    out.put(key, _tar_bytes(members))
    return out_url, stop - first, True


def write_shards(
    dataset: ImageList | Sequence[dict[str, Any]],
    pattern: str,
    *,
    samples_per_shard: int = 1000,
    client: Client | None = None,
    storage_options: dict[str, Any] | None = None,
) -> TarShards:
    """Write ``dataset`` as WebDataset tar shards, one Dask task per shard.

    Shard ``i`` (named ``pattern.format(i)``) holds samples ``[i * n, (i + 1) * n)`` of
    the dataset in its order: for an image list, as members ``{index:09d}.jpg`` (or
    ``.png``, the original bytes) and ``{index:09d}.cls`` (the label); for a sequence of
    dicts (webdataset's sample form: extension -> value, ``"__key__"`` optional, else
    ``{index:09d}``), one member per extension: bytes as they are, ``str`` as UTF-8,
    ``int`` as text, numpy arrays as ``.npy``, anything else as JSON. Each shard is
    written atomically, and shards that already exist are skipped, so an interrupted run
    is finished by running it again. The result reads with ``webdataset`` too.

    Parameters
    ----------
    dataset
        An :class:`~dask_ddp.data.ImageList` or :class:`~dask_ddp.data.ImageFolder`, or
        a sequence of dicts (e.g. ``{"npy": array, "cls": 3, "txt": "a caption"}``).
    pattern
        The output URL with one ``str.format`` field for the shard number, e.g.
        ``"s3://bucket/train/shard-{:06d}.tar"``.
    samples_per_shard
        Samples per shard (the last may have fewer).
    client
        The Dask client whose workers write; None: write in this process.
    storage_options
        Options of the output store (as :func:`dask_ddp.storage.open`).

    Returns
    -------
    TarShards
        The written shards, with their counts known.
    """
    if samples_per_shard < 1:
        raise ValueError(f"samples_per_shard must be >= 1, got {samples_per_shard}")
    try:
        names = [pattern.format(i) for i in range(2)]
    except (IndexError, KeyError, ValueError) as e:
        raise ValueError(
            f"pattern {pattern!r} needs one format field for the shard number: {e}"
        ) from None
    if names[0] == names[1]:
        raise ValueError(f"pattern {pattern!r} gives every shard the same name")
    options = dict(storage_options or {})
    n = len(dataset)
    spans = [(a, min(a + samples_per_shard, n)) for a in range(0, n, samples_per_shard)]
    urls = [pattern.format(i) for i in range(len(spans))]
    if client is None:
        results = [
            write_one_shard(dataset, a, b, u, options)
            for (a, b), u in zip(spans, urls, strict=True)
        ]
    else:
        # One future for the whole dataset (a list given alone scatters its elements).
        ds_future = client.scatter([dataset], broadcast=False)[0]
        futures = [
            client.submit(
                write_one_shard, ds_future, a, b, u, options, key=f"write_one_shard-{u}", pure=False
            )
            for (a, b), u in zip(spans, urls, strict=True)
        ]
        results = client.gather(futures)
    written = sum(1 for _, _, w in results if w)
    logger.info(
        "write_shards: %d shards written, %d already complete", written, len(results) - written
    )
    fields = None
    if not isinstance(dataset, ImageList) and n:
        fields = tuple(ext for ext in dataset[0] if not ext.startswith("__"))
    return TarShards(
        urls, counts=[c for _, c, _ in results], fields=fields, storage_options=options
    )
