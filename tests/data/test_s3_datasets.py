"""ImageFolder, the seed's S3ImageFolder and the Loader over a real (moto) S3 server."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from torchvision import transforms as tv

from dask_ddp import storage
from dask_ddp.data import ImageFolder, Loader, S3ImageFolder
from dask_ddp.data import transforms as T
from images import encode, file_putter, photo, truncated, write_folder

pytestmark = pytest.mark.s3

KINDS = ("jpeg", "jpeg-cmyk", "png-palette", "jpeg-progressive")
TRAIN = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToTensor()])


def upload(bucket: str, prefix: str, tmp_path: object) -> list[tuple[str, int]]:
    s3 = storage.open(f"s3://{bucket}/{prefix}")
    local = file_putter(str(tmp_path))

    def put(key: str, data: bytes) -> None:
        s3.put(key, data)
        local(key, data)

    written = write_folder(put, ("ant", "bee"), 6, kinds=KINDS)
    s3.put("bee/notes.txt", b"not an image")
    return written


def test_s3_image_folder_with_torchvision_in_a_dataloader(s3_bucket: str, tmp_path) -> None:
    written = upload(s3_bucket, "train", tmp_path)
    tf = tv.Compose([tv.Resize(40), tv.CenterCrop(32), tv.ToTensor()])
    ds = S3ImageFolder(s3_bucket, "train", transform=tf)
    assert ds.classes == ["ant", "bee"]
    assert ds.all_files == [f"train/{k}" for k, _ in written]
    assert ds.targets == [label for _, label in written]
    assert ds.samples[0][0] == f"s3://{s3_bucket}/train/{written[0][0]}"
    local = ImageFolder(tmp_path, transform=tf)
    dl = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2)
    images = torch.cat([x for x, _ in dl])
    labels = torch.cat([y for _, y in dl])
    assert labels.tolist() == ds.targets
    want = torch.stack([local[i][0] for i in range(len(local))])
    assert torch.equal(images, want)


def test_loader_over_s3_equals_loader_over_local_files(s3_bucket: str, tmp_path) -> None:
    upload(s3_bucket, "data", tmp_path)
    over_s3 = Loader(ImageFolder(f"s3://{s3_bucket}/data"), 5, transform=TRAIN, seed=2)
    over_disk = Loader(ImageFolder(tmp_path), 5, transform=TRAIN, seed=2)
    for loader in (over_s3, over_disk):
        loader.set_epoch(1)
    next(iter(over_s3))  # abandon an epoch with fetches in flight; the next one restarts
    a = [(x.clone(), y.clone()) for x, y in over_s3]
    b = [(x.clone(), y.clone()) for x, y in over_disk]
    assert len(a) == len(b) == 3
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_bad_objects_in_s3(s3_bucket: str) -> None:
    s3 = storage.open(f"s3://{s3_bucket}")
    write_folder(s3.put, ("x",), 3, sizes=((40, 30),))
    s3.put("x/cut.jpg", truncated(encode(photo(200, 100), "jpeg"), 0.4))
    s3.put("x/empty.jpg", b"")
    ds = S3ImageFolder(s3_bucket, "")
    evl = T.Compose([T.CenterCrop(16), T.ToTensor()])
    with pytest.raises((OSError, ValueError)) as info:
        list(Loader(ds, 5, transform=evl, shuffle=False))
    assert f"s3://{s3_bucket}/x/cut.jpg" in str(info.value)
    skip = Loader(ds, 5, transform=evl, on_error="skip")
    assert sum(x.shape[0] for x, _ in skip) == 3 and skip.skipped == 2
    s3.delete("x/img_0001.jpg")
    with pytest.raises(FileNotFoundError, match="img_0001"):
        list(Loader(ds, 5, transform=evl, on_error="skip"))


def test_seed_signature_and_anon_flag(s3_bucket: str) -> None:
    s3 = storage.open(f"s3://{s3_bucket}/p")
    write_folder(s3.put, ("c",), 2, sizes=((20, 20),))
    ds = S3ImageFolder(s3_bucket, "p/", None, None, False)
    img, label = ds[1]
    assert img.size == (20, 20) and label == 0
    assert np.asarray(img).dtype == np.uint8
    with pytest.raises(ValueError, match="bucket name"):
        S3ImageFolder("bucket/with/slash", "p")


def test_loader_reads_through_the_datasets_own_store_options(
    s3_bucket: str, s3_server: str, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """endpoint_url and region given to the dataset (no AWS_ENDPOINT_URL*/AWS_REGION in
    the environment) reach the Loader's store: it used to reopen the store from (url,
    anon) alone and so went to AWS instead of the given endpoint."""
    upload(s3_bucket, "opts", tmp_path)
    for var in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    options = {"endpoint_url": s3_server, "region": "us-east-1", "max_attempts": 2}
    ds = ImageFolder(f"s3://{s3_bucket}/opts", storage_options=options)
    assert ds.classes == ["ant", "bee"]
    loader = Loader(ds, batch_size=4, transform=TRAIN, num_threads=2, shuffle=False)
    got = [y for _, y in loader]
    assert torch.cat(got).tolist() == ds.targets
    local = Loader(ImageFolder(tmp_path), batch_size=4, transform=TRAIN, shuffle=False)
    for (a, _), (b, _) in zip(loader, local, strict=True):
        assert torch.equal(a, b)
    # The options travel with the dataset (pickled to a DataLoader worker or a rank).
    again = pickle.loads(pickle.dumps(ds))
    assert again.storage_options == options
    assert len(list(Loader(again, batch_size=4, transform=TRAIN))) == len(loader)
