"""Live recovery at the torch.distributed level: rank processes on a store their parent
hosts, killed for real at random moments (shared by the live tests and the prototype)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

STEPS = 40


def state_hash(model: Any, opt: Any, buffers: bool = True) -> str:
    """A hash of parameters, buffers (``buffers``) and the optimizer's state (bitwise)."""
    import torch

    h = hashlib.sha256()
    for t in list(model.parameters()) + (list(model.buffers()) if buffers else []):
        h.update(t.detach().cpu().numpy().tobytes())
    for _, s in sorted(opt.state_dict()["state"].items()):
        for k in sorted(s):
            v = s[k]
            h.update(v.cpu().numpy().tobytes() if isinstance(v, torch.Tensor)
                     else repr(v).encode())
    return h.hexdigest()


def train_step(model: Any, opt: Any, gen: Any) -> None:
    """One step of the user's plain loop, on this rank's own random batch."""
    import torch

    x = torch.randn(16, 32, generator=gen)
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def rank_main(port: int, uid: int, world: int, steps: int, out: str,
              prefix: str = "", joiner: bool = False) -> None:
    """One rank: a DDP MLP with SGD and momentum, ``steps`` steps through the live group,
    then its state's hash in ``out/<uid>.json``. ``joiner``: a rank started while the
    group runs, with a model of its own, that joins the group at a step boundary (the
    group grows up to the trial's ``max`` key; its members wait at step ``hold`` until
    the joiner asked, as the job's ranks wait for a new worker in the cluster tests)."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dask_ddp._launch.rank.live import attach as live_attach
    from dask_ddp._launch.rank.live import group as live
    from dask_ddp._launch.rank.live.membership import JOIN_CHECK_S
    from dask_ddp._launch.wire.live_keys import JOIN_COUNT

    torch.set_num_threads(1)
    store = dist.PrefixStore(prefix, dist.TCPStore("127.0.0.1", port, None, False,
                                                    timedelta(seconds=30)))
    cap = int(store.get("max")) if store.check(["max"]) else None
    hold = int(store.get("hold")) if store.check(["hold"]) else None
    # A trial may rebuild the groups every generation, gloo standing in for NCCL.
    group = live.LiveGroup(store, uid, world, timeout=20.0, max_size=cap,
                           rebuild=store.check(["rebuild"]))
    live.install(group)
    if joiner:
        group.start_joining()  # a group of itself until its attach() is admitted
    else:
        group.start()
    torch.manual_seed(uid if joiner else 0)  # a joiner must take the group's model
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                        nn.Linear(64, 4))
    # Several buckets: a step's all-reduces interleave. Every other trial, DDP reduces
    # .grad in place (the hook then copies each bucket's local gradients for a redo).
    in_place = prefix.startswith("t") and int(prefix[1:] or 0) % 2 == 1
    model = DDP(net, bucket_cap_mb=0.005, gradient_as_bucket_view=in_place)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    live_attach.attach(model, opt)  # a joiner: once a step boundary admitted it
    gen = torch.Generator().manual_seed(1000 + uid)
    if not joiner:
        store.add("ready", 1)
    params = list(model.parameters())
    for _ in range(steps - group.committed):
        if group.committed == hold and not joiner:
            deadline = time.monotonic() + 60
            while not int(store.add(JOIN_COUNT, 0)):  # the joiner has not asked yet
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rank {uid}: no rank asked to join within 60 s")
                time.sleep(0.005)
            time.sleep(JOIN_CHECK_S)  # rank 0's next look at the join queue is due
        if store.check([f"die/{uid}"]):
            # Die inside backward(): when this parameter's gradient is computed (some
            # buckets may be all-reduced already, others not yet).
            which = int(store.get(f"die/{uid}"))
            params[which].register_hook(lambda _: os.kill(os.getpid(), signal.SIGKILL))
            store.delete_key(f"die/{uid}")
        train_step(model, opt, gen)
        store.set(f"progress/{uid}", str(group.committed))
    # Finish together (the store, not gloo): a rank that exits early breaks its peers.
    group.finish_barrier()
    tmp = Path(out, f"{uid}.tmp")
    tmp.write_text(json.dumps({
        "hash": state_hash(model, opt), "step": group.committed,
        "generation": group.generation, "world": dist.get_world_size(),
        "comms": type(group.comms).__name__}))
    tmp.rename(Path(out, f"{uid}.json"))
    os._exit(0)


def two_group_main(port: int, uid: int, device: str, out: str) -> None:
    """One of two ranks of a live group whose groups are rebuilt every generation (the
    NCCL path): ``device`` ``"cuda"`` (NCCL, GPU ``uid``) or ``"cpu"`` (gloo standing in).
    At step ``CHANGE`` rank 1's parameters are spoiled and both ranks re-form the group
    at the next step's top (as a join word makes them): rank 0's state must reach rank 1
    over the new groups. At step ``LEAVE`` both write their state's hash; rank 1 leaves
    at its next step's top, and rank 0, once the store says so, goes on alone. Rank 0
    writes its final state in ``out/0.json``."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dask_ddp._launch.rank.live import attach as live_attach
    from dask_ddp._launch.rank.live import group as live
    from dask_ddp._launch.wire.live_keys import DEAD_KEY

    torch.set_num_threads(1)
    dev = torch.device(device, uid) if device == "cuda" else torch.device("cpu")
    if device == "cuda":
        torch.cuda.set_device(dev)
    store = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=30))
    group = live.LiveGroup(store, uid, 2, backend="nccl" if device == "cuda" else "gloo",
                           timeout=30.0, rebuild=True)
    live.install(group)
    group.start()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.BatchNorm1d(64),
                        nn.Linear(64, 4)).to(dev)
    model = DDP(net, bucket_cap_mb=0.005)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    att = live_attach.attach(model, opt)
    assert att is not None
    gen = torch.Generator().manual_seed(1000 + uid)

    def dump(name: str, **extra: Any) -> None:
        Path(out, name).write_text(json.dumps({
            # Not the buffers: BatchNorm's running stats are rank 0's at each forward's
            # start (DDP broadcasts them over its group), then each rank's own batch's.
            "hash": state_hash(model, opt, buffers=False), "step": group.committed,
            "world": dist.get_world_size(), "comms": type(group.comms).__name__,
            "backend": dist.get_backend(), **extra}))

    for step in range(TWO_GROUP_STEPS):
        if step == TWO_GROUP_CHANGE:
            if uid == 1:
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(1.0)
            att.grads.admit = True  # both re-form the group at the next forward
        if step == TWO_GROUP_LEAVE:
            dump(f"{uid}.at_leave.json")
            if uid == 1:
                group.request_leave()  # at the next step's top
            else:
                deadline = time.monotonic() + 60
                while not store.check([DEAD_KEY.format(uid=1)]):
                    if time.monotonic() > deadline:
                        raise TimeoutError("rank 1 did not leave within 60 s")
                    time.sleep(0.01)
                group.regroup("rank 1 left")
        x = torch.randn(16, 32, generator=gen).to(dev)
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dump(f"{uid}.json", generation=group.generation)
    os._exit(0)


#: The two-group run's steps, the step of its planned change and of rank 1's leaving.
TWO_GROUP_STEPS, TWO_GROUP_CHANGE, TWO_GROUP_LEAVE = 12, 3, 8


def run_two_groups(device: str, out: Path, timeout: float = 90.0) -> dict[str, Any]:
    """Run :func:`two_group_main`'s two ranks (processes of their own) on a store this
    process hosts; their exit codes and what they wrote."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30),
                          wait_for_workers=False)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [subprocess.Popen(
        [sys.executable, "-c", "import sys, live_util; live_util.two_group_main("
         "int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])",
         str(store.port), str(uid), device, str(out)], env=env,
        cwd=os.path.dirname(__file__)) for uid in (0, 1)]
    try:
        codes = [p.wait(timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    files = {f.name: json.loads(f.read_text()) for f in out.glob("*.json")}
    return {"codes": codes, "files": files}


def zygote_main(port: int, world: int, trials: int, steps: int, out: str) -> None:
    """Import torch once, then fork ``world`` rank processes per trial, and one that joins
    them when the trial says so (a rank's start costs a fork, not an import: many trials
    fit in one test)."""
    import torch  # noqa: F401 - imported once, before the forks
    import torch.distributed as dist

    from dask_ddp._launch.rank.live import group as live  # noqa: F401

    store = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=30))

    def fork(t: int, u: int, joiner: bool) -> int:
        pid = os.fork()
        if pid == 0:
            try:
                rank_main(port, u, world, steps, os.path.join(out, str(t)), f"t{t}", joiner)
            finally:
                os._exit(1)
        store.set(f"t{t}/pid/{u}", str(pid))
        return pid

    for t in range(trials):
        store.wait([f"t{t}/go"], timedelta(seconds=300))
        running = {fork(t, u, False) for u in range(world)}
        if store.check([f"t{t}/max"]):  # and a rank that joins the group
            running.add(fork(t, world, True))
        for pid in running:
            os.waitpid(pid, 0)
    os._exit(0)


class Trials:
    """A zygote process and its store: :meth:`run` starts one trial's ranks, kills some
    and returns what the survivors ended with."""

    def __init__(self, world: int, trials: int, out: Path, steps: int = STEPS) -> None:
        import torch.distributed as dist

        self.world, self.steps, self.out, self.trial = world, steps, out, 0
        self.store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30),
                                   wait_for_workers=False)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        self.zygote = subprocess.Popen(
            [sys.executable, "-c", "import sys, live_util; live_util.zygote_main(*map(int, "
             "sys.argv[1:5]), sys.argv[5])", str(self.store.port), str(world), str(trials),
             str(steps), str(out)], env=env, cwd=os.path.dirname(__file__))

    def close(self) -> None:
        if self.zygote.poll() is None:
            self.zygote.kill()
        self.zygote.wait()

    def run(self, kills: int, seed: int, timeout: float = 120.0,
            join: bool = False, rebuild: bool = False) -> dict[str, Any]:
        """One trial: ``join``: a rank (uid ``world``) started with the others joins the
        group at a random step (the members wait there until it asked); then ``kills``
        random ranks (rank 0 and the joiner included) SIGKILLed at random moments (a
        random step, then a random part of it: forward, backward, the optimizer, a
        recovery). ``rebuild``: the groups are rebuilt every generation, a gloo control
        group beside the gradients' (the NCCL path, gloo standing in for NCCL)."""
        from torch.distributed import PrefixStore

        from dask_ddp._launch.wire import live_store

        t, self.trial = self.trial, self.trial + 1
        os.makedirs(self.out / str(t), exist_ok=True)
        store = PrefixStore(f"t{t}", self.store)
        rng = random.Random(seed)
        if join:
            store.set("hold", str(rng.randrange(2, self.steps // 3)))
            store.set("max", str(self.world + 1))
        if rebuild:
            store.set("rebuild", "1")
        self.store.set(f"t{t}/go", "1")
        deadline = time.monotonic() + timeout
        while int(store.add("ready", 0)) < self.world:
            self._check(deadline, "the ranks to start")
            time.sleep(0.01)
        pids = {u: int(store.get(f"pid/{u}")) for u in range(self.world)}
        alive, killed, modes = list(range(self.world)), [], []
        if join:
            uid = self.world
            while _progress(store, uid) == 0:  # admitted, and a step taken in the group
                self._check(deadline, f"rank {uid} to join")
                time.sleep(0.005)
            pids[uid] = int(store.get(f"pid/{uid}"))
            alive.append(uid)
        for _ in range(kills):
            late = rng.random() < 0.2  # at the end: some survivors may have returned
            at = self.steps - rng.randrange(1, 3) if late else rng.randrange(2, self.steps // 2)
            while max(_progress(store, u) for u in alive) < at:
                self._check(deadline, f"step {at}")
                time.sleep(0.001)
            victim = rng.choice(alive)
            late = late or max(_progress(store, u) for u in alive) >= self.steps - 3
            if rng.random() < 0.5 and not late:
                modes.append("backward")
                store.set(f"die/{victim}", str(rng.randrange(6)))
                while _alive(pids[victim]):
                    self._check(deadline, f"rank {victim} to die inside backward()")
                    time.sleep(0.001)
            else:
                modes.append("late" if late else "signal")
                time.sleep(rng.random() * 0.015)
                os.kill(pids[victim], signal.SIGKILL)
            live_store.mark_dead(store, victim)  # what its supervisor does
            alive.remove(victim)
            killed.append(victim)
        results: dict[int, Any] = {}
        for u in alive:
            path = self.out / str(t) / f"{u}.json"
            while not path.exists():
                self._check(deadline, f"rank {u}'s result (killed {killed}, seed {seed})")
                time.sleep(0.02)
            time.sleep(0.01)
            results[u] = json.loads(path.read_text())
        return {"killed": killed, "modes": modes, "results": results,
                "generations": live_store.read_generations(store)}

    def _check(self, deadline: float, what: str) -> None:
        if time.monotonic() > deadline or self.zygote.poll() is not None:
            raise TimeoutError(f"waited too long for {what}; zygote exit code "
                               f"{self.zygote.poll()}")


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not: its parent reaps it later)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or the read
        return False


def _progress(store: Any, uid: int) -> int:
    key = f"progress/{uid}"
    return int(store.get(key)) if store.check([key]) else 0


#: The rank that :func:`live_train` strikes (``hold_at``).
VICTIM = 1
#: How long a held victim waits to be struck before it fails the job (a bound, not a pause).
HOLD_S = 120.0


def live_train(folder: str, steps: int, pause: float, hold_at: int | None = None,
               fault: str = "", raise_at: tuple[int, int] | None = None) -> dict[str, Any]:
    """A training function as the README's: a DDP model, SGD with momentum, a
    Checkpointer, a plain loop; its pid and step in ``folder`` for the test to aim.

    ``hold_at``: in the first attempt, rank :data:`VICTIM` stops before that step, writes
    ``folder/holding`` and waits there (the others wait for it in their next all-reduce)
    until the test wrote ``folder/struck`` or the rank was asked to leave; with
    ``fault="raise"`` it raises there instead. Also a script's body (a live script's
    ``init_process_group`` made the group). ``raise_at=(rank, step)``: that rank raises
    at that step of the job's first attempt."""
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import dask_ddp

    start = dask_ddp.rank_info()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    dask_ddp.Checkpointer(model, opt)
    gen = torch.Generator().manual_seed(1000 + start.rank)
    Path(folder, f"pid{start.rank}").write_text(str(os.getpid()))
    for step in range(steps):
        if step == hold_at and start.rank == VICTIM and start.restart == 0:
            if fault == "raise":
                raise RuntimeError(f"rank {start.rank} raises at step {step}")
            _hold(folder)
        if raise_at == (start.rank, step) and start.restart == 0:
            raise RuntimeError(f"rank {start.rank} raises at step {step}, as the test asked")
        train_step(model, opt, gen)
        Path(folder, f"step{start.rank}").write_text(str(step))
        time.sleep(pause)
    now = dask_ddp.rank_info()
    return {"hash": state_hash(model, opt), "first_rank": start.rank, "rank": now.rank,
            "world": now.world_size, "generation": now.generation, "restart": now.restart}


def _hold(folder: str) -> None:
    """Wait until ``folder/struck`` or a request to leave (a live rank whose worker
    closes leaves at the top of its next step); :data:`HOLD_S` at most."""
    from dask_ddp._launch.rank.live import group as live

    Path(folder, "holding").touch()
    deadline = time.monotonic() + HOLD_S
    while not Path(folder, "struck").exists():
        group = live.current()
        if group is not None and group.leaving:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {VICTIM} held {HOLD_S} s in {folder}: never struck")
        time.sleep(0.01)


def audited_epoch(loader: Any, model: Any, opt: Any, folder: str, audit: str, first_rank: int,
                  pause: float, inputs: Any = None, hold_at: int | None = None
                  ) -> dict[str, Any]:
    """One epoch of ``loader`` (labels: the samples' ids) through ``model``: before each
    step the batch's ids go to ``folder/<audit>`` (``iteration id,id``), after it the
    iteration to ``folder/step<first_rank>``; then the rank's state and group.

    ``hold_at``: after that step, wait (at most 120 s) for ``folder/struck`` before the
    next: a test's strike then lands mid-epoch however late it comes."""
    import dask_ddp

    with Path(folder, audit).open("a") as out:
        for it, (x, y) in enumerate(loader, 1):
            out.write(f"{it} {','.join(str(int(v)) for v in y)}\n")
            out.flush()
            loss = model(x if inputs is None else inputs(x)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            Path(folder, f"step{first_rank}").write_text(str(it))
            time.sleep(pause)
            if it == hold_at:
                deadline = time.monotonic() + 120
                while not Path(folder, "struck").exists() and time.monotonic() < deadline:
                    time.sleep(0.01)
    now = dask_ddp.rank_info()
    return {"hash": state_hash(model, opt), "first_rank": first_rank, "rank": now.rank,
            "world": now.world_size, "generation": now.generation}


def live_train_images(root: str, n: int, folder: str, pause: float) -> dict[str, Any]:
    """One epoch over ``n`` images whose labels are their indices, with a Loader
    registered in the Checkpointer; each batch's labels go to ``folder/audit<rank>``
    (``iteration label,label``) before its step."""
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import dask_ddp
    from dask_ddp.data import ImageList, Loader
    from dask_ddp.data import transforms as T

    start = dask_ddp.rank_info()
    keys = sorted(str(p.relative_to(root)) for p in Path(root).rglob("*.jpg"))[:n]
    loader = Loader(ImageList(root, keys, list(range(len(keys)))), 2, seed=3,
                    transform=T.Compose([T.Resize((8, 8)), T.ToTensor()]), num_threads=1)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    dask_ddp.Checkpointer(model, opt, loader=loader)
    Path(folder, f"pid{start.rank}").write_text(str(os.getpid()))
    return audited_epoch(loader, model, opt, folder, f"audit{start.rank}", start.rank, pause)


def live_train_table(table: Any, folder: str, pause: float) -> dict[str, Any]:
    """One epoch over a table whose ``id`` column numbers its rows, as
    :func:`live_train_images` over images: each batch's ids go to ``folder/audit<rank>``
    before its step."""
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import dask_ddp
    from dask_ddp.data import Loader

    start = dask_ddp.rank_info()
    loader = Loader(table, 4, seed=3, features=["x"], label="id", num_threads=1)
    torch.manual_seed(0)
    model = DDP(nn.Linear(1, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    dask_ddp.Checkpointer(model, opt, loader=loader)
    Path(folder, f"pid{start.rank}").write_text(str(os.getpid()))
    # One feature column keeps its row shape: [batch], a column of the Linear's input.
    return audited_epoch(loader, model, opt, folder, f"audit{start.rank}", start.rank, pause,
                         inputs=lambda x: x.view(-1, 1))


def live_train_join(root: Any, n: int, folder: str, hold: int,
                    epochs: int = 1) -> dict[str, Any]:
    """The README's loop for a live job that may grow: a Checkpointer with an LR
    scheduler, ``restore()``'s step, ``for x, y in loader`` over ``epochs`` epochs of ``n``
    images whose labels are their indices (``root`` a folder; each batch's labels go to
    ``folder/audit<rank>`` as ``epoch step label,...``), or of a table's rows (``root`` a
    table: ``x`` the feature, ``id`` the label), or ``n`` steps on random batches
    (``root=None``). The ranks of
    the job's start wait at step ``hold`` until ``folder/go`` exists (the test lets them
    on once the worker a rank joins from is up); the ranks' first models differ (a
    joining rank must take the group's)."""
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import dask_ddp
    from dask_ddp.data import ImageList, Loader
    from dask_ddp.data import transforms as T

    uid = dask_ddp.rank_info().rank
    loader = None
    width = 3 * 8 * 8
    if root is not None and not isinstance(root, str):
        loader, width = Loader(root, 2, seed=3, features=["x"], label="id", num_threads=1), 1
    elif root is not None:
        keys = sorted(str(p.relative_to(root)) for p in Path(root).rglob("*.jpg"))[:n]
        loader = Loader(ImageList(root, keys, list(range(len(keys)))), 2, seed=3,
                        transform=T.Compose([T.Resize((8, 8)), T.ToTensor()]), num_threads=1)
    torch.manual_seed(uid)
    model = DDP(nn.Sequential(nn.Flatten(), nn.Linear(width, 16), nn.ReLU(),
                              nn.Linear(16, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, 7, 0.9)
    Path(folder, f"pid{uid}").write_text(str(os.getpid()))
    ckpt = dask_ddp.Checkpointer(model, opt, sched, loader=loader)  # a joiner joins here
    step = ckpt.restore().get("step", 0)
    gen = torch.Generator().manual_seed(1000 + uid)

    def batches() -> Any:
        if loader is None:
            yield from ((torch.rand(2, 3, 8, 8, generator=gen), None) for _ in range(n - step))
            return
        while loader.epoch < epochs:
            yield from loader
            loader.set_epoch(loader.epoch + 1)

    audit = Path(folder, f"audit{uid}").open("a")
    for x, y in batches():
        if step == hold:
            deadline = time.monotonic() + 120
            while not Path(folder, "go").exists():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rank {uid}: no {folder}/go within 120 s")
                time.sleep(0.05)
        if y is not None:
            assert loader is not None
            audit.write(f"{loader.epoch} {step + 1} {','.join(str(int(v)) for v in y)}\n")
            audit.flush()
        loss = model(x.view(len(x), -1)).square().mean()  # a table's one column: [batch]
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        step += 1
        Path(folder, f"step{uid}").write_text(str(step))
        time.sleep(0.03)
    now = dask_ddp.rank_info()
    rng = hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest()
    return {"hash": state_hash(model, opt), "lr": sched.get_last_lr(), "rng": rng,
            "uid": uid, "rank": now.rank, "world": now.world_size,
            "generation": now.generation, "step": step}


def id_frame(client: Any, n: int, parts: int) -> Any:
    """A persisted Dask DataFrame of ``n`` rows: ``id`` numbers them, ``x`` (float32) is
    the feature (skips the test without pandas)."""
    import pytest

    pd = pytest.importorskip("pandas")
    dd = pytest.importorskip("dask.dataframe")
    frame = pd.DataFrame({"id": range(n), "x": [float(i) for i in range(n)]}).astype(
        {"x": "float32"})
    return client.persist(dd.from_pandas(frame, parts))
