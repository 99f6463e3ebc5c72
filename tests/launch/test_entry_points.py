"""The entries into another process's code, named by path (dask_ddp._launch.wire.entry_points):
each resolves to what it names, pickles as its path, and nothing outside the launcher
resolves."""

from __future__ import annotations

import importlib
import importlib.util
import os
import pickle

import pytest
from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

from dask_ddp._launch.wire import entry_points as ep

pytestmark = [pytest.mark.timeout(60)]

TASKS = [ep.RUN_RANK, ep.COLLECT_STACKS, ep.KILL_RANK, ep.LIVE_RANKS]
PLUGINS = [ep.JOB_GUARD, ep.LIVE_STORES, ep.QUIET_RANK_FAILURES, ep.WORKDIR_CLEANER,
           ep.LEAVE_BEFORE_CLOSE]


@pytest.mark.parametrize("ref", TASKS, ids=lambda r: r.path)
def test_a_task_unpickles_as_the_function_it_names(ref: ep.TaskRef) -> None:
    func = pickle.loads(pickle.dumps(ref))
    module, name = ref.path.split(":")
    assert func is getattr(importlib.import_module(module), name)
    assert ep.path_of(func) == ep.path_of(ref) == ref.path
    # The function itself still pickles by reference (its module imports on a worker).
    assert pickle.loads(pickle.dumps(func)) is func


@pytest.mark.parametrize("ref", PLUGINS, ids=lambda r: r.path)
def test_a_plugin_unpickles_as_an_instance_of_its_class_under_the_same_name(
        ref: ep.SchedulerPluginRef | ep.WorkerPluginRef) -> None:
    plugin = pickle.loads(pickle.dumps(ref))
    module, name = ref.path.split(":")
    assert type(plugin) is getattr(importlib.import_module(module), name)
    assert plugin.name == ref.name and plugin.idempotent and ref.idempotent
    # Dask files each by its base class: the reference is of the same kind.
    base = SchedulerPlugin if isinstance(ref, SchedulerPlugin) else WorkerPlugin
    assert isinstance(ref, base) and isinstance(plugin, base)


def test_the_modules_a_worker_starts_exist() -> None:
    for module in (ep.RANK_MODULE, ep.SCRIPT_MODULE, ep.TEMPLATE_MODULE):
        assert importlib.util.find_spec(module) is not None, module
    assert os.path.isfile(ep.TETHER_SCRIPT)


@pytest.mark.parametrize("path", [
    "os:system", "dask_ddp.dispatch:submit", "dask_ddp._launchx.m:f", "dask_ddp._launch.m",
    "dask_ddp._launch.m:f()", "dask_ddp._launch.m.:f", "dask_ddp._launch.a b:f",
])
def test_nothing_outside_the_launcher_resolves(path: str) -> None:
    with pytest.raises(ValueError, match="not a path to launcher code"):
        ep.resolve(path)
    with pytest.raises(ValueError, match="not a path to launcher code"):
        ep.TaskRef(path)
