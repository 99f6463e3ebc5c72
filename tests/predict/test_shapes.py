"""The output's shape found without building the model in this process: a module on the CPU
runs one zero sample there (never the meta device, whose first use costs seconds of
imports), a builder runs on the meta device (a module elsewhere has its tensors swapped),
else a probe where tasks run."""

from __future__ import annotations

import cloudpickle
import numpy as np
import torch

from dask_ddp.predict.model import ModelSpec, cache_info
from dask_ddp.predict.shapes import find_layout, on_meta
from predict_util import TinyCnn


class SeesItsDevice:
    """Builds a TinyCnn and records the default device it was built under."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def __call__(self) -> torch.nn.Module:
        self.seen.append(torch.empty(0).device.type)
        return TinyCnn()


class ReadsAValue(TinyCnn):
    """A forward that reads a value (``.item()``): the meta device cannot run it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        return y[:, :3] if float(y.sum().item()) < 1e9 else y


class SeesItsInput(TinyCnn):
    """Records the device of each input its forward gets."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(x.device.type)
        return super().forward(x)


def find(model: torch.nn.Module) -> tuple[int, ...]:
    spec = ModelSpec("test-shapes-seen", cloudpickle.dumps(model), model_key="test-shapes-seen")
    return find_layout(model, spec, (3, 16, 16), torch.float32, name="out",
                       output="columns").shape


def test_a_module_on_the_cpu_runs_one_sample_there_not_on_the_meta_device() -> None:
    module = SeesItsInput().train()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    assert find(module) == (5,)
    assert module.seen == ["cpu"]
    assert module.training
    assert all(torch.equal(module.state_dict()[k], v) for k, v in before.items())
    # A module elsewhere (here: on the meta device already) keeps the meta path.
    elsewhere = SeesItsInput().to("meta")
    assert find(elsewhere) == (5,)
    assert elsewhere.seen == ["meta"]


def test_a_builder_is_called_on_the_meta_device() -> None:
    builder = SeesItsDevice()
    layout = on_meta(builder, (3, 16, 16), torch.float32, name="out", output="columns")
    assert layout.shape == (5,) and layout.dtype == np.float32
    assert builder.seen == ["meta"]


def test_a_module_runs_with_meta_tensors_and_is_left_as_it_was() -> None:
    module = TinyCnn().train()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    layout = on_meta(module, (3, 16, 16), torch.float32, name="p", output="list")
    assert layout.shape == (5,) and layout.name == "p" and layout.output == "list"
    assert module.training
    after = module.state_dict()
    assert all(after[k].device.type == "cpu" and torch.equal(after[k], v)
               for k, v in before.items())


def test_without_a_client_the_probe_runs_here_and_its_model_is_kept() -> None:
    spec = ModelSpec("test-shapes-token", cloudpickle.dumps(ReadsAValue),
                     model_key="test-shapes-model")
    layout = find_layout(ReadsAValue, spec, (3, 16, 16), torch.float32, name="out",
                         output="columns")
    assert layout.shape == (3,)
    assert cache_info()["test-shapes-model"] == {"builds": 1, "loads": 0, "cached": 1}
