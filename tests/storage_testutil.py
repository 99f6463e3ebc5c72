"""Helpers shared by the storage tests."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def cpp_test_binary() -> Path | None:
    """The GoogleTest binary of the C++ build (``DDP_TESTS_BINARY`` or build/dev)."""
    candidates = [os.environ.get("DDP_TESTS_BINARY", ""), str(ROOT / "build/dev/ddp_tests")]
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return Path(c)
    return None


def run_cpp_conformance(gtest_filter: str, env: dict[str, str]) -> None:
    """Run the C++ store conformance suite for one back-end against a live server.

    Fails with the binary's output if any test fails, or if tests were skipped for want
    of a server (the variables did not reach it).
    """
    binary = cpp_test_binary()
    if binary is None:
        pytest.skip("C++ test binary not built (make build)")
    proc = subprocess.run(
        [str(binary), f"--gtest_filter={gtest_filter}", "--gtest_brief=1"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "[  PASSED  ]" in out, out[-3000:]
    assert "no live server" not in out, out[-3000:]
