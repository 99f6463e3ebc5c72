"""Mixed precision and TF32 of a predict task: the names checked, autocast on the CPU too,
float32 outputs whatever the precision, TF32 set and restored across concurrent tasks."""

from __future__ import annotations

import threading

import pytest
import torch

from dask_ddp.predict.precision import (
    as_output,
    check_precision,
    compute_mode,
    tf32_mode,
)


def tf32_now() -> tuple[bool, bool]:
    return bool(torch.backends.cuda.matmul.allow_tf32), bool(torch.backends.cudnn.allow_tf32)


def test_a_wrong_precision_is_named() -> None:
    assert check_precision("bf16") == "bf16"
    with pytest.raises(ValueError, match="'float16'"):
        check_precision("float16")


@pytest.mark.parametrize("precision,dtype", [("bf16", torch.bfloat16),
                                             ("fp16", torch.float16), ("fp32", torch.float32)])
def test_autocast_on_the_cpu_and_float32_out(precision: str, dtype: torch.dtype) -> None:
    layer = torch.nn.Linear(4, 3)
    with compute_mode(torch.device("cpu"), precision, None):
        y = layer(torch.randn(5, 4))
        assert y.dtype == dtype
        assert as_output(y).dtype == torch.float32
    assert as_output(torch.arange(3)).dtype == torch.int64  # not a float: kept


def test_tf32_set_inside_and_restored_after_the_last_task() -> None:
    before = tf32_now()
    with tf32_mode(None):
        assert tf32_now() == before
    wanted = not before[0]
    inside = threading.Event()
    release = threading.Event()

    def other() -> None:
        with tf32_mode(wanted):
            inside.set()
            release.wait(10)

    t = threading.Thread(target=other)
    t.start()
    assert inside.wait(10)
    with tf32_mode(wanted):
        assert tf32_now() == (wanted, wanted)
    assert tf32_now() == (wanted, wanted)  # the other task is still inside
    release.set()
    t.join()
    assert tf32_now() == before
    with pytest.raises(RuntimeError), tf32_mode(wanted):
        raise RuntimeError("a failing task")
    assert tf32_now() == before
