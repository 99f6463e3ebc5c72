"""``dask_ddp.predict``: a model's outputs over a Dask collection or an image dataset, lazily."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from dask_ddp.predict.model import ModelSpec
from dask_ddp.predict.outputs import OUTPUTS, Layout
from dask_ddp.predict.precision import check_precision
from dask_ddp.predict.skips import remember_call

__all__ = ["predict"]

logger = logging.getLogger(__name__)

_ON_ERROR = ("raise", "skip")


def _host_threads() -> dict[str, int]:
    """Each host's Dask worker threads, from the current client (empty without one)."""
    try:
        from distributed import default_client

        from dask_ddp._cluster import cluster_info

        workers = cluster_info(default_client())["workers"]
    except (ImportError, ValueError, RuntimeError):
        return {}
    from distributed.comm.addressing import get_address_host

    hosts: dict[str, int] = {}
    for address, info in workers.items():
        host = get_address_host(address)
        hosts[host] = hosts.get(host, 0) + int(info.get("nthreads", 1))
    return hosts


def _spec(model: nn.Module | Callable[[], nn.Module], checkpoint: str | os.PathLike[str] | None,
          step: int | None, device: str | None, threads: int | None, precision: str,
          tf32: bool | None, channels_last: bool) -> ModelSpec:
    import cloudpickle
    from dask.base import tokenize

    if not isinstance(model, nn.Module) and not callable(model):
        raise TypeError(f"predict: model must be a torch.nn.Module or a function building one, "
                        f"not {type(model).__name__}")
    if threads is not None and threads < 1:
        raise ValueError(f"predict: threads must be >= 1, got {threads}")
    check_precision(precision)
    if tf32 not in (None, True, False):
        raise ValueError(f"predict: tf32 must be None, True or False, got {tf32!r}")
    if device is not None:
        torch.device(device)  # a malformed device string fails here, not in every task
    payload = cloudpickle.dumps(model)
    url = None if checkpoint is None else os.fspath(checkpoint)
    model_key = f"model-{tokenize(payload, url, step)}"
    token = f"model-{tokenize(model_key, device, precision, tf32, bool(channels_last))}"
    return ModelSpec(token, payload, url, step, device, threads, _host_threads(), model_key,
                     precision, tf32, bool(channels_last))


def _layout(model: nn.Module | Callable[[], nn.Module], spec: ModelSpec, sample: Sequence[int],
            dtype: torch.dtype, name: str, output: str, output_shape: Sequence[int] | None,
            output_dtype: Any) -> Layout:
    import numpy as np

    from dask_ddp.predict.shapes import find_layout

    if output_shape is not None and output_dtype is not None:
        return Layout(tuple(int(d) for d in output_shape), np.dtype(output_dtype), name, output)
    return find_layout(model, spec, sample, dtype, name=name, output=output)


def predict(
    model: nn.Module | Callable[[], nn.Module],
    data: Any,
    *,
    batch_size: int = 1024,
    columns: Sequence[Any] | None = None,
    checkpoint: str | os.PathLike[str] | None = None,
    checkpoint_step: int | None = None,
    on_error: str = "raise",
    output: str = "columns",
    name: str = "out",
    output_shape: Sequence[int] | None = None,
    output_dtype: Any = None,
    transform: Any = None,
    partition_size: int = 1024,
    device: str | None = None,
    threads: int | None = None,
    precision: str = "fp32",
    tf32: bool | None = None,
    channels_last: bool = False,
) -> Any:
    """A model's outputs over ``data``: a lazy Dask collection, one partition per input's.

    Parameters
    ----------
    model
        A ``torch.nn.Module``, or a function of no arguments building one (the cheap
        thing to ship: the module is then built on each worker). It is pickled once here,
        reaches each worker process once (one key of the graph that every partition
        depends on) and is built there once, cached across partitions and calls.
    data
        - a Dask DataFrame or Series: the model's input is a float32 ``[batch, n]`` of its
          columns (all, or ``columns``); the result is a Dask DataFrame with the same
          partitions and index;
        - a Dask Array ``[samples, ...]``: the input is float32 ``[batch, ...]`` of its
          rows; the result is a Dask Array ``[samples, *output]`` with the same row chunks;
        - an image dataset (:class:`~dask_ddp.data.ImageList`, ``ImageFolder``,
          ``S3ImageFolder``, a ``Subset`` of one, :class:`~dask_ddp.data.TarShards`) or a
          folder URL (an ``ImageFolder``, local or ``s3://``): images decoded and
          transformed by the C++ engine; the result is a Dask DataFrame with one row per
          sample (``key``: its path or URL, ``label``, the outputs), indexed by its
          position in the dataset, a partition per ``partition_size`` samples or per shard;
        - a :class:`~dask_ddp.data.Source` (a data kind of its own): the input is the
          item at its ``image_at`` (else the first) of each batch it reads; the result is
          a Dask DataFrame of the outputs indexed by the samples' ids, a partition per
          ``partition_size`` of them.
    batch_size
        Samples per forward call.
    columns
        DataFrame: the feature columns, in the model's order (default: all).
    checkpoint
        The weights: a job's checkpoint storage (``storage=`` of ``submit``: the newest
        complete full or sharded checkpoint, or ``checkpoint_step``'s; a
        :class:`~dask_ddp.Checkpointer`'s training state gives its ``"model"``), or a
        state dict's URL (``.pt``, ``.pth``, ``.bin``, ``.ckpt``). Read with
        ``torch.load(weights_only=True)``, once per worker process.
    checkpoint_step
        The checkpoint step to load (default: the newest).
    on_error
        ``"raise"``: a bad row (a feature that is not a finite number) or image (missing,
        corrupt, not JPEG/PNG) fails its partition with an error naming its key.
        ``"skip"``: left out (an Array's row gets NaN outputs instead) and counted:
        :func:`dask_ddp.predict.skipped` after computing, and a warning in the worker's log.
    output
        How a DataFrame holds a sample's output of more than one value: ``"columns"``
        (``out_0``, ``out_1``...; a scalar output is one column ``out``) or ``"list"``
        (one fixed-size list column, ``pd.ArrowDtype``; Parquet stores it as a list).
    name
        The output columns' name (prefix).
    output_shape, output_dtype
        One sample's output shape and dtype (pass both to skip finding them). Default:
        found without building the model in this process: a module whose tensors are on
        the CPU runs on one zero sample there (in eval mode, its mode restored after); a
        builder is called under ``with torch.device("meta"):`` (a module on another device
        has its tensors swapped for meta ones) and its forward runs on one meta sample,
        which allocates and computes nothing. Where that fails (any exception, e.g. a
        builder that reads files or a forward that reads a value), one probe task on a
        worker builds the model there (kept in the worker's cache for the partitions) and
        runs it on one zero sample. Without a Dask client that probe runs in this
        process, where the tasks run too.
    transform
        Images: the engine's pipeline (:mod:`dask_ddp.data.transforms`, fixed output size;
        no random ops for inference); default: the dataset's.
    partition_size
        Images (lists, folders) and Sources: samples per partition.
    device
        Where the model runs; default: a GPU when the worker sees one, else the CPU.
        ``"cuda"`` or the default picks among the worker's visible GPUs: a worker's
        threads are numbered in the order they first run a ``predict`` task and thread
        ``k`` uses visible GPU ``k % count`` (so a worker with one thread per GPU keeps each
        busy; one worker per GPU, dask-cuda's ``CUDA_VISIBLE_DEVICES`` convention, uses its
        own as ``cuda:0``). ``"cuda:1"``, ``"cpu"``: that device. The model is cached per
        device. Place GPU work with Dask's resources:
        ``client.compute(result, resources={"GPU": 1})``.
    threads
        torch's intra-op threads per task; default: the host's usable cores over its Dask
        workers' threads (so concurrent tasks do not oversubscribe), restored after.
    precision
        ``"fp32"`` (default), ``"bf16"`` or ``"fp16"``: the forward under
        :func:`torch.autocast` of the task's device type at that dtype (the CPU supports
        both too). The outputs are float32 whatever the precision.
    tf32
        TF32 for matmuls and cuDNN convolutions and RNNs on the GPU while the task runs
        (``"tf32"`` or ``"ieee"`` in ``torch.backends.cuda.matmul.fp32_precision``,
        ``torch.backends.cudnn.conv.fp32_precision`` and ``...cudnn.rnn.fp32_precision``;
        the legacy ``allow_tf32`` flags are not touched), the process's values restored
        after; None: left as they are.
    channels_last
        The model and its 4-d inputs (images) in ``torch.channels_last`` memory format,
        which convolutions run faster in on GPUs with tensor cores (with ``bf16``/``fp16``).

    Returns
    -------
    dask.dataframe.DataFrame or dask.array.Array
        Lazy; ``compute``, ``persist``, ``to_parquet``, ``to_zarr`` as any collection.

    Examples
    --------
    >>> out = dask_ddp.predict(make_model, ddf, checkpoint="s3://bucket/job",
    ...                        columns=features)  # doctest: +SKIP
    >>> out.to_parquet("s3://bucket/scores/")  # doctest: +SKIP
    """
    if on_error not in _ON_ERROR:
        raise ValueError(f"predict: on_error must be one of {_ON_ERROR}, got {on_error!r}")
    if output not in OUTPUTS:
        raise ValueError(f"predict: output must be one of {OUTPUTS}, got {output!r}")
    if batch_size < 1 or partition_size < 1:
        raise ValueError(f"predict: batch_size and partition_size must be >= 1, got "
                         f"{batch_size} and {partition_size}")
    spec = _spec(model, checkpoint, checkpoint_step, device, threads, precision, tf32,
                 channels_last)
    from dask_ddp.data.loader_type import Kind, kind_of
    from dask_ddp.predict import graphs as coll

    kind = Kind.IMAGES if isinstance(data, (str, os.PathLike)) else kind_of(data)
    if kind not in (Kind.FRAME, Kind.ARRAY, Kind.IMAGES, Kind.SHARDS, Kind.SOURCE):
        raise TypeError(f"predict: data must be a Dask DataFrame, Series or Array, an image "
                        f"dataset (ImageList, ImageFolder, TarShards), a folder URL or a "
                        f"dask_ddp.data.Source, not {type(data).__name__}")
    if kind is not Kind.FRAME and columns is not None:
        raise ValueError("predict: columns= is for DataFrames")
    if kind is Kind.FRAME and channels_last:
        raise ValueError("predict: channels_last=True is for image inputs (4-d samples), "
                         "not DataFrames")
    if kind not in (Kind.IMAGES, Kind.SHARDS) and transform is not None:
        raise ValueError("predict: transform= is for image datasets")

    def layout(sample: Sequence[int], dtype: torch.dtype) -> Layout:
        return _layout(model, spec, sample, dtype, name, output, output_shape, output_dtype)

    if kind is Kind.FRAME:
        result = coll.predict_frame(spec, data, columns, batch_size, on_error, layout)
    elif kind is Kind.ARRAY:
        result = coll.predict_array(spec, data, batch_size, on_error, layout)
    elif kind is Kind.SOURCE:
        from dask_ddp.predict.sources import predict_source

        result = predict_source(spec, data, batch_size, partition_size, layout)
    else:
        result = coll.predict_dataset(spec, data, transform, batch_size, partition_size,
                                      on_error, layout)
    remember_call(result[0], result[1])
    return result[0]
