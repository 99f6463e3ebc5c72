"""dask_ddp.predict over images in a real S3 server (moto's, over HTTP on 127.0.0.1) on a real
LocalCluster: an image folder given as its s3:// URL and tar shards, each equal to the same
model over the engine's Loader on a local copy of the same files, in this process."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from distributed import Client

import dask_ddp
from cluster_util import cluster_client
from dask_ddp import storage
from dask_ddp.data import ImageFolder, TarShards
from images import encode, file_putter, photo, write_folder
from predict_util import TRANSFORM, TinyCnn, assert_close_f32, engine_outputs, tar_shard

pytestmark = pytest.mark.timeout(240)

OUTPUTS = [f"out_{i}" for i in range(5)]


@pytest.fixture(scope="module")
def client(s3_server: str) -> Iterator[Client]:
    """A cluster started once the moto server runs: its workers inherit the AWS variables
    naming it (a store reads credentials and endpoint from the environment it opens in)."""
    # A cluster of its own: its workers' environment from their start is under test.
    with cluster_client(2) as c:
        yield c


def both(bucket: str, prefix: str, root: Path) -> Callable[[str, bytes], None]:
    """``put`` writing each object to ``s3://bucket/prefix/`` and to the folder ``root``."""
    s3 = storage.open(f"s3://{bucket}/{prefix}")
    local = file_putter(str(root))

    def put(key: str, data: bytes) -> None:
        s3.put(key, data)
        local(key, data)

    return put


def test_image_folder_url_on_s3(client: Client, s3_bucket: str, tmp_path: Path) -> None:
    written = write_folder(both(s3_bucket, "val", tmp_path), ["ant", "bee", "cat"], 7,
                           kinds=("jpeg", "png", "jpeg-progressive"))
    out = dask_ddp.predict(TinyCnn, f"s3://{s3_bucket}/val", transform=TRANSFORM,
                           partition_size=8, batch_size=5)
    assert out.npartitions == 3
    got = out.compute()
    assert list(got.index) == list(range(21))
    assert list(got["key"]) == [f"s3://{s3_bucket}/val/{k}" for k, _ in written]
    want, labels = engine_outputs(ImageFolder(str(tmp_path)))
    assert list(got["label"]) == list(labels) == [label for _, label in written]
    assert_close_f32(got[OUTPUTS].to_numpy(), want)


def test_tar_shards_on_s3(client: Client, s3_bucket: str, tmp_path: Path) -> None:
    put = both(s3_bucket, "shards", tmp_path)
    for s in range(2):
        samples = [(f"s{s}_{i:03d}", encode(photo(48, 36, 7 * s + i), "jpeg"), (s + i) % 3)
                   for i in range(5 + 2 * s)]
        put(f"shard-{s:03d}.tar", tar_shard(samples))
    ds = TarShards(f"s3://{s3_bucket}/shards/shard-{{000..001}}.tar", transform=TRANSFORM)
    out = dask_ddp.predict(TinyCnn, ds, batch_size=3)
    assert out.npartitions == 2
    got = out.compute()
    assert list(got.index) == list(range(12))
    assert got["key"].iloc[5] == f"s3://{s3_bucket}/shards/shard-001.tar#0"
    want, labels = engine_outputs(TarShards(str(tmp_path / "shard-{000..001}.tar")))
    assert list(got["label"]) == list(labels)
    assert_close_f32(got[OUTPUTS].to_numpy(), want)
