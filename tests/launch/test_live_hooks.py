"""A live rank's gradient hook (_launch/rank/live/hooks.py), without a process group: a bucket's
all-reduce ended as a real torch future, rank 0's join word kept and read at the next
step's top. On a GPU the hook's callback makes the host wait for the GPU nowhere (torch's
sync debug mode raises on a sync there)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from dask_ddp._launch.rank.live.hooks import GradientHook, HostScalar

pytestmark = [pytest.mark.timeout(60)]


def hook() -> GradientHook:
    group: Any = SimpleNamespace(rank=0, can_grow=True)
    return GradientHook(group, None, lambda: None)


def ended(value: torch.Tensor) -> torch.futures.Future[list[torch.Tensor]]:
    """An all-reduce's future that completed with ``value`` (the bucket's sum)."""
    fut: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future(
        devices=[value.device] if value.is_cuda else None)
    fut.set_result([value])
    return fut


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_a_cpu_value_is_read_at_once(dtype: torch.dtype) -> None:
    t = torch.tensor([0.0, 2.0], dtype=dtype)
    word = HostScalar(t[-1])
    t.zero_()  # read when made: a later change of the tensor is not seen
    assert word.value() == 2.0 and isinstance(word.value(), float)


def test_the_word_is_kept_and_read_at_the_next_step_s_top() -> None:
    h = hook()
    buf = torch.tensor([1.0, 3.0])
    # Two ranks' sum: the gradients, then rank 0's word (1: a rank waits to join).
    mean = h.reduced(ended(torch.tensor([2.0, 6.0, 1.0])), buf, world=2, worded=True)
    assert mean.tolist() == [1.0, 3.0]
    assert h.admit
    h.admit = False  # the boundary admitted them
    assert not h.admit
    h.reduced(ended(torch.tensor([2.0, 6.0, 0.0])), buf, world=2, worded=True)
    assert not h.admit


def test_a_bucket_without_the_word_leaves_it() -> None:
    h = hook()
    h.admit = True
    mean = h.reduced(ended(torch.tensor([2.0, 6.0])), torch.zeros(2), world=2, worded=False)
    assert mean.tolist() == [1.0, 3.0] and h.admit


def test_a_failed_all_reduce_keeps_the_local_values_and_no_word() -> None:
    h = hook()
    buf = torch.tensor([1.0, 3.0])
    fut: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()
    fut.set_exception(RuntimeError("[/x/gloo/transport/tcp/pair.cc:561] Connection closed"))  # type: ignore[arg-type]  # torch stub: any exception
    assert h.reduced(fut, buf, world=2, worded=True) is buf
    assert h.failed is not None and "Connection closed" in h.failed
    assert not h.admit
    why = h.failed
    cause, _ = h.end_step()
    assert cause == why and h.failed is None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_cuda_word_is_read_without_a_sync_in_the_hook(dtype: torch.dtype) -> None:
    h = hook()
    buf = torch.tensor([1.0, 3.0], device="cuda", dtype=dtype)
    total = torch.tensor([1.0, 3.0, 0.5], device="cuda", dtype=dtype) * 2  # on the GPU
    fut = ended(total)
    eight = torch.tensor(4.0, device="cuda") * 2
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError):  # the mode catches a sync: .item() is one
            eight.item()
        mean = h.reduced(fut, buf, world=2, worded=True)
        word = HostScalar(eight)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert h.failed is None, h.failed
    assert h.admit  # read now, after the event: 1.0 > 0.5
    assert word.value() == 8.0
    assert mean.float().cpu().tolist() == [1.0, 3.0]
