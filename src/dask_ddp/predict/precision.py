"""How a ``predict`` task computes: mixed precision under autocast, and TF32 for its span.

``precision="bf16"`` or ``"fp16"`` runs the forward under :func:`torch.autocast` of the
task's device type (the CPU too: its autocast supports both); the outputs are float32
whatever the precision (:func:`as_output`), so the result's dtype does not depend on it.

TF32 is a setting of the process, as torch's thread count is: :func:`tf32_mode` sets it
while at least one task that asked is inside and restores the values found before the first
when the last one leaves, as :func:`dask_ddp.predict.model.torch_threads` does for threads.
It is set through torch's per-operator precisions only (``"tf32"`` or ``"ieee"`` in
``torch.backends.cuda.matmul.fp32_precision``, ``torch.backends.cudnn.conv.fp32_precision``
and ``torch.backends.cudnn.rnn.fp32_precision``: what the legacy ``allow_tf32`` flags
covered). The legacy flags are neither read nor written: since torch 2.9 reading them raises
"mix of the legacy and new APIs" once the user or a library set a precision the new way, and
writing them is such a mix.

An operator set to ``"none"`` inherits its backend's precision
(``torch.backends.cudnn.fp32_precision``, itself inheriting the generic
``torch.backends.fp32_precision``), and torch reads out the inherited value. So the values
saved are those read, the parents are never written, and an operator whose saved value is
its backend's is put back to ``"none"``: it follows its parents again, as before (one that
the user had set to the same value as its backend also ends up inheriting; torch does not
say which of the two it was).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch

__all__ = [
    "PRECISIONS", "as_output", "check_precision", "compute_mode", "tf32_mode", "tf32_precisions"]

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


#: The operators ``tf32=`` sets, as torch's per-operator precisions name them.
_TF32_OPS = ("matmul", "conv", "rnn")

_tf32_lock = threading.Lock()
_tf32_users = 0
_tf32_saved: dict[str, str] = {}


def _tf32_switches() -> dict[str, Any]:
    """The objects whose ``fp32_precision`` sets each of :data:`_TF32_OPS`."""
    backends: Any = torch.backends  # their attributes are not in torch's type stubs
    return {"matmul": backends.cuda.matmul, "conv": backends.cudnn.conv,
            "rnn": backends.cudnn.rnn}


def tf32_precisions() -> dict[str, str]:
    """Each operator's float32 precision as torch reads it (an inherited one included):
    ``"tf32"``, ``"ieee"`` or ``"none"`` (nothing set anywhere)."""
    return {op: str(switch.fp32_precision) for op, switch in _tf32_switches().items()}


def _set_tf32(values: dict[str, str]) -> None:
    """Each operator's precision set to ``values``'s where it reads otherwise; a value equal
    to its backend's (what ``"none"`` reads) written as ``"none"``."""
    inherited = str(torch.backends.cudnn.fp32_precision)
    for op, switch in _tf32_switches().items():
        if switch.fp32_precision != values[op]:
            switch.fp32_precision = "none" if values[op] == inherited else values[op]


@contextlib.contextmanager
def tf32_mode(enabled: bool | None) -> Iterator[None]:
    """TF32 for matmuls and cuDNN set to ``enabled`` while inside (None: left as it is); the
    values found before the first concurrent task restored when the last leaves."""
    global _tf32_users, _tf32_saved
    if enabled is None:
        yield
        return
    wanted = "tf32" if enabled else "ieee"
    with _tf32_lock:
        if _tf32_users == 0:
            _tf32_saved = tf32_precisions()
        _tf32_users += 1
        _set_tf32(dict.fromkeys(_TF32_OPS, wanted))
    try:
        yield
    finally:
        with _tf32_lock:
            _tf32_users -= 1
            if _tf32_users == 0:
                _set_tf32(_tf32_saved)


@contextlib.contextmanager
def compute_mode(device: torch.device, precision: str, tf32: bool | None) -> Iterator[None]:
    """Inference mode, autocast of ``device``'s type at ``precision`` (none for ``"fp32"``)
    and ``tf32`` (:func:`tf32_mode`), for one task's forward calls; a GPU ``device`` is the
    thread's current device meanwhile (a model that allocates on ``"cuda"`` or calls
    ``.cuda()`` gets the task's GPU, not GPU 0)."""
    dtype = PRECISIONS[check_precision(precision)]
    with contextlib.ExitStack() as stack:
        if device.type == "cuda":
            stack.enter_context(torch.cuda.device(device))
        stack.enter_context(tf32_mode(tf32))
        stack.enter_context(torch.inference_mode())
        if dtype is not None:
            stack.enter_context(torch.autocast(device.type, dtype=dtype))
        yield
