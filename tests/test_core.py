"""The C++ extension loads and maps engine errors to the Python exceptions users expect."""

from __future__ import annotations

import pytest

from dask_ddp import _core  # type: ignore[attr-defined]

# Code numbers as in cpp/include/ddp/status.h.
NOT_FOUND, PERMISSION_DENIED, INVALID_ARGUMENT, UNAVAILABLE, DATA_LOSS = 4, 6, 2, 12, 13


@pytest.mark.parametrize(
    ("code", "exc"),
    [
        (NOT_FOUND, FileNotFoundError),
        (PERMISSION_DENIED, PermissionError),
        (INVALID_ARGUMENT, ValueError),
        (UNAVAILABLE, ConnectionError),
        (DATA_LOSS, OSError),
    ],
)
def test_status_codes_map_to_python_exceptions(code: int, exc: type[Exception]) -> None:
    with pytest.raises(exc, match="s3://bucket/key"):
        _core._raise_status(code, "s3://bucket/key: HTTP 404")


def test_benchmark_helpers_are_not_in_core() -> None:
    # decode_throughput lives in the development module dask_ddp_bench (cpp/bench/python),
    # which no wheel ships.
    assert not hasattr(_core, "decode_throughput")
