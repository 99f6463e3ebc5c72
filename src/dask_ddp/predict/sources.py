"""The Source path: ``predict`` over any :class:`~dask_ddp.data.Source`, read by a Loader.

The Source's ids (its order for one rank, unshuffled) are cut into runs of
``partition_size``; a partition's task reads its run with a Loader of its own (the ids
dealt to it, as live recovery deals a lost rank's, in their order) through the device
stage, and feeds each batch's item at the Source's ``image_at`` (else the first) to the
model. The result is a Dask DataFrame of the outputs indexed by the samples' ids.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Generator, Sequence
from typing import Any, cast

import numpy as np
import torch

from dask_ddp.data.loader import Loader
from dask_ddp.data.sources import Source
from dask_ddp.predict import model as cache
from dask_ddp.predict.forward import forward
from dask_ddp.predict.outputs import Layout

__all__ = ["SourceOptions", "predict_part", "predict_source"]


@dataclasses.dataclass(frozen=True)
class SourceOptions:
    """A Source ``predict`` call's options, one record for every partition's task."""

    batch_size: int
    layout: Layout


def _first_look(source: Source) -> tuple[list[int], torch.Tensor]:
    """The Source's ids in order (rank 0 of 1, unshuffled) and its first sample's input.

    Raises
    ------
    ValueError
        The Source has no samples.
    """
    loader = Loader(cast(Any, source), 1, shuffle=False, rank=0, world_size=1, num_threads=1)
    try:
        ids = [int(i) for i in loader.lost_samples(0, 0, [0])]
        if not ids:
            raise ValueError(f"predict: the {type(source).__name__} (a Source) has no samples")
        first = next(iter(loader))
    finally:
        loader.close()
    return ids, torch.as_tensor(first[source.image_at or 0])


def predict_source(spec: cache.ModelSpec, source: Source, batch_size: int,
                   partition_size: int,
                   layout_of: Callable[[Sequence[int], torch.dtype], Layout]
                   ) -> tuple[Any, str]:
    """The lazy DataFrame of the model's outputs over ``source`` and the call's name."""
    import dask.dataframe as dd
    import pandas as pd
    from dask import delayed
    from dask.base import tokenize

    ids, sample = _first_look(source)
    layout = layout_of(tuple(sample.shape[1:]), sample.dtype)
    parts = [ids[s:s + partition_size] for s in range(0, len(ids), partition_size)]
    call = f"predict-{tokenize(spec.token, source, parts, batch_size, layout)}"
    opts = SourceOptions(batch_size, layout)
    model = delayed(spec, pure=True, name=f"predict-{spec.token}")
    data = delayed(source, pure=True, name=f"source-{tokenize(source)}")
    task = delayed(predict_part, pure=True)
    tasks = [task(p, data, model, opts, i, dask_key_name=(call, i))
             for i, p in enumerate(parts)]
    meta = pd.DataFrame(layout.columns(layout.empty(0)), index=pd.Index([], dtype=np.int64))
    return dd.from_delayed(tasks, meta=meta, verify_meta=False), call


def predict_part(ids: list[int], source: Source, spec: cache.ModelSpec,
                 opts: SourceOptions, number: int) -> Any:
    """One partition's outputs, indexed by its samples' ids."""
    import pandas as pd

    model, device = cache.model_for(spec)
    threads = cache.thread_share(spec)
    loader = Loader(cast(Any, source), opts.batch_size, shuffle=False, rank=0, world_size=1,
                    num_threads=threads, device=device, channels_last=spec.channels_last)
    loader.resume_unread(0, ids, 0, 1)  # exactly these ids, in their order
    at = source.image_at or 0

    def batches() -> Generator[tuple[int, torch.Tensor]]:
        done = 0
        for batch in loader:
            yield done, batch[at]
            done += len(batch[at])

    # Closed on a raise too (a traceback Dask keeps would hold the Loader otherwise).
    with contextlib.closing(batches()) as inputs, contextlib.closing(loader), \
            cache.torch_threads(threads):
        out = forward(model, device, inputs, len(ids), opts.layout,
                      lambda s: f"partition {number} (id {ids[s]})", spec)
    return pd.DataFrame(opts.layout.columns(out), index=pd.Index(ids, dtype=np.int64))
