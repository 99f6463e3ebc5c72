"""Mixed precision and TF32 of a predict task: the names checked, autocast on the CPU too,
float32 outputs whatever the precision, TF32 set and restored across concurrent tasks through
torch's per-operator precisions only (never the legacy allow_tf32 flags, which torch refuses
to mix with them), the generic and backend settings left alone and followed again after."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch

from dask_ddp.predict.precision import (
    as_output,
    check_precision,
    compute_mode,
    tf32_mode,
    tf32_precisions,
)

OPS = ("matmul", "conv", "rnn")


def tf32_now() -> tuple[bool, ...]:
    return tuple(p == "tf32" for p in tf32_precisions().values())


def parents() -> tuple[str, str]:
    """The generic precision and the CUDA backend's (what an operator set to "none" reads)."""
    return str(torch.backends.fp32_precision), str(torch.backends.cudnn.fp32_precision)


@pytest.fixture(autouse=True)
def precisions_kept() -> Iterator[None]:
    """The process's precisions as the test found them, whatever it set (pytest's worker
    runs other tests after this one)."""
    before, ops = parents(), tf32_precisions()
    yield
    torch.backends.fp32_precision, torch.backends.cudnn.fp32_precision = before
    switches = {"matmul": torch.backends.cuda.matmul, "conv": torch.backends.cudnn.conv,
                "rnn": torch.backends.cudnn.rnn}
    for op, switch in switches.items():
        if switch.fp32_precision != ops[op]:
            switch.fp32_precision = ops[op]


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
    wanted = not before[0]  # the matmuls' setting changes (torch's defaults: ieee, tf32, tf32)
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
        assert tf32_now() == (wanted,) * 3
    assert tf32_now() == (wanted,) * 3  # the other task is still inside
    release.set()
    t.join()
    assert tf32_now() == before
    with pytest.raises(RuntimeError), tf32_mode(wanted):
        raise RuntimeError("a failing task")
    assert tf32_now() == before


def test_a_precision_set_the_new_way_is_restored_without_the_legacy_flags() -> None:
    torch.backends.cuda.matmul.fp32_precision = "tf32"  # a user's or a library's setting
    before = tf32_precisions()
    with tf32_mode(False):
        assert tf32_precisions() == dict.fromkeys(OPS, "ieee")
    assert tf32_precisions() == before
    with tf32_mode(True):
        assert tf32_precisions() == dict.fromkeys(OPS, "tf32")
    assert tf32_precisions() == before


@pytest.mark.parametrize("level", ["generic", "backend"])
def test_inherited_precisions_are_inherited_again_after(level: str) -> None:
    if level == "generic":
        torch.backends.fp32_precision = "tf32"
    else:
        torch.backends.cudnn.fp32_precision = "tf32"
    torch.backends.cuda.matmul.fp32_precision = "none"  # inherits tf32
    set_by_user = parents()
    with tf32_mode(False):
        assert tf32_precisions() == dict.fromkeys(OPS, "ieee")
        assert parents() == set_by_user
    assert parents() == set_by_user
    assert tf32_precisions()["matmul"] == "tf32"
    # The matmuls follow their parents again, as before the task.
    torch.backends.fp32_precision = torch.backends.cudnn.fp32_precision = "ieee"
    assert tf32_precisions()["matmul"] == "ieee"
