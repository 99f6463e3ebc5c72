"""tools/check_import_cycles.py: finds a cycle, leaves the compiled engine's edge out, and
finds none in dask_ddp (``make lint`` runs it too)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = [pytest.mark.timeout(60)]

TOOL = Path(__file__).resolve().parents[1] / "tools" / "check_import_cycles.py"


def load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_import_cycles", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cycles_are_found_and_self_imports_are_not_cycles() -> None:
    tool = load_tool()
    edges = {"p": {"p.a"}, "p.a": {"p.b", "p.a"}, "p.b": {"p"}, "p.c": {"p.a"}}
    assert tool.cycles(edges) == [["p", "p.a", "p.b"]]
    assert tool.cycles({"p.a": {"p.a"}, "p.b": {"p.a"}}) == []


def test_from_package_import_of_a_compiled_module_is_no_edge_to_the_package() -> None:
    tool = load_tool()
    assert tool._imported_names("from dask_ddp import _core, storage") == ["_core", "storage"]
    assert tool._imported_names("import dask_ddp") is None


def test_dask_ddp_has_no_import_cycle() -> None:
    done = subprocess.run([sys.executable, str(TOOL)], capture_output=True, text=True,
                          timeout=50)
    assert done.returncode == 0, done.stdout + done.stderr
