"""The checked-in type stub of the C++ module matches the module that is built."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import dask_ddp

PACKAGE = Path(dask_ddp.__file__).parent


def test_core_stub_is_current(tmp_path: Path) -> None:
    out = tmp_path / "_core.pyi"
    subprocess.run(
        [sys.executable, "-m", "nanobind.stubgen", "-q", "-m", "dask_ddp._core", "-o", str(out)],
        check=True,
    )
    assert out.read_text() == (PACKAGE / "_core.pyi").read_text(), (
        "src/dask_ddp/_core.pyi is stale: run `make stubs` and commit it"
    )


def test_package_is_typed() -> None:
    assert (PACKAGE / "py.typed").is_file()
