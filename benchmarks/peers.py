"""Run one rank-side function under the peer launchers, as their users run them.

Each peer runs in processes spawned from the benchmark's clean environment
(:mod:`benchenv`), never from a process a LocalCluster has written into:

- :func:`run_torchrun`: ``torchrun --standalone --nproc-per-node N`` (the baseline);
- :func:`run_ray`: Ray Train's ``TorchTrainer`` on a local Ray started for the run (skipped
  when ``ray[train]`` is not installed: ``make bench-deps``).

The function is named ``"module:function"`` (a module in ``benchmarks/``), takes JSON
arguments, runs inside an initialised gloo process group, and returns a JSON value. Each
call returns ``(t0, values)``: the wall time at the call and the per-rank values.

This file is also the program those launchers start (``python peers.py rank ...``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import benchenv

logger = logging.getLogger("peers")
HERE = os.path.dirname(os.path.abspath(__file__))


def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (HERE, benchenv.CLEAN_ENV.get("PYTHONPATH", "")) if p)
    return benchenv.clean_env(PYTHONPATH=path)


def _read(out: str, n: int) -> list[Any]:
    values = []
    for r in range(n):
        with open(os.path.join(out, f"rank{r}.json")) as f:
            values.append(json.load(f))
    return values


def _call(target: str, args: list[Any]) -> Any:
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)(*args)


def run_torchrun(target: str, args: list[Any], nproc: int = 2) -> tuple[float, list[Any]]:
    """Run ``target(*args)`` in ``nproc`` ranks under torchrun; returns (t0, values)."""
    with tempfile.TemporaryDirectory() as out:
        t0 = time.time()
        subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone",
             f"--nproc-per-node={nproc}", __file__, "rank", target, json.dumps(args), out],
            check=True, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return t0, _read(out, nproc)


def ray_available() -> bool:
    """True when Ray Train can be imported (``make bench-deps`` installs it)."""
    probe = subprocess.run([sys.executable, "-c", "import ray.train.torch"], env=_env(),
                           capture_output=True)
    return probe.returncode == 0


def with_ray(names: list[str], skip: bool) -> list[str]:
    """``names`` plus ``"ray"`` when Ray Train can run, logging why it is skipped otherwise."""
    if skip:
        logger.warning("Ray Train: skipped (--no-ray)")
    elif ray_available():
        return [*names, "ray"]
    else:
        logger.warning("Ray Train: skipped, ray[train] is not installed (make bench-deps)")
    return names


def run_ray(target: str, args: list[Any], nproc: int = 2) -> tuple[float, list[Any]]:
    """Run ``target(*args)`` in ``nproc`` Ray Train workers (one CPU each).

    Ray is started in a fresh process for the call (``ray.init`` is not timed); ``t0`` is
    taken just before ``TorchTrainer.fit()``, as a user's call on a running Ray.
    """
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(
            [sys.executable, __file__, "ray", target, json.dumps(args), out, str(nproc)],
            check=True, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(os.path.join(out, "t0.json")) as f:
            t0 = json.load(f)
        return t0, _read(out, nproc)


def _rank_main(target: str, args: list[Any], out: str) -> None:
    """A torchrun rank: init gloo from torchrun's environment, run, write the value."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = _call(target, args)
    with open(os.path.join(out, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(value, f)
    dist.barrier()
    dist.destroy_process_group()


def _ray_loop(config: dict[str, Any]) -> None:
    import ray.train

    value = _call(config["target"], config["args"])
    rank = ray.train.get_context().get_world_rank()
    with open(os.path.join(config["out"], f"rank{rank}.json"), "w") as f:
        json.dump(value, f)


def _ray_main(target: str, args: list[Any], out: str, nproc: int) -> None:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    ray.init(num_cpus=nproc, include_dashboard=False, log_to_driver=False)
    try:
        trainer = TorchTrainer(
            _ray_loop, train_loop_config={"target": target, "args": args, "out": out},
            torch_config=TorchConfig(backend="gloo"),
            scaling_config=ScalingConfig(num_workers=nproc, use_gpu=False,
                                         resources_per_worker={"CPU": 1}),
            run_config=RunConfig(storage_path=os.path.join(out, "ray"), name="bench"))
        t0 = time.time()
        trainer.fit()
        with open(os.path.join(out, "t0.json"), "w") as f:
            json.dump(t0, f)
    finally:
        ray.shutdown()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("mode", choices=["rank", "ray"])
    p.add_argument("target")
    p.add_argument("args")
    p.add_argument("out")
    p.add_argument("nproc", nargs="?", type=int, default=2)
    a = p.parse_args()
    if a.mode == "rank":
        _rank_main(a.target, json.loads(a.args), a.out)
    else:
        _ray_main(a.target, json.loads(a.args), a.out, a.nproc)


if __name__ == "__main__":
    main()
