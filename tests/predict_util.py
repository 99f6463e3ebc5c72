"""Rank-side functions of the predict tests (an importable module, so rank processes can
unpickle them by reference): a small regression job whose checkpoints are scored while it
trains."""

from __future__ import annotations

from typing import Any

import torch


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(3, 1)


def mse(out: Any, df: Any) -> dict[str, Any]:
    """The evaluation's score: mean squared error of ``out_0`` against ``y`` (lazy)."""
    return {"mse": ((out["out_0"] - df["y"]) ** 2).mean()}


def train_with_evaluation(x: Any, y: Any, steps: int, every: int, storage: str,
                          evaluate: Any) -> int:
    """Full-batch SGD on (x, y); a checkpoint every ``every`` steps, each scored on the
    cluster by ``evaluate`` while the loop goes on."""
    import dask_ddp

    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt = dask_ddp.Checkpointer(model, opt, storage=storage, evaluate=evaluate)
    xt, yt = torch.as_tensor(x), torch.as_tensor(y)[:, None]
    for step in range(1, steps + 1):
        loss = torch.nn.functional.mse_loss(model(xt), yt)
        opt.zero_grad()
        loss.backward()
        opt.step()
        dask_ddp.report({"loss": loss.item()}, step=step)
        if step % every == 0:
            ckpt.save(step)
    ckpt.wait(120)
    return steps
