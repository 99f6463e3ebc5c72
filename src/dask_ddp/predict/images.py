"""The image path: each partition's images read, decoded and transformed by the C++ engine.

An :class:`~dask_ddp.data.ImageList` (or ``ImageFolder``, ``S3ImageFolder``, a torch
``Subset`` of one) is cut into runs of ``partition_size`` samples; a
:class:`~dask_ddp.data.TarShards` gives one partition per shard. A partition's task
runs the engine's loader over its samples in order (``shuffle=False``, decode threads
sized like torch's) and the model over each batch as it arrives, so a partition holds at
most the loader's ``prefetch`` batches decoded at once, never all its images. The
partitions of an image list that one worker thread runs share one engine, handed each
partition's keys (:mod:`.engines`); a shard's partition builds its own.

For an image list the engine is handed each sample's position in the partition as its
label, so the batches it returns say which samples they hold, also when ``on_error="skip"``
left some out. Tar shards name a sample ``<shard URL>#<n>``, its ``n``-th sample in the
shard (counted among the readable ones when samples are skipped).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Generator, Sequence
from typing import Any

import numpy as np
import torch

from dask_ddp import storage
from dask_ddp.data.device import DeviceStage, decode_share
from dask_ddp.data.engine import ImageSource, resolve_dataset, sample_layout
from dask_ddp.data.loader import Loader
from dask_ddp.data.loader_type import Kind, kind_of
from dask_ddp.data.shards import TarShards
from dask_ddp.data.sources import pipeline
from dask_ddp.predict import model as cache
from dask_ddp.predict.engines import EngineKey, engine_for
from dask_ddp.predict.forward import forward
from dask_ddp.predict.heap import warm_heap
from dask_ddp.predict.outputs import Layout
from dask_ddp.predict.skips import record_skipped

__all__ = ["ImageOptions", "image_parts", "predict_images", "sample_input"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ImageOptions:
    """An image ``predict`` call's options, one record for every partition's task."""

    call: str
    ops: tuple[Any, ...]
    batch_size: int
    on_error: str
    layout: Layout
    prefetch: int = 2
    max_side: int = 1 << 14


@dataclasses.dataclass(frozen=True)
class ListPart:
    """A run of an image list: the keys under its root, their labels, the first position."""

    root: str
    anon: bool
    storage_options: tuple[tuple[str, Any], ...]
    prefix: str  # a sample's path or URL is prefix + key
    keys: tuple[str, ...]
    targets: tuple[int, ...]
    start: int
    skip_missing: bool


@dataclasses.dataclass(frozen=True)
class ShardPart:
    """One tar shard of a TarShards and its first sample's position in the dataset."""

    shards: TarShards
    start: int


def image_parts(dataset: Any, partition_size: int) -> list[ListPart | ShardPart]:
    """The partitions of an image dataset, in its order."""
    if kind_of(dataset) is Kind.SHARDS:
        counts, urls = dataset.counts, dataset.urls
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()
        return [ShardPart(_one_shard(dataset, url, c), s)
                for url, c, s in zip(urls, counts, starts, strict=True)]
    folder, _ = resolve_dataset(dataset)
    source = ImageSource.of(dataset)
    keys, targets = source.keys, source.labels
    sample0 = folder.samples[0][0]
    prefix = sample0[: len(sample0) - len(folder.keys[0])]
    options = tuple(sorted(folder.storage_options.items()))
    return [ListPart(folder.url, folder.anon, options, prefix,
                     tuple(keys[s:s + partition_size]), tuple(targets[s:s + partition_size]),
                     s, source.skip_missing)
            for s in range(0, len(keys), partition_size)]


def _one_shard(dataset: TarShards, url: str, count: int) -> TarShards:
    # Its store is reopened in the worker's process (a TarShards pickles without it).
    return TarShards([url], transform=dataset.transform,
                     label_field=dataset.label_field or None, fields=dataset.fields,
                     counts=[count], shuffle_buffer=0, range_bytes=dataset.range_bytes,
                     anon=dataset.anon, storage_options=dataset.storage_options)


def sample_input(ops: Sequence[Any]) -> tuple[tuple[int, ...], torch.dtype]:
    """The shape and dtype of one sample the engine makes with ``ops``."""
    return sample_layout(list(ops))


_stores_lock = threading.Lock()
_stores: dict[tuple[str, bool, str], storage.Store] = {}


def _store_key(part: ListPart) -> tuple[str, bool, str]:
    return part.root, part.anon, repr(part.storage_options)


def _store(part: ListPart) -> storage.Store:
    """The part's store, opened once per worker process and root."""
    key = _store_key(part)
    with _stores_lock:
        store = _stores.get(key)
        if store is None:
            store = storage.open(part.root, anon=part.anon, **dict(part.storage_options))
            _stores[key] = store
        return store


def _list_batches(part: ListPart, opts: ImageOptions, threads: int, device: torch.device,
                  channels_last: bool,
                  taken: list[torch.Tensor]) -> Generator[tuple[int, torch.Tensor]]:
    """A list part's image batches, on ``device`` through the device stage (on a GPU:
    uint8 over the bus, the float tail there, written in ``channels_last`` if asked, the
    copy on a stream of its own), read by this thread's engine (:mod:`.engines`)."""
    n = len(part.keys)
    source = ImageSource(_store(part), part.keys, range(n), part.skip_missing)
    skip = opts.on_error == "skip"
    key = EngineKey(_store_key(part), opts.ops, opts.batch_size, threads, opts.prefetch, skip,
                    part.skip_missing, opts.max_side, str(device), channels_last)

    def make() -> tuple[DeviceStage, Any]:
        stage = DeviceStage(device, channels_last=channels_last, ops=opts.ops,
                            buffers=opts.prefetch + 2)
        return stage, stage.reader(lambda ops: source.loader(
            ops, batch_size=opts.batch_size, shuffle=False, rank=0, world_size=1,
            drop_last=False, num_threads=threads, prefetch=opts.prefetch + stage.holds,
            skip_errors=skip, max_side=opts.max_side))

    with engine_for(key, source, make) as cached:
        engine = cached.engine

        def host() -> Generator[tuple[torch.Tensor]]:
            engine.start_epoch(0, 0)
            while (item := engine.next()) is not None:
                taken.append(item[1].clone())  # each sample's position in the part
                yield (item[0],)

        with cached.stage.over(host()) as moved:
            done = 0
            for (images,) in moved:
                yield done, images
                done += len(images)


def _shard_batches(part: ShardPart, opts: ImageOptions, threads: int, device: torch.device,
                   channels_last: bool,
                   taken: list[torch.Tensor]) -> Generator[tuple[int, torch.Tensor]]:
    loader = Loader(part.shards, opts.batch_size, shuffle=False, rank=0, world_size=1,
                    num_threads=threads, prefetch=opts.prefetch, on_error=opts.on_error,
                    pin_memory=False, max_side=opts.max_side, device=device,
                    channels_last=channels_last)
    image_at = part.shards.image_field or 0
    try:
        done = 0
        for batch in loader:
            images = batch[image_at]
            labels = batch[1] if part.shards.fields is None else torch.full((len(images),), -1)
            taken.append(labels.clone())  # on the GPU with the batch: read at the end
            yield done, images
            done += len(images)
    finally:
        loader.close()


def predict_images(part: ListPart | ShardPart, spec: cache.ModelSpec, opts: ImageOptions,
                   number: int) -> Any:
    """One partition's rows: ``key`` (the sample's path or URL), ``label`` and the outputs,
    indexed by the samples' positions in the dataset."""
    import pandas as pd

    model, device = cache.model_for(spec)
    threads = cache.thread_share(spec)
    decode = decode_share(threads, device.type == "cuda")
    taken: list[torch.Tensor] = []
    if isinstance(part, ListPart):
        n, first = len(part.keys), part.prefix + part.keys[0]
        batches = _list_batches(part, opts, decode, device, spec.channels_last, taken)
    else:
        n, first = part.shards.counts[0], part.shards.urls[0]
        batches = _shard_batches(part, opts, decode, device, spec.channels_last, taken)
    # Closed on a raise too: the traceback Dask keeps with a failed task's error holds this
    # frame, and a suspended generator would hold its engine (decode threads, pinned
    # buffers and their budget) as long as the error is kept.
    with contextlib.closing(batches), cache.torch_threads(threads), warm_heap():
        out = forward(model, device, batches, n, opts.layout,
                      lambda s: f"partition {number} ({first}, batch at sample {s})", spec)
    # One read of the batches' ids, after the forward's last output came back (no wait per
    # batch for ids that stayed on the GPU with their batch).
    got = torch.cat(taken).cpu().numpy() if taken else np.empty(0, np.int64)
    out = out[:len(got)]
    if isinstance(part, ListPart):
        keys = [part.prefix + part.keys[i] for i in got]
        labels = np.asarray(part.targets, dtype=np.int64)[got]
        positions = part.start + got
    else:
        keys = [f"{first}#{i}" for i in range(len(got))]
        labels, positions = got.astype(np.int64), part.start + np.arange(len(got))
    if len(got) < n:
        record_skipped(opts.call, number, n - len(got), first)
    frame = {"key": pd.array(keys, dtype=object), "label": labels, **opts.layout.columns(out)}
    return pd.DataFrame(frame, index=pd.Index(positions, dtype=np.int64))


def transform_ops(dataset: Any, transform: Any) -> tuple[Any, ...]:
    """The engine ops of ``transform``, else of the dataset's own transform, as a Loader
    over ``dataset`` takes them (``ValueError`` naming ``predict`` for none)."""
    return tuple(pipeline(dataset, transform, who="predict on images")[1])
