"""The lazy facades: ``dir()`` offers the public names (REPL and notebook completion),
without importing them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

FACADES = ["dask_ddp", "dask_ddp.data", "dask_ddp.data.table", "dask_ddp.checkpoint",
           "dask_ddp._channel", "dask_ddp._dashboard"]


@pytest.mark.parametrize("name", FACADES)
def test_dir_lists_all_and_imports_nothing(name: str) -> None:
    # A fresh interpreter: dir() must not import the names it lists.
    code = (f"import sys, json, {name} as m; before = set(sys.modules); d = dir(m); "
            "print(json.dumps({'dir': d, 'all': sorted(m.__all__), "
            "'new': sorted(set(sys.modules) - before)}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    got = json.loads(out)
    assert set(got["all"]) <= set(got["dir"])
    assert not {"TYPE_CHECKING", "annotations", "attribute_loader"} & set(got["dir"])
    assert "__doc__" in got["dir"]
    assert got["new"] == [], f"dir({name}) imported {got['new']}"


def test_every_listed_name_resolves() -> None:
    import importlib

    for name in FACADES:
        module = importlib.import_module(name)
        for attr in dir(module):
            getattr(module, attr)  # an AttributeError names a stale __all__ entry
