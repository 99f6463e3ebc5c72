"""The launcher's waits: one key each under ``dask-ddp.launch``, a default that is the
field's, a row in the docs' table of waits, and the tests' fast profile names only them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

import dask_ddp
from dask_ddp._launch.wire.options import LaunchWaits
from waits import FAST_LAUNCH_WAITS

ROOT = Path(dask_ddp.__file__).parents[2]


def _keys() -> dict[str, str]:
    return {f.name: f.name.replace("_", "-") for f in dataclasses.fields(LaunchWaits)}


def test_every_wait_is_a_documented_key_with_the_fields_default() -> None:
    from dask.utils import parse_timedelta

    defaults = yaml.safe_load((Path(dask_ddp.__file__).parent / "dask-ddp.yaml").read_text())
    launch = defaults["dask-ddp"]["launch"]
    table = (ROOT / "docs" / "user-guide" / "stalls.md").read_text()
    for field in dataclasses.fields(LaunchWaits):
        key = _keys()[field.name]
        assert key in launch, f"dask-ddp.launch.{key} is not in dask-ddp.yaml"
        assert parse_timedelta(launch[key]) == field.default, (key, launch[key], field.default)
        assert f"`{key}`" in table, f"{key} has no row in docs/user-guide/stalls.md"


def test_the_fast_profile_names_only_launch_keys() -> None:
    known = {"stall-timeout", *_keys().values()}
    for key in FAST_LAUNCH_WAITS:
        prefix, _, name = key.rpartition(".")
        assert prefix == "dask-ddp.launch" and name in known, key
