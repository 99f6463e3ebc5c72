"""The device a predict task uses: the choice among a worker's visible GPUs as a pure
function (any GPU count, on the CPU), the thread numbering, and the model cached per device."""

from __future__ import annotations

import threading

import pytest
import torch

from dask_ddp.predict.devices import device_for, task_device, thread_slot
from dask_ddp.predict.model import ModelSpec, model_for


@pytest.mark.parametrize("count", [1, 2, 3, 8])
def test_threads_take_the_visible_gpus_in_turn(count: int) -> None:
    chosen = [device_for(None, count, slot) for slot in range(2 * count + 1)]
    assert [d.index for d in chosen] == [s % count for s in range(2 * count + 1)]
    assert {d.type for d in chosen} == {"cuda"}
    # As many threads as GPUs: each GPU used by exactly one thread.
    assert sorted(d.index for d in chosen[:count]) == list(range(count))
    assert [device_for("cuda", count, s) for s in range(count)] == chosen[:count]


def test_explicit_devices_and_no_gpu() -> None:
    assert device_for(None, 0, 3) == torch.device("cpu")
    assert device_for("cpu", 4, 1) == torch.device("cpu")
    assert device_for("cuda:2", 4, 1) == torch.device("cuda", 2)
    assert device_for("cuda", 0, 1) == torch.device("cuda")  # torch names the error later
    with pytest.raises(ValueError, match="-1"):
        device_for(None, 2, -1)


def test_a_thread_keeps_its_slot_and_threads_differ() -> None:
    mine = thread_slot()
    assert thread_slot() == mine
    got: list[int] = []
    threads = [threading.Thread(target=lambda: got.append(thread_slot())) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got) | {mine}) == 4


def test_the_model_is_cached_per_device() -> None:
    import cloudpickle

    spec = ModelSpec("test-devices-token", cloudpickle.dumps(torch.nn.Linear(2, 1)),
                     model_key="test-devices-model")
    model, device = model_for(spec, torch.device("cpu"))
    assert device == torch.device("cpu") and model_for(spec, torch.device("cpu"))[0] is model
    if torch.cuda.device_count() == 0:
        assert task_device(None) == torch.device("cpu")


@pytest.mark.gpu
def test_each_thread_uses_its_gpu_and_a_model_per_gpu() -> None:
    import cloudpickle

    count = torch.cuda.device_count()
    spec = ModelSpec("test-devices-gpu", cloudpickle.dumps(torch.nn.Linear(2, 1)),
                     model_key="test-devices-gpu-model")
    found: dict[int, tuple[torch.device, int]] = {}

    def one() -> None:
        model, device = model_for(spec)
        found[thread_slot()] = (device, id(model))

    threads = [threading.Thread(target=one) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {slot % count: d.index for slot, (d, _) in found.items()} == {
        slot % count: slot % count for slot in found}
    assert len({m for _, m in found.values()}) == count  # one module per GPU
