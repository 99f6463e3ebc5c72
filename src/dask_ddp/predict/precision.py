"""How a ``predict`` task computes: mixed precision under autocast, and TF32 for its span.

``precision="bf16"`` or ``"fp16"`` runs the forward under :func:`torch.autocast` of the
task's device type (the CPU too: its autocast supports both); the outputs are float32
whatever the precision (:func:`as_output`), so the result's dtype does not depend on it.

TF32 (``torch.backends.cuda.matmul.allow_tf32`` and ``torch.backends.cudnn.allow_tf32``)
is a setting of the process, as torch's thread count is: :func:`tf32_mode` sets it while at
least one task that asked is inside and restores the values found before the first when
the last one leaves, as :func:`dask_ddp.predict.model.torch_threads` does for threads.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

__all__ = ["PRECISIONS", "as_output", "check_precision", "compute_mode", "tf32_mode"]

#: The precisions ``predict`` accepts and the autocast dtype of each (None: plain fp32).
PRECISIONS: dict[str, torch.dtype | None] = {
    "fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}

_REDUCED = (torch.bfloat16, torch.float16)


def check_precision(precision: str) -> str:
    """``precision`` if it is one of :data:`PRECISIONS`, else ``ValueError`` naming it."""
    if precision not in PRECISIONS:
        raise ValueError(f"predict: precision must be one of {tuple(PRECISIONS)}, "
                         f"got {precision!r}")
    return precision


def as_output(y: torch.Tensor) -> torch.Tensor:
    """``y`` in the dtype ``predict`` returns: a reduced-precision float as float32, else as
    it is."""
    return y.float() if y.dtype in _REDUCED else y


def output_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype :func:`as_output` gives a tensor of ``dtype``."""
    return torch.float32 if dtype in _REDUCED else dtype


_tf32_lock = threading.Lock()
_tf32_users = 0
_tf32_saved = (False, False)


def _tf32_now() -> tuple[bool, bool]:
    return bool(torch.backends.cuda.matmul.allow_tf32), bool(torch.backends.cudnn.allow_tf32)


def _set_tf32(matmul: bool, cudnn: bool) -> None:
    if _tf32_now() != (matmul, cudnn):
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = cudnn


@contextlib.contextmanager
def tf32_mode(enabled: bool | None) -> Iterator[None]:
    """TF32 for matmuls and cuDNN set to ``enabled`` while inside (None: left as it is); the
    values found before the first concurrent task restored when the last leaves."""
    global _tf32_users, _tf32_saved
    if enabled is None:
        yield
        return
    with _tf32_lock:
        if _tf32_users == 0:
            _tf32_saved = _tf32_now()
        _tf32_users += 1
        _set_tf32(enabled, enabled)
    try:
        yield
    finally:
        with _tf32_lock:
            _tf32_users -= 1
            if _tf32_users == 0:
                _set_tf32(*_tf32_saved)


@contextlib.contextmanager
def compute_mode(device: torch.device, precision: str, tf32: bool | None) -> Iterator[None]:
    """Inference mode, autocast of ``device``'s type at ``precision`` (none for ``"fp32"``)
    and ``tf32`` (:func:`tf32_mode`), for one task's forward calls."""
    dtype = PRECISIONS[check_precision(precision)]
    with contextlib.ExitStack() as stack:
        stack.enter_context(tf32_mode(tf32))
        stack.enter_context(torch.inference_mode())
        if dtype is not None:
            stack.enter_context(torch.autocast(device.type, dtype=dtype))
        yield
