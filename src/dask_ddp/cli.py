"""The ``dask-ddp`` command: a dispatcher of subcommands.

- ``dask-ddp run [--scheduler ADDR] [--n-workers N] [--nprocs-per-worker K] SCRIPT ARGS...``:
  torchrun over Dask. Without ``--scheduler`` it starts a local cluster.
- ``dask-ddp stacks --scheduler ADDR [JOB]``: the live Python stacks of a running job's
  ranks (JOB: its name or id; default every job).
- ``dask-ddp plot ...``: plots of a job's metrics (:func:`dask_ddp.plot.main`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from dask_ddp._launch.wire import policy

logger = logging.getLogger("dask_ddp.cli")

USAGE = """usage: dask-ddp COMMAND [ARGS...]

commands:
  run     run a training script on a Dask cluster, one process per rank (torchrun over Dask)
  stacks  print the live Python stacks of a running job's ranks
  plot    plot a job's metrics

'dask-ddp COMMAND --help' describes a command.
"""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``dask-ddp``; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "run":
        return run_main(rest)
    if command == "stacks":
        return stacks_main(rest)
    if command == "plot":
        from dask_ddp.plot import main as plot_main  # lazily: matplotlib is optional

        try:
            return int(plot_main(rest) or 0)
        except ModuleNotFoundError as exc:
            if exc.name is None or exc.name.split(".")[0] != "matplotlib":
                raise
            sys.stderr.write("dask-ddp plot needs matplotlib, which is not installed: "
                             "pip install 'dask-ddp[plot]'\n")
            return 1
    sys.stderr.write(f"dask-ddp: unknown command {command!r}\n{USAGE}")
    return 2


def _run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dask-ddp run",
        description="Run SCRIPT on a Dask cluster as a DDP job, one process per rank, with "
                    "the environment torchrun sets (RANK, LOCAL_RANK, WORLD_SIZE, "
                    "MASTER_ADDR, MASTER_PORT, ...). Each rank's output is printed "
                    "prefixed with [rank N].")
    p.add_argument("--scheduler", metavar="ADDR",
                   help="address of a running Dask scheduler (default: start a local cluster)")
    p.add_argument("--n-workers", type=int, default=None, metavar="N",
                   help="workers to use (default: all of the scheduler's; 1 for a local "
                        "cluster)")
    p.add_argument("--nprocs-per-worker", type=int, default=1, metavar="K",
                   help="rank processes per worker (default 1)")
    p.add_argument("--name", help="job name shown on the Dask dashboard")
    p.add_argument("--timeout", type=float, default=None, help="seconds before giving up")
    p.add_argument("--stall-timeout", type=_stall_seconds, default="config", metavar="SECONDS",
                   help="end the job when its ranks are blocked in a collective that can no "
                        "longer complete for this long ('none' turns it off; default the "
                        "dask-ddp.launch.stall-timeout key, 60 s)")
    p.add_argument("--recovery", choices=policy.NAMES, default=policy.RESTART.name,
                   help="live: a lost rank costs the others one step, not the job (the "
                        "script registers its model with dask_ddp.Checkpointer)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", type=_env_pair,
                   help="set an environment variable in every rank (repeatable), e.g. "
                        "--env AWS_PROFILE=training --env OMP_NUM_THREADS=4")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="show Dask's own INFO logs (default: warnings and errors only)")
    p.add_argument("script", help="the training script (a .py file or a program)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments of the script")
    return p


def _stall_seconds(text: str) -> float | str | None:
    """``--stall-timeout``: seconds, "none", or "config" (the config key's value)."""
    if text == "config":
        return text
    if text.strip().lower() in ("none", "off"):
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--stall-timeout wants seconds or 'none', got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"--stall-timeout must be positive, got {text!r}")
    return value


def _env_pair(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` of ``--env`` (the value may hold "="); argparse reports bad text."""
    key, sep, value = text.partition("=")
    if not sep or not key or not key.replace("_", "a").isalnum() or key[0].isdigit():
        raise argparse.ArgumentTypeError(
            f"--env wants KEY=VALUE with a variable name, got {text!r}"
        )
    return key, value


def run_main(argv: Sequence[str]) -> int:
    """``dask-ddp run``: returns 0 when every rank exited 0, else 1."""
    opts = _run_parser().parse_args(list(argv))
    logging.basicConfig(level=logging.WARNING, format="dask-ddp: %(message)s")
    # The cluster's own INFO logs (~45 lines per run) only with -v: the ranks' output and
    # the job's errors are what the command is for.
    dask_level = logging.INFO if opts.verbose else logging.WARNING
    from distributed import Client, LocalCluster

    logging.getLogger("distributed").setLevel(dask_level)  # after its import sets INFO

    from dask_ddp import JobError, run_command

    command = [opts.script, *opts.script_args]
    cluster = None
    try:
        if opts.scheduler:
            client = Client(opts.scheduler)
            n_workers = opts.n_workers
        else:
            n_workers = opts.n_workers or 1
            cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                                   dashboard_address=":0", silence_logs=dask_level)
            client = Client(cluster)
        with client:
            run_command(client, command, n_workers=n_workers,
                        nprocs_per_worker=opts.nprocs_per_worker, name=opts.name,
                        timeout=opts.timeout, env=dict(opts.env) or None,
                        stall_timeout=opts.stall_timeout, recovery=opts.recovery)
    except JobError as exc:
        logger.error("%s", exc)
        return 1
    except KeyboardInterrupt as exc:  # the job was cancelled and its ranks stopped
        logger.error("%s", exc or "interrupted")
        return 130
    except (TimeoutError, OSError, ValueError) as exc:
        logger.error("%s: %s", type(exc).__name__, exc)
        return 1
    finally:
        if cluster is not None:
            cluster.close()
    return 0


def stacks_main(argv: Sequence[str]) -> int:
    """``dask-ddp stacks``: print the live stacks of a job's ranks; 1 when none was found."""
    p = argparse.ArgumentParser(
        prog="dask-ddp stacks",
        description="Print the current Python stack of every thread of each rank process "
                    "of a running dask-ddp job (read with faulthandler in the rank).")
    p.add_argument("--scheduler", metavar="ADDR", required=True,
                   help="address of the job's Dask scheduler")
    p.add_argument("--timeout", type=float, default=10.0,
                   help="seconds to wait for the ranks' answers (default 10)")
    p.add_argument("job", nargs="?", default="",
                   help="the job's name or id (or its first 8 characters); default every job")
    opts = p.parse_args(list(argv))
    logging.basicConfig(level=logging.WARNING, format="dask-ddp: %(message)s")
    from distributed import Client

    from dask_ddp._launch.wire.entry_points import COLLECT_STACKS

    try:
        with Client(opts.scheduler, timeout=opts.timeout) as client:
            replies = client.run(COLLECT_STACKS, opts.job, opts.timeout, on_error="return")
    except (OSError, TimeoutError) as exc:
        logger.error("cannot reach the scheduler at %s: %s", opts.scheduler, exc)
        return 1
    jobs: dict[str, dict[str, object]] = {}
    for worker, reply in sorted(replies.items()):
        if not isinstance(reply, dict):
            logger.error("worker %s did not answer: %s", worker, reply)
            continue
        for job_id, entry in reply.items():
            slot = jobs.setdefault(job_id, {"name": entry["name"], "stacks": {}})
            stacks = slot["stacks"]
            assert isinstance(stacks, dict)
            stacks.update({rank: (worker, text) for rank, text in entry["stacks"].items()})
    if not jobs:
        logger.error("no running rank of job %r on the cluster at %s",
                     opts.job or "(any)", opts.scheduler)
        return 1
    out = []
    for job_id, slot in jobs.items():
        out.append(f"=== job {slot['name']!r} ({job_id}) ===")
        stacks = slot["stacks"]
        assert isinstance(stacks, dict)
        for rank in sorted(stacks):
            worker, text = stacks[rank]
            out.append(f"--- rank {rank} on worker {worker} ---\n{text}")
    sys.stdout.write("\n".join(out) + "\n")
    return 0
