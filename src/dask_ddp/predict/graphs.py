"""The lazy collections ``predict`` returns: one task per input partition, each depending on
the one key that holds the model's :class:`~dask_ddp.predict.model.ModelSpec`."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from dask_ddp.predict.model import ModelSpec
from dask_ddp.predict.outputs import Layout

__all__ = ["predict_array", "predict_dataset", "predict_frame"]

LayoutOf = Callable[[Sequence[int], torch.dtype], Layout]


def _model_key(spec: ModelSpec) -> Any:
    """The spec as one key of the graph (every partition's task depends on it)."""
    from dask import delayed

    return delayed(spec, pure=True, name=f"predict-{spec.token}")


def _call(spec: ModelSpec, data_name: str, *options: Any) -> str:
    from dask.base import tokenize

    return f"predict-{tokenize(spec.token, data_name, *options)}"


def predict_frame(spec: ModelSpec, ddf: Any, columns: Sequence[Any] | None, batch_size: int,
                  on_error: str, layout_of: LayoutOf) -> tuple[Any, str]:
    import pandas as pd

    from dask_ddp.predict.tables import TableOptions
    from dask_ddp.predict.tables import predict_frame as run

    meta = ddf._meta  # noqa: SLF001 (dask.dataframe's empty frame of the schema (its documented meta))
    features = meta.to_frame() if isinstance(meta, pd.Series) else meta
    if columns is not None:
        missing = [c for c in columns if c not in features.columns]
        if missing:
            raise KeyError(f"predict: columns {missing} are not in the DataFrame (it has "
                           f"{list(features.columns)})")
        features = features[list(columns)]
    bad = [f"{c!r} ({t})" for c, t in features.dtypes.items()
           if not pd.api.types.is_numeric_dtype(t) and not pd.api.types.is_object_dtype(t)]
    if bad:
        raise TypeError(f"predict: columns {', '.join(bad)} are not numeric; pick the "
                        "features with columns=[...]")
    layout = layout_of((features.shape[1],), torch.float32)
    call = _call(spec, ddf._name, columns, batch_size, on_error, layout)  # noqa: SLF001 (a dask collection's key name: dask's own token of its graph)
    opts = TableOptions(call, None if columns is None else tuple(columns), batch_size, on_error,
                        layout)
    empty = layout.empty(0)
    out_meta = pd.DataFrame(layout.columns(empty), index=meta.index[:0])
    result = ddf.map_partitions(run, _model_key(spec), opts, meta=out_meta,
                                enforce_metadata=False, align_dataframes=False)
    return result, call


def predict_array(spec: ModelSpec, arr: Any, batch_size: int, on_error: str,
                  layout_of: LayoutOf) -> tuple[Any, str]:
    import dask.array as da

    from dask_ddp.predict.tables import TableOptions, predict_block

    if arr.ndim == 0:
        raise ValueError("predict: a 0-d Array has no samples")
    if arr.ndim > 1 and any(len(c) > 1 for c in arr.chunks[1:]):
        arr = arr.rechunk({i: -1 for i in range(1, arr.ndim)})  # a row is one block
    sample = tuple(arr.shape[1:]) or (1,)
    layout = layout_of(sample, torch.float32)
    if on_error == "skip" and layout.dtype.kind not in "fc":
        raise ValueError(f"predict: on_error='skip' on an Array fills bad rows with NaN, "
                         f"which the model's {layout.dtype} output cannot hold")
    call = _call(spec, arr.name, batch_size, on_error, layout)
    opts = TableOptions(call, None, batch_size, on_error, layout)
    chunks = (arr.chunks[0], *((d,) for d in layout.shape))
    rest = list(range(1, arr.ndim))
    extra = list(range(1, 1 + len(layout.shape)))
    result = da.map_blocks(
        predict_block, arr, _model_key(spec), opts, dtype=layout.dtype, chunks=chunks,
        drop_axis=rest or None, new_axis=extra or None,
        meta=np.empty((0,) * (1 + len(layout.shape)), dtype=layout.dtype),
        name=call)
    return result, call


def predict_dataset(spec: ModelSpec, data: Any, transform: Any, batch_size: int,
                    partition_size: int, on_error: str, layout_of: LayoutOf) -> tuple[Any, str]:
    import dask.dataframe as dd
    import pandas as pd
    from dask import delayed

    from dask_ddp.data.datasets import ImageFolder
    from dask_ddp.predict.images import (
        ImageOptions,
        ListPart,
        image_parts,
        predict_images,
        sample_input,
        transform_ops,
    )

    if isinstance(data, (str, os.PathLike)):
        data = ImageFolder(data)
    ops = transform_ops(data, transform)
    layout = layout_of(*sample_input(ops))
    parts = image_parts(data, partition_size)
    where = [(p.root, p.keys, p.start) if isinstance(p, ListPart) else (p.shards.urls, p.start)
             for p in parts]
    call = _call(spec, "images", where, ops, batch_size, on_error, layout)
    opts = ImageOptions(call, ops, batch_size, on_error, layout)
    model = _model_key(spec)
    task = delayed(predict_images, pure=True)
    tasks = [task(p, model, opts, i, dask_key_name=(call, i)) for i, p in enumerate(parts)]
    sizes = [len(p.keys) if isinstance(p, ListPart) else p.shards.counts[0] for p in parts]
    divisions: tuple[int, ...] | None = (
        *(p.start for p in parts), parts[-1].start + max(sizes[-1], 1) - 1)
    empty = layout.empty(0)
    meta = pd.DataFrame({"key": pd.Series([], dtype=object),
                         "label": pd.Series([], dtype=np.int64), **layout.columns(empty)},
                        index=pd.Index([], dtype=np.int64))
    if any(s == 0 for s in sizes):
        divisions = None  # an empty shard: positions repeat across partition bounds
    return dd.from_delayed(tasks, meta=meta, divisions=divisions, verify_meta=False), call
