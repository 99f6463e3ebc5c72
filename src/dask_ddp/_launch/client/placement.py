"""Placing a job's ranks on Dask workers (client side, internal).

A plan is computed from the scheduler's view of the workers before anything is submitted,
so a job that cannot start raises at once (gang start) instead of waiting in the queue.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dask_ddp._cluster import cluster_info
from dask_ddp._launch.wire.options import LaunchOptions
from dask_ddp._launch.wire.rank_spec import RankSpec, worker_host
from dask_ddp.errors import GangStartError

#: Worker states of workers that cannot take a new rank.
GONE = ("closing", "closing_gracefully", "closed", "failed")


def choose_workers(
    info: Mapping[str, Any],
    n_workers: int | None,
    workers: Sequence[str] | None,
    resources: Mapping[str, float] | None,
) -> list[str]:
    """Pick the workers of a job, in rank order, or raise :class:`GangStartError`.

    Parameters
    ----------
    info
        :func:`cluster_info` of the client.
    n_workers
        How many workers to use; ``None`` means all that qualify (or all of ``workers``).
    workers
        Explicit worker addresses, used in the given order.
    resources
        Dask worker resources every chosen worker must declare (e.g. ``{"GPU": 1}``).
    """
    known: dict[str, Any] = dict(info.get("workers", {}))
    if n_workers is not None and n_workers < 1:
        raise ValueError(f"n_workers must be at least 1, got {n_workers}")
    if workers is not None:
        workers = list(workers)
        unknown = [w for w in workers if w not in known]
        if unknown:
            raise GangStartError(
                f"workers not in the cluster: {', '.join(unknown)} "
                f"(the scheduler knows {len(known)}: {', '.join(sorted(known)) or 'none'})")
        candidates = workers
    else:
        # Group by host, so local ranks of one host are contiguous (as torchrun numbers them).
        candidates = sorted(known, key=lambda a: (worker_host(a), a))
    lacking: dict[str, str] = {}
    fit = []
    for addr in candidates:
        have = known[addr].get("resources") or {}
        missing = {k: v for k, v in (resources or {}).items() if have.get(k, 0) < v}
        if missing:
            lacking[addr] = ", ".join(f"{k}={v} (has {have.get(k, 0)})"
                                      for k, v in missing.items())
        else:
            fit.append(addr)
    if workers is not None and lacking:
        raise GangStartError("workers lack the requested resources: " + "; ".join(
            f"{a}: needs {why}" for a, why in lacking.items()))
    if n_workers is not None:
        if len(fit) < n_workers:
            detail = f"; {len(lacking)} lack resources {dict(resources or {})}" if lacking else ""
            raise GangStartError(
                f"the job needs {n_workers} workers but only {len(fit)} can take a rank "
                f"(the cluster has {len(known)} workers{detail})")
        fit = fit[:n_workers]
    if not fit:
        raise GangStartError(
            "no worker can take a rank: the cluster has no workers" if not known else
            f"no worker has the requested resources {dict(resources or {})}")
    return fit


def rank_layout(workers: Sequence[str], nprocs_per_worker: int) -> list[dict[str, Any]]:
    """Rank, local rank, group rank (per host, as torchrun) and process index of every rank.

    A host's group rank is its index in the order hosts first appear in ``workers``.
    """
    if nprocs_per_worker < 1:
        raise ValueError(f"nprocs_per_worker must be at least 1, got {nprocs_per_worker}")
    per_host: dict[str, int] = {}
    group: dict[str, int] = {}
    for addr in workers:
        host = worker_host(addr)
        per_host[host] = per_host.get(host, 0) + nprocs_per_worker
        group.setdefault(host, len(group))
    next_local: dict[str, int] = {}
    layout: list[dict[str, Any]] = []
    for addr in workers:
        host = worker_host(addr)
        for proc in range(nprocs_per_worker):
            local = next_local.get(host, 0)
            next_local[host] = local + 1
            layout.append({"rank": len(layout), "local_rank": local,
                           "local_world_size": per_host[host], "worker": addr,
                           "proc_index": proc, "group_rank": group[host],
                           "group_world_size": len(group)})
    return layout


def rank_specs(options: LaunchOptions, layout: Sequence[Mapping[str, Any]],
               workers: Sequence[str], *, job_id: str, run_id: str, restart: int,
               scheduler: str, live_store: str | None = None) -> list[RankSpec]:
    """The spec of every rank of ``layout`` (:func:`rank_layout`) of attempt ``restart``,
    in rank order; ``workers``: every rank's worker (rank 0's host is the master);
    ``live_store``: the job's live store, when its policy regroups."""
    return [RankSpec(
        options=options, job_id=job_id, run_id=run_id, restart=restart,
        rank=i["rank"], local_rank=i["local_rank"], local_world_size=i["local_world_size"],
        group_rank=i["group_rank"], group_world_size=i["group_world_size"],
        proc_index=i["proc_index"], workers=tuple(workers),
        master_addr=worker_host(layout[0]["worker"]), scheduler=scheduler,
        live_store=live_store) for i in layout]


def available_workers(client: Any, resources: Mapping[str, float] | None,
                      preferred: Sequence[str]) -> list[str]:
    """Running workers that can take a rank now, those in ``preferred`` first."""
    info = cluster_info(client)
    info["workers"] = {a: w for a, w in info.get("workers", {}).items()
                       if w.get("status", "running") not in GONE}
    try:
        fit = choose_workers(info, None, None, resources)
    except GangStartError:
        return []
    first = [w for w in preferred if w in fit]
    return first + [w for w in fit if w not in first]
