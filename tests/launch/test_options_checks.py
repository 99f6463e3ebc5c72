"""A launch's options refuse what cannot work before any rank starts, naming the fix."""

from __future__ import annotations

import cloudpickle
import pytest

from dask_ddp._launch.wire.options import LaunchOptions

PAYLOAD = cloudpickle.dumps((print, (), {}))


@pytest.mark.parametrize(("backend", "why"), [
    ("nccl", "a rank lost inside an NCCL all-reduce .* not detect yet"),
    ("mpi", "torch.s MPI group is MPI_COMM_WORLD")])
def test_live_recovery_refuses_a_backend_it_cannot_recover_on(backend: str, why: str) -> None:
    with pytest.raises(ValueError, match=rf"recovery='live' runs on gloo.*'{backend}': {why}.*"
                                         r"recovery='restart'"):
        LaunchOptions(name="t", payload=PAYLOAD, backend=backend, recovery="live")


@pytest.mark.parametrize("backend", ["auto", "gloo"])
def test_live_recovery_takes_auto_and_gloo(backend: str) -> None:
    opts = LaunchOptions(name="t", payload=PAYLOAD, backend=backend, recovery="live")
    assert opts.backend == backend
