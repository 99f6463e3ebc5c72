"""The table path: a DataFrame partition or an Array block in, the model's outputs out.

A partition's feature columns become one float32 array (pandas' own conversion, no row
loop), batches are views of it (``torch.from_numpy``), and the outputs fill one array
allocated for the partition. A row whose features are not all finite numbers is bad
input: an error naming its index key, or with ``on_error="skip"`` left out of a
DataFrame's result (an Array's row gets NaN outputs: its chunks are fixed) and counted
(:func:`dask_ddp.predict.skipped`).
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from dask_ddp.predict import model as cache
from dask_ddp.predict.forward import forward
from dask_ddp.predict.heap import warm_heap
from dask_ddp.predict.outputs import Layout
from dask_ddp.predict.skips import record_skipped

__all__ = ["TableOptions", "predict_block", "predict_frame"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TableOptions:
    """A table ``predict`` call's options, one record for every partition's task."""

    call: str  # names the call (its skip counts)
    columns: tuple[Any, ...] | None
    batch_size: int
    on_error: str
    layout: Layout


def batches(x: np.ndarray, batch_size: int) -> Iterator[tuple[int, torch.Tensor]]:
    """Views of ``x``, ``batch_size`` rows each (a read-only ``x``, as pandas' copy-on-write
    hands out, is read, never written: torch's warning about it is silenced)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The given NumPy array is not writable")
        whole = torch.from_numpy(x)
    for start in range(0, len(x), batch_size):
        yield start, whole[start:start + batch_size]


def _plain(value: Any) -> Any:
    """A numpy scalar as its Python value (for messages)."""
    return value.item() if isinstance(value, np.generic) else value


def _features(part: Any, columns: Sequence[Any] | None) -> Any:
    import pandas as pd

    if isinstance(part, pd.Series):
        return part.to_frame()
    return part if columns is None else part[list(columns)]


def _bad_rows(frame: Any) -> tuple[np.ndarray, str]:
    """A mask of the rows holding a feature that is not a finite number, and the first
    such value described (its column and value)."""
    import pandas as pd

    bad = np.zeros(len(frame), dtype=bool)
    first = ""
    for c in frame.columns:
        values = pd.to_numeric(frame[c], errors="coerce").to_numpy(dtype=np.float64,
                                                                  na_value=np.nan)
        wrong = ~np.isfinite(values)
        if wrong.any() and not first:
            i = int(np.argmax(wrong))
            first = f"column {c!r} is {_plain(frame[c].iloc[i])!r}"
        bad |= wrong
    return bad, first


def _as_float(frame: Any) -> np.ndarray | None:
    try:
        x = frame.to_numpy(dtype=np.float32, na_value=np.nan)
    except (TypeError, ValueError):
        return None
    return x if np.isfinite(x).all() else None


def predict_frame(part: Any, spec: cache.ModelSpec, opts: TableOptions,
                  partition_info: dict[str, Any] | None = None) -> Any:
    """One DataFrame (or Series) partition's outputs, as a DataFrame with its index."""
    number = (partition_info or {}).get("number", -1)
    frame = _features(part, opts.columns)
    x = _as_float(frame)
    index = part.index
    if x is None:
        bad, first = _bad_rows(frame)
        key = _plain(index[int(np.argmax(bad))])
        if opts.on_error == "raise":
            raise ValueError(f"predict: row {key!r} (partition {number}): {first}, not a "
                             "finite number (on_error='skip' leaves such rows out)")
        record_skipped(opts.call, number, int(bad.sum()), key)
        frame, index = frame[~bad], index[~bad]
        x = frame.to_numpy(dtype=np.float32)
    model, device = cache.model_for(spec)
    with cache.torch_threads(cache.thread_share(spec)), warm_heap():
        out = forward(model, device, batches(x, opts.batch_size), len(x), opts.layout,
                      lambda s: f"row {_plain(index[s])!r} of partition {number}", spec)
    return opts.layout.frame(out, index)


def predict_block(block: np.ndarray, spec: cache.ModelSpec, opts: TableOptions,
                  block_info: dict[Any, Any] | None = None) -> np.ndarray:
    """One Array block's outputs: ``[rows, *output shape]``."""
    where = (block_info or {}).get(0, {})
    number = where.get("chunk-location", (-1,))[0]
    offset = where.get("array-location", [(0, 0)])[0][0]
    x = np.ascontiguousarray(block, dtype=np.float32)
    if x.ndim == 1:
        x = x.reshape(-1, 1)
    bad = ~np.isfinite(x.reshape(len(x), -1)).all(axis=1)
    if bad.any():
        row = offset + int(np.argmax(bad))
        if opts.on_error == "raise":
            raise ValueError(f"predict: row {row} (block {number}) is not all finite numbers "
                             "(on_error='skip' gives NaN outputs for such rows)")
        record_skipped(opts.call, number, int(bad.sum()), row)
        x = x.copy()
        x[bad] = 0
    model, device = cache.model_for(spec)
    with cache.torch_threads(cache.thread_share(spec)), warm_heap():
        out = forward(model, device, batches(x, opts.batch_size), len(x), opts.layout,
                      lambda s: f"row {offset + s} of block {number}", spec)
    if bad.any():
        out[bad] = np.nan
    return out
