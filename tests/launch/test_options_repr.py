"""A job's options reach worker logs (a failed task's repr, shown on Dask's dashboard):
no storage password and no environment value may appear there."""

from __future__ import annotations

import cloudpickle

from dask_ddp._launch.wire.options import LaunchOptions
from dask_ddp._launch.wire.rank_spec import RankSpec

SECRET = "Sup3rSecretPw"


def test_the_repr_names_no_credentials() -> None:
    opts = LaunchOptions(name="train", payload=cloudpickle.dumps((print, (), {})),
                         storage=f"http://user:{SECRET}@10.0.0.1:9000/bucket/run",
                         env={"AWS_SECRET_ACCESS_KEY": SECRET, "LR": "0.1"})
    spec = RankSpec(options=opts, job_id="0" * 32, run_id="0" * 32, restart=0, rank=0,
                    local_rank=0, local_world_size=1, group_rank=0, group_world_size=1,
                    proc_index=0, workers=("tcp://10.0.0.1:1",), master_addr="10.0.0.1",
                    scheduler="tcp://10.0.0.1:8786")
    for text in (repr(opts), repr(spec)):
        assert SECRET not in text, text
        assert "10.0.0.1:9000/bucket/run" in text and "AWS_SECRET_ACCESS_KEY" in text, text
        assert "name='train'" in text and "bytes>" in text
