"""What a feature needs of torch: the table, the real version parsing, the refusal at submit.

The refusal is tested with versions as torch spells them (``2.11.0+cu130``, a nightly's
``2.14.0a0+git...``) and, where it runs, with the torch installed here.
"""

from __future__ import annotations

import re

import pytest

import dask_ddp
from dask_ddp import _compat
from dask_ddp._launch.wire.options import LaunchOptions

LIVE = "recovery='live'"


@pytest.mark.parametrize(("version", "ok"), [
    ("2.4.0", False), ("2.4.1+cu121", False), ("2.11.0+cu130", False), ("2.13.0+cpu", False),
    ("2.14.0", True), ("2.14.0a0+gitabc1234", True), ("2.14.0.dev20260701+cpu", True),
    ("2.14.1+cu130", True), ("2.15.0", True), ("3.0.0", True), ("not a version", False),
])
def test_versions_as_torch_spells_them(version: str, ok: bool) -> None:
    assert _compat.supports(LIVE, version) is ok


def test_every_need_is_above_the_declared_floor() -> None:
    from packaging.version import Version

    for feature, need in _compat.TORCH_NEEDS.items():
        assert Version(need.version) > Version("2.4"), feature


def train() -> int:
    return 0


def test_submit_refuses_live_on_an_older_torch_naming_both_versions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_compat, "installed_torch", lambda: "2.11.0+cu130")
    with pytest.raises(RuntimeError, match=r"recovery='live' needs torch>=2\.14 .*the "
                                           r"installed torch is 2\.11\.0\+cu130"):
        dask_ddp.submit(None, train, recovery="live")  # refused before any cluster call
    with pytest.raises(RuntimeError, match="recovery='restart'"):
        dask_ddp.run_command(None, ["python", __file__], recovery="live")
    LaunchOptions.build(name="t", payload=b"x")  # recovery='restart' needs nothing more


def test_the_installed_torch_is_judged_by_its_real_version() -> None:
    import torch

    assert _compat.installed_torch() == torch.__version__
    if _compat.supports(LIVE, torch.__version__):
        LaunchOptions.build(name="t", payload=b"x", recovery="live")
    else:  # an older torch (the oldest declared one, in its own environment)
        with pytest.raises(RuntimeError,
                           match=f"installed torch is {re.escape(torch.__version__)}"):
            LaunchOptions.build(name="t", payload=b"x", recovery="live")


def test_a_rank_with_an_older_torch_refuses_live_before_its_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rank checks its own torch (its worker's may be older than the client's)."""
    from types import SimpleNamespace

    from dask_ddp._launch.rank import main as rank

    monkeypatch.setattr(_compat, "installed_torch", lambda: "2.4.1+cu121")
    record = SimpleNamespace(backend="gloo", rendezvous_timeout=1.0, worker="w")
    with pytest.raises(RuntimeError, match=r"installed torch is 2\.4\.1\+cu121"):
        rank.start_live("127.0.0.1:1", 0, 1, record, {})  # no store is reached
