"""One sample's output shape and dtype, found without building the model in the client.

``predict`` needs the output's layout before anything runs (the result's ``meta`` and
chunks). Unless ``output_shape`` and ``output_dtype`` are given it is found so:

1. in the client, by the cheapest forward that needs no build:

   - a module passed in whose parameters and buffers are all on the CPU (it is built
     already) runs on one zero sample on the CPU, in eval mode and inference mode, its
     mode restored after: one row through its layers;
   - a model builder (or a module on another device) runs on the meta device: the builder
     is called under ``with torch.device("meta"):`` (its parameters are shapes without
     memory), a module's parameters and buffers are swapped for meta ones
     (:func:`torch.func.functional_call`), and the forward runs on one meta sample:
     shapes and dtypes propagate, nothing is computed or allocated, no weights are read.
     Its first run in a process imports much of torch's compiler stack (``torch._dynamo``
     among a thousand modules: seconds), which is why a built module takes the CPU;

2. where that fails (any exception: a builder that loads files, a forward that reads a
   value on the meta device, a model the zero sample does not suit), one probe task on a
   worker: the model built there, as the partitions' tasks build it (then cached for
   them), on one zero sample. Without a Dask client the probe runs in this process, where
   the tasks will run too.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from dask_ddp.predict.model import ModelSpec, model_for, thread_share, torch_threads
from dask_ddp.predict.outputs import Layout, probe

__all__ = ["find_layout", "in_client", "on_cpu", "on_meta", "predict_output_probe"]

logger = logging.getLogger(__name__)


def _meta_forward(model: nn.Module | Callable[[], nn.Module]) -> Callable[[torch.Tensor], Any]:
    """A function running ``model``'s forward with meta parameters (built under the meta
    device when ``model`` is a builder)."""
    if isinstance(model, nn.Module):
        tensors = {name: torch.empty_like(t, device="meta") for name, t in itertools.chain(
            model.named_parameters(), model.named_buffers())}
        was_training = model.training

        def run(x: torch.Tensor) -> Any:
            # The user's module: its own tensors swapped out while it runs, its mode kept.
            model.train(False)
            try:
                return torch.func.functional_call(model, tensors, (x,))
            finally:
                model.train(was_training)

        return run
    with torch.device("meta"):
        built = model()
    if not isinstance(built, nn.Module):
        raise TypeError(f"the model builder returned {type(built).__name__}, not a "
                        "torch.nn.Module")
    return built.eval()


def on_meta(model: nn.Module | Callable[[], nn.Module], sample: Sequence[int],
            dtype: torch.dtype, *, name: str, output: str) -> Layout:
    """The layout from a forward on the meta device (step 1); raises where it cannot run."""
    with torch.device("meta"):
        return probe(_meta_forward(model), sample, dtype, name=name, output=output,
                     device="meta")


def on_cpu(model: nn.Module, sample: Sequence[int], dtype: torch.dtype, *, name: str,
           output: str) -> Layout:
    """The layout from a forward of ``model`` (on the CPU) on one zero sample, in eval mode
    (its mode restored after)."""
    was_training = model.training
    try:
        return probe(model, sample, dtype, name=name, output=output, device="cpu")
    finally:
        model.train(was_training)


def _on_the_cpu(model: nn.Module) -> bool:
    """Whether every parameter and buffer of ``model`` is a host tensor."""
    return all(t.device.type == "cpu"
               for t in itertools.chain(model.parameters(), model.buffers()))


def in_client(model: nn.Module | Callable[[], nn.Module], sample: Sequence[int],
              dtype: torch.dtype, *, name: str, output: str) -> Layout:
    """The layout from a forward in this process (step 1): on the CPU for a module there,
    else on the meta device; raises where it cannot run."""
    if isinstance(model, nn.Module) and _on_the_cpu(model):
        return on_cpu(model, sample, dtype, name=name, output=output)
    return on_meta(model, sample, dtype, name=name, output=output)


def predict_output_probe(spec: ModelSpec, sample: tuple[int, ...], dtype: torch.dtype,
                         name: str, output: str) -> Layout:
    """The probe task (step 2): ``spec``'s model as the worker caches it, on one zero sample
    on its device (the thread's current one meanwhile, as in the partitions' tasks)."""
    model, device = model_for(spec)
    gpu = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with torch_threads(thread_share(spec)), gpu:
        return probe(model, sample, dtype, name=name, output=output, device=device)


def _client() -> Any:
    try:
        from distributed import default_client

        return default_client()
    except (ImportError, ValueError):
        return None


def find_layout(model: nn.Module | Callable[[], nn.Module], spec: ModelSpec,
                sample: Sequence[int], dtype: torch.dtype, *, name: str,
                output: str) -> Layout:
    """The layout of ``model``'s output for one sample of ``sample`` and ``dtype``: from a
    forward in this process, else from one probe task on a worker (see the module's
    notes)."""
    try:
        return in_client(model, sample, dtype, name=name, output=output)
    except Exception as e:  # any failure here: the worker's probe decides
        logger.info("predict: the output's shape in this process failed (%s: %s); "
                    "probing on a worker", type(e).__name__, e)
    args = (spec, tuple(int(d) for d in sample), dtype, name, output)
    client = _client()
    if client is None:
        return predict_output_probe(*args)
    future = client.submit(predict_output_probe, *args, pure=False)
    try:
        layout: Layout = future.result()
    finally:
        future.release()
    return layout
