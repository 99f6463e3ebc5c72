"""The submitted call checked on the client (_launch/client/payload.py): a typo in a submit
option, an argument the function does not take and what cannot be pickled fail at once,
naming it; a rank's traceback names the user's file and source line."""

from __future__ import annotations

import importlib.util
import logging
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import dask_ddp
from cluster_util import client_fixture
from dask_ddp._launch.client import payload

client = client_fixture(2)


def _train(epochs: int, lr: float = 0.1) -> int:
    return epochs


def _train_any(epochs: int, **extra: Any) -> int:
    return epochs


def test_a_typo_in_a_submit_option_fails_at_once(client: Any) -> None:
    before = set(client.futures)
    t0 = time.monotonic()
    with pytest.raises(TypeError, match=r"ouput_dir= is not an option of submit\(\) "
                                        r"\(did you mean output_dir=\?\)") as info:
        dask_ddp.submit(client, _train, 2, ouput_dir="/tmp/x", progress=False)
    assert "_train(epochs: 'int', lr: 'float' = 0.1)" in str(info.value)
    assert time.monotonic() - t0 < 5  # no rank was started, nothing waited for
    assert set(client.futures) == before
    with pytest.raises(TypeError,
                       match=r"takes no keyword argument 'epoch' \(did you mean epochs=\?\)"):
        dask_ddp.submit(client, _train, epoch=2, progress=False)
    with pytest.raises(TypeError, match="missing a required argument: 'epochs'"):
        dask_ddp.submit(client, _train, progress=False)


def test_a_near_miss_taken_by_kwargs_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "dask_ddp._launch.client.payload"):
        payload.check_call(_train_any, (1,), {"max_restart": 2, "other": 1},
                           ["max_restarts", "output_dir"])
    assert [r.getMessage() for r in caplog.records] == [
        "submit(): max_restart= goes to the training function _train_any (its **kwargs); "
        "if you meant the launcher's option, it is max_restarts="]


def test_what_cannot_be_pickled_is_named(client: Any) -> None:
    lock = threading.Lock()

    def uses_lock() -> int:
        with lock:
            return 1

    with pytest.raises(TypeError, match=r"the training function .*uses_lock \(its variable "
                                        r"'lock', a lock\) cannot be pickled"):
        dask_ddp.submit(client, uses_lock, progress=False)
    with pytest.raises(TypeError, match=r"keyword argument 'lr' \(lock\) cannot be pickled"):
        dask_ddp.submit(client, _train, 1, lr=lock, progress=False)
    with pytest.raises(TypeError, match=r"positional argument 0 \(lock\) cannot be pickled"):
        dask_ddp.dispatch.run(client, _train, lock)


USER_FILE = '''
import torch.distributed as dist


def helper(x):
    return {"a": 1}[x]


def train(key):
    dist.barrier()
    return helper(key)
'''


def test_a_rank_traceback_names_the_users_file_and_line(client: Any, tmp_path: Path) -> None:
    # Loaded without a module in sys.modules, as a script's __main__: cloudpickle ships the
    # functions by value, and the rank sees their code as "<dynamic-code>".
    path = tmp_path / "user_train.py"
    path.write_text(textwrap.dedent(USER_FILE))
    spec = importlib.util.spec_from_file_location("user_train_by_value", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    job = dask_ddp.submit(client, module.train, "b", progress=False)
    with pytest.raises(dask_ddp.RankFailedError) as info:
        job.result(timeout=120)
    text = str(info.value)
    assert "<dynamic-code>" not in text, text
    assert f'File "{path}", line 11, in train\n' in text and "return helper(key)" in text
    assert f'File "{path}", line 6, in helper\n' in text and 'return {"a": 1}[x]' in text
    assert "<dynamic-code>" not in info.value.remote_traceback


def test_with_sources_leaves_unknown_frames() -> None:
    text = '  File "<dynamic-code>", line 3, in other\n'
    assert payload.with_sources(text, [("train", "/x.py", 1, 9)]) == text
