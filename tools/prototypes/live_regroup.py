"""Prototype: a gloo group re-forms without a killed member, on plain torch.distributed.

Three rank processes on a store their parent hosts (the store outside the ranks that
``init_process_group(enable_reconfigure=True)`` + ``_reconfigure`` need). Rank 2 exits
for good; rank 0 is then blocked in an all-reduce on rank 1, a *live* peer, which leaves
the broken generation at once through a one-member reconfigure (that closes its
connections, so rank 0 wakes with an error instead of at the group's timeout); both
re-form as generation 2 and all-reduce again.

    python tools/prototypes/live_regroup.py
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

logger = logging.getLogger("live_regroup")


def rank(i: int, port: int) -> None:
    store = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=10))
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=i,
                            world_size=3, enable_reconfigure=True,
                            timeout=timedelta(seconds=15))

    def reconfigure(gen: int, members: list[int]) -> None:
        store.set(f"h{gen}/{i}", dist._get_reconfigure_handle())
        handles = [store.get(f"h{gen}/{r}").decode() for r in members]
        t0 = time.monotonic()
        dist._reconfigure(uuid=gen, handles=handles).wait()
        logger.warning("rank %d: generation %d in %.3f s", i, gen, time.monotonic() - t0)

    reconfigure(1, [0, 1, 2])
    dist.all_reduce(torch.ones(3))
    if i == 2:
        os._exit(0)
    if i == 0:
        t0 = time.monotonic()
        try:
            dist.all_reduce(torch.ones(1_000_000))
        except RuntimeError as exc:
            logger.warning("rank 0: woke %.3f s later: %.60s", time.monotonic() - t0, exc)
    else:
        time.sleep(1.0)
        dist._reconfigure(uuid=1000 + i, handles=[dist._get_reconfigure_handle()]).wait()
    reconfigure(2, [1, 0])
    t = torch.ones(3)
    dist.all_reduce(t)
    logger.warning("rank %d -> %d of %d: %s", i, dist.get_rank(), dist.get_world_size(),
                   t.tolist())


def main() -> None:
    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=10),
                          wait_for_workers=False)
    procs = [subprocess.Popen([sys.executable, __file__, str(i), str(store.port)])
             for i in range(3)]
    for p in procs:
        p.wait(timeout=60)


if __name__ == "__main__":
    logging.basicConfig(format="%(message)s")
    if len(sys.argv) == 3:
        rank(int(sys.argv[1]), int(sys.argv[2]))
    else:
        main()
