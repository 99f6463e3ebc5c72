"""What a table's batch holds (internal): its tensors, the columns read for them, the
engine's window that gathers them, and the batch handed to the training loop."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from dask_ddp import _core
from dask_ddp.data.table.columns import Column, record_layout

if TYPE_CHECKING:
    from dask_ddp.data.table.table import Table

__all__ = ["BatchLayout"]

_DLPACK_CODE = {"i": 0, "u": 1, "f": 2, "b": 6}


class BatchLayout:
    """The outputs of a batch (one tensor each) and the columns read for them.

    Without ``features`` and ``label``, a batch is a dict of every column's tensor. With
    them, it is ``x`` or ``(x, y)``: the features stacked into one tensor in C++ when they
    share a dtype, else concatenated after a type promotion.

    Raises
    ------
    KeyError
        ``features`` or ``label`` names no column of the table.
    ValueError
        ``features`` is empty.
    """

    def __init__(self, table: Table, features: Sequence[str] | None, label: str | None
                 ) -> None:
        self.as_tuple = features is not None or label is not None
        self.outputs, self.columns = self._outputs(table, features, label)
        self._specs = [self._spec(out) for out in self.outputs]
        xs = sum(o["name"] == "x" for o in self.outputs)
        #: How the engine hands out a batch: "dict", "x", "xy", or "list" (features of
        #: several dtypes, concatenated here by :meth:`assemble`).
        self.form = "dict" if not self.as_tuple else "list" if xs > 1 else \
            "xy" if self.outputs[-1]["name"] == "y" else "x"

    @staticmethod
    def _outputs(t: Table, features: Sequence[str] | None, label: str | None
                 ) -> tuple[list[dict[str, Any]], list[Column]]:
        """The outputs (one tensor each) and the columns read."""
        if features is None and label is None:
            cols = [t.column(n) for n in t.columns]
            return [{"name": c.name, "columns": [c]} for c in cols], cols
        if features is None:
            features = [n for n in t.columns if n != label]
        feats = [t.column(n) for n in features]
        if not feats:
            raise ValueError("features is empty")
        outs: list[dict[str, Any]] = []
        if len({c.dtype for c in feats}) == 1:
            outs.append({"name": "x", "columns": feats})  # stacked in C++
        else:
            outs.extend({"name": "x", "columns": [c], "part": True} for c in feats)
        cols = list(feats)
        if label is not None:
            lab = t.column(label)
            outs.append({"name": "y", "columns": [lab]})
            if lab not in cols:
                cols.append(lab)
        return outs, cols

    def window(self, segments: list[np.ndarray], names: list[str], nrows: list[int]) -> Any:
        """The engine's window over segments of records (:attr:`columns` side by side)."""
        src_offsets, record = record_layout(self.columns)
        where = {c.name: off for c, off in zip(self.columns, src_offsets, strict=True)}
        bufs = [seg.reshape(-1) for seg in segments]
        specs: list[list[Any]] = []
        for o, out in enumerate(self.outputs):
            offset = 0
            for c in out["columns"]:
                last = specs[-1] if specs else None
                if last is not None and last[4] == o and last[3] + last[1] == where[c.name]:
                    last[1] += c.row_bytes  # adjacent in the record and the output: one copy
                    last[0] += f"+{c.name}"
                else:
                    specs.append([c.name, c.row_bytes, record, where[c.name], o, offset, bufs])
                offset += c.row_bytes
        return _core.TableWindow([tuple(x) for x in specs], names, nrows, self._specs)

    @staticmethod
    def _spec(out: dict[str, Any]) -> tuple[int, int, list[int], int]:
        """The engine's description of an output: DLPack type code, bits, row shape,
        row bytes."""
        c0 = out["columns"][0]
        dt = np.dtype(c0.dtype)
        # One column keeps its row shape; stacked columns make one row of their widths.
        width = sum(int(np.prod(c.shape)) for c in out["columns"])
        tail = list(c0.shape) if len(out["columns"]) == 1 else [width]
        return (_DLPACK_CODE[dt.kind], dt.itemsize * 8, tail,
                sum(c.row_bytes for c in out["columns"]))

    def stream(self, pool: Any, batch_size: int, prefetch: int, ahead: bool = True) -> Any:
        """The engine's stream of an epoch's batches (:class:`dask_ddp._core.TableBatches`,
        one window queued beyond the one being gathered), gathered ``prefetch`` batches
        ahead on its own thread, or with ``ahead=False`` by each ``next()`` in the
        calling thread."""
        return _core.TableBatches(pool, self._specs, [o["name"] for o in self.outputs],
                                  self.form, batch_size, prefetch, 1, ahead)

    def batch(self, item: Any) -> Any:
        """The training loop's batch of what the stream handed out."""
        return self.assemble(item) if self.form == "list" else item

    def assemble(self, tensors: list[torch.Tensor]) -> Any:
        """The batch of the gathered tensors (one per output)."""
        if not self.as_tuple:
            return {o["name"]: t for o, t in zip(self.outputs, tensors, strict=True)}
        xs = [t for o, t in zip(self.outputs, tensors, strict=True) if o["name"] == "x"]
        if len(xs) == 1:
            x = xs[0]
        else:
            dtype = xs[0].dtype
            for t in xs[1:]:
                dtype = torch.promote_types(dtype, t.dtype)
            x = torch.cat([t.reshape(len(t), -1).to(dtype) for t in xs], 1)
        if self.outputs[-1]["name"] != "y":
            return x
        return x, tensors[-1]
