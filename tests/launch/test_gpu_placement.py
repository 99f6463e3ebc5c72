"""Which GPU each rank takes and the backend that follows (``_launch/rank/gpu_placement.py``),
over made-up hosts and GPU UUIDs: the layouts a user meets on a GPU box (LocalCluster on
one GPU, several workers without dask-cuda, dask-cuda's per-worker visibility, several
ranks per worker, several hosts), then every small layout against a brute-force matching.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from dask_ddp._launch.rank.gpu_placement import (
    AUTO_WITH_NCCL,
    RankGpus,
    Shared,
    choose_backend,
    gather,
    place,
)
from dask_ddp._launch.worker import rank_env


def uuids(host: str, n: int) -> list[str]:
    return [f"GPU-{host}-{i}" for i in range(n)]


def launched(hosts: Sequence[tuple[str, int, Sequence[str | None]]],
             nprocs_per_worker: int = 1) -> list[RankGpus]:
    """What each rank sees under the launcher: ``hosts`` holds (host, its GPUs, each
    worker's ``CUDA_VISIBLE_DEVICES`` or None); the ranks' visibility is what
    ``rank_env.rotated_devices`` gives each process of a worker, mapped to UUIDs."""
    seen = []
    for host, n_gpus, workers in hosts:
        physical = uuids(host, n_gpus)
        for visible in workers:
            base = visible if visible is not None else ",".join(map(str, range(n_gpus)))
            for proc in range(nprocs_per_worker):
                rotated = rank_env.rotated_devices(base, proc, nprocs_per_worker) or base
                ids = [int(d) for d in rotated.split(",") if d]
                seen.append(RankGpus(host, tuple(physical[i] for i in ids)))
    return seen


def chosen(seen: Sequence[RankGpus]) -> list[str | None]:
    placement = place(seen)
    return [None if i is None else seen[r].gpus[i] for r, i in enumerate(placement.devices)]


# ------------------------------------------------------------------ the layouts users meet


def test_two_workers_on_one_gpu_share_it_and_auto_falls_back_to_gloo() -> None:
    seen = launched([("box", 1, [None, None])])  # LocalCluster(n_workers=2), one GPU
    placement = place(seen)
    assert placement.devices == (0, 0)
    assert placement.shared == (Shared(rank=1, other=0, host="box", gpu="GPU-box-0"),)
    choice = choose_backend("auto", seen, placement)
    assert choice.backend == "gloo" and not choice.uses_nccl
    assert choice.warning is not None
    assert "ranks 0 and 1 on GPU GPU-box-0 of host box" in choice.warning
    assert "dask-cuda" in choice.warning


@pytest.mark.parametrize("requested", ["nccl", "cpu:gloo,cuda:nccl"])
def test_explicit_nccl_on_a_shared_gpu_fails_naming_both_ranks_and_the_gpu(
        requested: str) -> None:
    seen = launched([("box", 1, [None, None])])
    with pytest.raises(RuntimeError, match=r"ranks 0 and 1 on GPU GPU-box-0 of host box"):
        choose_backend(requested, seen, place(seen))


def test_four_gpus_two_workers_without_dask_cuda_get_distinct_gpus() -> None:
    seen = launched([("box", 4, [None, None])])
    assert chosen(seen) == ["GPU-box-0", "GPU-box-1"]
    choice = choose_backend("auto", seen, place(seen))
    assert choice == choose_backend("auto", seen, place(seen))
    assert choice.backend == AUTO_WITH_NCCL == "cpu:gloo,cuda:nccl"
    assert choice.warning is None and choice.uses_nccl
    assert choose_backend("nccl", seen, place(seen)).backend == "nccl"


def test_dask_cuda_visibility_is_respected() -> None:
    # dask-cuda: worker i sees its own GPU first (a rotation of all), or only its own.
    rotated = [",".join(str((i + k) % 4) for k in range(4)) for i in range(4)]
    seen = launched([("box", 4, rotated)])
    assert place(seen).devices == (0, 0, 0, 0)  # each its own, the first it sees
    assert chosen(seen) == uuids("box", 4)
    only_own = launched([("box", 4, ["2", "3"])])
    assert chosen(only_own) == ["GPU-box-2", "GPU-box-3"]
    # Two dask-cuda workers limited to the same GPU share it, whatever they number it.
    same = [RankGpus("box", ("GPU-x",)), RankGpus("box", ("GPU-y", "GPU-x"))]
    assert chosen(same) == ["GPU-x", "GPU-y"]
    assert place([RankGpus("box", ("GPU-x",))] * 2).shared[0].gpu == "GPU-x"


def test_two_ranks_per_worker_on_one_gpu_share_it() -> None:
    seen = launched([("box", 1, [None])], nprocs_per_worker=2)
    placement = place(seen)
    assert [str(s) for s in placement.shared] == ["ranks 0 and 1 on GPU GPU-box-0 of host box"]
    assert choose_backend("auto", seen, placement).backend == "gloo"


def test_ranks_per_worker_across_workers_of_one_host() -> None:
    # 2 workers x 2 ranks on 4 GPUs: distinct, not the rotation's first GPU twice.
    seen = launched([("box", 4, [None, None])], nprocs_per_worker=2)
    assert sorted(chosen(seen)) == uuids("box", 4)  # type: ignore[type-var]
    # The example's --nprocs-per-worker 4 with two workers: 8 ranks on 4 GPUs.
    over = launched([("box", 4, [None, None])], nprocs_per_worker=4)
    placement = place(over)
    assert len(placement.shared) == 4
    assert {s.rank for s in placement.shared} == {4, 5, 6, 7}
    assert choose_backend("auto", over, placement).backend == "gloo"


def test_two_hosts_each_place_their_own_ranks() -> None:
    seen = launched([("a", 1, [None]), ("b", 1, [None])])
    assert chosen(seen) == ["GPU-a-0", "GPU-b-0"]
    assert choose_backend("auto", seen, place(seen)).backend == AUTO_WITH_NCCL
    crowded = launched([("a", 1, [None, None]), ("b", 2, [None, None])])
    placement = place(crowded)
    assert [str(s) for s in placement.shared] == ["ranks 0 and 1 on GPU GPU-a-0 of host a"]
    assert chosen(crowded)[2:] == ["GPU-b-0", "GPU-b-1"]


def test_a_rank_moves_along_so_that_nobody_shares() -> None:
    # Greedy by rank would give rank 0 GPU-a and leave rank 1 nothing but GPU-a.
    seen = [RankGpus("h", ("GPU-a", "GPU-b")), RankGpus("h", ("GPU-a",))]
    assert chosen(seen) == ["GPU-b", "GPU-a"]
    assert place(seen).shared == ()


def test_cpu_ranks_and_mixed_jobs() -> None:
    cpus = [RankGpus("a"), RankGpus("b")]
    assert place(cpus).devices == (None, None)
    choice = choose_backend("auto", cpus, place(cpus))
    assert (choice.backend, choice.warning) == ("gloo", None)
    assert choose_backend("gloo", cpus, place(cpus)).backend == "gloo"
    mixed = [RankGpus("a", ("GPU-a",)), RankGpus("b")]
    assert choose_backend("auto", mixed, place(mixed)).backend == "gloo"
    with pytest.raises(RuntimeError, match=r"no CUDA device is visible to rank 1 on host b \("):
        choose_backend("nccl", mixed, place(mixed))
    # An explicit gloo on shared GPUs is the user's choice: no warning, no error.
    shared = launched([("box", 1, [None, None])])
    assert choose_backend("gloo", shared, place(shared)).warning is None


# ---------------------------------------------------------------- every small layout


def max_matching(seen: Sequence[RankGpus]) -> int:
    """The most ranks that can hold distinct GPUs (brute force)."""
    best = 0
    options = [(*v.gpus, None) for v in seen]
    for pick in itertools.product(*options):
        taken = [g for g in pick if g is not None]
        if len(taken) == len(set(taken)):
            best = max(best, len(taken))
    return best


def test_every_small_layout_shares_only_where_it_must() -> None:
    gpus = ("A", "B", "C")
    views = [()] + [p for k in (1, 2, 3) for c in itertools.combinations(gpus, k)
                    for p in itertools.permutations(c)]
    checked = 0
    for n_ranks in (1, 2, 3):
        for combo in itertools.product(views, repeat=n_ranks):
            seen = [RankGpus("h", v) for v in combo]
            placement = place(seen)
            with_gpu = [r for r, v in enumerate(seen) if v.gpus]
            assert len(placement.shared) == len(with_gpu) - max_matching(seen), combo
            picked = [seen[r].gpus[i] for r, i in enumerate(placement.devices)
                      if i is not None]
            assert len(picked) == len(with_gpu)
            sharing = {s.rank for s in placement.shared}
            own = [g for r, g in zip(with_gpu, picked, strict=True) if r not in sharing]
            assert len(own) == len(set(own)), combo  # the others hold distinct GPUs
            for s in placement.shared:  # a sharing rank names the GPU's holder
                assert s.gpu == seen[s.rank].gpus[0] and s.other not in sharing
            # where nobody shares, each rank keeps its first choice if it is free
            if n_ranks == 1 and seen[0].gpus:
                assert placement.devices == (0,)
            checked += 1
    assert checked == 16 + 16**2 + 16**3


# ------------------------------------------------------------ the record on the store


def test_records_cross_the_store_and_a_foreign_one_is_named() -> None:
    record = RankGpus("box", ("GPU-1", "GPU-2"))
    assert RankGpus.loads(record.dumps().encode(), 3) == record
    with pytest.raises(ValueError, match="rank 3's GPU record"):
        RankGpus.loads(b"not json", 3)
    with pytest.raises(ValueError, match="rank 2's GPU record"):
        RankGpus.loads(b'{"host": "h", "gpus": [1]}', 2)


def test_every_rank_reads_every_ranks_record_through_a_real_store() -> None:
    master = TCPStore("127.0.0.1", 0, 2, True, timedelta(seconds=30), wait_for_workers=False)
    peer = TCPStore("127.0.0.1", master.port, 2, False, timedelta(seconds=30))
    results: dict[int, list[RankGpus]] = {}
    thread = threading.Thread(target=lambda: results.__setitem__(1, gather(peer, 1, 2)))
    thread.start()
    results[0] = gather(master, 0, 2)
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert results[0] == results[1]
    assert len(results[0]) == 2 and all(r.host for r in results[0])
