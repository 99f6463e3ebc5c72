"""The model's outputs: their per-sample shape and dtype (known before anything runs, so
the result's ``meta`` and chunks are right) and the output columns. The batched forward is
:mod:`dask_ddp.predict.forward`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from dask_ddp.predict.precision import output_dtype as precision_output

__all__ = ["OUTPUTS", "Layout", "probe"]

#: How a DataFrame holds a sample's output vector: separate columns or one list column.
OUTPUTS = ("columns", "list")


@dataclasses.dataclass(frozen=True)
class Layout:
    """One sample's output: its shape and numpy dtype, and how a DataFrame names it."""

    shape: tuple[int, ...]
    dtype: np.dtype
    name: str = "out"
    output: str = "columns"

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def column_names(self) -> list[str]:
        if not self.shape or self.output == "list":
            return [self.name]
        return [f"{self.name}_{i}" for i in range(self.size)]

    def empty(self, n: int) -> np.ndarray:
        return np.empty((n, *self.shape), dtype=self.dtype)

    def columns(self, out: np.ndarray) -> dict[str, Any]:
        """``out`` (``[n, *shape]``) as DataFrame columns."""
        if not self.shape:
            return {self.name: out}
        flat = out.reshape(len(out), self.size)
        if self.output == "columns":
            return {c: flat[:, i] for i, c in enumerate(self.column_names())}
        import pandas as pd
        import pyarrow as pa

        values = pa.array(np.ascontiguousarray(flat).reshape(-1))
        column = pa.FixedSizeListArray.from_arrays(values, self.size)
        return {self.name: pd.arrays.ArrowExtensionArray(column)}

    def frame(self, out: np.ndarray, index: Any) -> Any:
        """``out`` (``[n, *shape]``, owned by the caller) as a DataFrame with ``index``.

        Separate columns are views of ``out`` as one 2-d block: a dict of its column
        slices would be copied into a new block.
        """
        import pandas as pd

        if self.shape and self.output == "columns":
            return pd.DataFrame(out.reshape(len(out), self.size), index=index,
                                columns=self.column_names(), copy=False)
        return pd.DataFrame(self.columns(out), index=index)


def numpy_dtype(t: torch.dtype) -> np.dtype:
    """The numpy dtype of torch's ``t``."""
    return torch.empty((), dtype=t, device="cpu").numpy().dtype


def probe(model: Callable[[torch.Tensor], Any], sample: Sequence[int], dtype: torch.dtype, *,
          name: str, output: str, device: torch.device | str = "cpu") -> Layout:
    """The layout of ``model``'s output for one zero sample of shape ``sample`` on ``device``
    (``"meta"``: shapes only, nothing computed), in inference mode: what every partition
    will produce (a reduced-precision float output as float32, as ``predict`` returns it)."""
    if isinstance(model, nn.Module):
        model = model.eval()
    with torch.inference_mode():
        y = model(torch.zeros((1, *sample), dtype=dtype, device=device))
    if not isinstance(y, torch.Tensor) or y.ndim == 0 or y.shape[0] != 1:
        shown = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        raise TypeError(f"predict: the model must return a tensor [batch, ...]; for a batch "
                        f"of 1 it returned {shown}")
    return Layout(tuple(int(d) for d in y.shape[1:]), numpy_dtype(precision_output(y.dtype)),
                  name, output)
