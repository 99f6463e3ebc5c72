"""A live rank's hooks, without a process group: what a regroup counts of a lost member's
epoch, and where a rank asked to leave leaves."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from dask_ddp._launch.rank.live.attach import Attached
from dask_ddp.data import ImageList, Loader
from dask_ddp.data import transforms as T
from dask_ddp.data.unread import rank_indices
from images import file_putter, write_folder

N = 30


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> ImageList:
    root = tmp_path_factory.mktemp("attach-imgs")
    keys = [k for k, _ in write_folder(file_putter(str(root)), ["a"], N, sizes=((6, 6),))]
    return ImageList(str(root), keys, list(range(N)))


def _attached(images: ImageList, taken: int) -> tuple[Attached, Loader]:
    """Rank 0 of 3 (members 0 and 1 left after a loss of 2) that took ``taken`` batches."""
    loader = Loader(images, 2, transform=T.Compose([T.Resize((4, 4)), T.ToTensor()]),
                    seed=5, rank=0, world_size=3, num_threads=1)
    group: Any = SimpleNamespace(joining=False, data_position=(0, taken), members=[0, 1],
                                 lost=[2], leaving=False)
    return Attached(group, None, None, loader), loader


def test_a_regroup_inside_a_step_leaves_out_only_the_batch_in_hand(images: ImageList) -> None:
    """From a failed backward(), rank 0 holds the step's batch, which no lost member
    trained on: their unread samples start one batch before rank 0's count; at a step's
    top (an admission that found a member gone, having left at that boundary) every batch
    rank 0 took was counted, so they start at its count (before, that member's last
    counted batch was read a second time)."""
    att, loader = _attached(images, 3)
    shard = rank_indices(N, 0, 2, 3, seed=5)
    try:
        att.in_step = True
        assert att.shared_state([], [2], att.group.data_position)["lost_deal"] == (0, shard[2 * 2:])
        att.in_step = False
        assert att.shared_state([], [2], att.group.data_position)["lost_deal"] == (0, shard[3 * 2:])
    finally:
        loader.close()


def test_a_rank_asked_to_leave_leaves_at_the_top_of_a_step(images: ImageList) -> None:
    """Not inside optimizer.step(): the loop finishes the step the group counts (what it
    does after the optimizer's step runs), and leaves when it asks for the next batch."""
    att, loader = _attached(images, 0)
    left: list[str] = []
    group: Any = att.group
    group.leave_now = lambda: left.append("left")
    try:
        step = att.wrap_step(lambda: "stepped")
        group.committed = 0
        group.leaving = True
        assert step() == "stepped" and not left  # the step returns to the loop
        att.boundary()  # the registered loader's next batch, or the forward
        assert left == ["left"]
    finally:
        loader.close()


def test_leaving_happens_before_an_admission(images: ImageList) -> None:
    """A rank asked to leave at the boundary where the group admits a joiner leaves there
    instead of taking part: the others' admission then finds it gone (an ordinary regroup,
    counted at the step's top)."""
    att, loader = _attached(images, 0)
    calls: list[str] = []
    group: Any = att.group
    group.leave_now = lambda: calls.append("left")
    att._admit = lambda: calls.append("admitted")  # type: ignore[method-assign]
    try:
        group.leaving, att.grads.admit = True, True
        att.boundary()
        assert calls[0] == "left", calls
    finally:
        loader.close()


@pytest.mark.parametrize("chained", [False, True])
def test_a_survivor_one_step_behind_steps_its_lr_schedule_once(chained: bool) -> None:
    """A loss mid all-reduce that completed on one survivor (it stepped, then ran the
    rest of its loop: the LR scheduler's step) and failed on another: the one behind
    takes the parameters and optimizer state after the step, skips its optimizer.step()
    and runs the rest of its loop from its own schedule. Before, it took the survivor's
    stepped scheduler and stepped it again: one step ahead, and a decay applied twice by
    a chainable scheduler, which scales the optimizer's current lr (the live join test's
    survivors once ended with different models)."""
    import torch

    def replica() -> tuple[Any, Any, Any]:
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        sched: Any = torch.optim.lr_scheduler.StepLR(opt, 2, 0.5)
        if chained:
            sched = torch.optim.lr_scheduler.ChainedScheduler(
                [sched, torch.optim.lr_scheduler.ExponentialLR(opt, 0.9)])
        return model, opt, sched

    def loop(model: Any, opt: Any, sched: Any, x: Any) -> None:
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        sched.step()

    xs = [torch.full((4, 3), float(i + 1)) for i in range(4)]
    ahead, behind, alone = replica(), replica(), replica()
    for r in (ahead, behind, alone):
        loop(*r, xs[0])
    loop(*ahead, xs[1])  # step 2 completed on the survivor: StepLR halves the lr here
    loop(*alone, xs[1])  # what an undisturbed rank does: the reference

    model, opt, sched = behind
    group: Any = SimpleNamespace(joining=False, committed=1, members=[0, 1], lost=[2],
                                 leaving=False, rank=1, uid=1)
    att = Attached(group, None, opt, None, sched)
    opt.step = att.wrap_step(opt.step)

    def regroup(_cause: str) -> int:
        """The handoff: the survivor's parameters and state (it is new rank 0)."""
        with torch.no_grad():
            for mine, theirs in zip(model.parameters(), ahead[0].parameters(), strict=True):
                mine.copy_(theirs)
        state = {"optimizer": ahead[1].state_dict(), "scheduler": ahead[2].state_dict(),
                 "rng": torch.get_rng_state(), "deal": None, "lost_deal": None}
        att.take_shared_state(state, 1, 2, joined=False, joining=False)  # type: ignore[arg-type]
        return 2

    group.regroup = regroup
    att.grads.failed = "RuntimeError: Connection closed by peer"
    opt.zero_grad()
    model(xs[1]).square().mean().backward()
    att.end_of_backward()  # the failed step's regroup, from the end of backward()
    assert att.skip_step and group.committed == 2
    opt.step()  # skipped
    sched.step()  # the rest of the loop
    assert sched.state_dict() == alone[2].state_dict()
    assert sched.get_last_lr() == alone[2].get_last_lr()
    assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in alone[1].param_groups]
    for r in (behind, alone):  # one more step each: the same model
        loop(*r, xs[2])
    for mine, ref in zip(model.parameters(), alone[0].parameters(), strict=True):
        assert torch.equal(mine, ref)
