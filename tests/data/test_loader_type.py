"""The kind of a dataset, told in one place (``data/loader_type.py``), and the Loader
class ``Loader(dataset)`` makes for it."""

from __future__ import annotations

import pytest
from torch.utils.data import Subset

from dask_ddp.data import ImageList, Loader
from dask_ddp.data.loader_type import Kind, kind_of, loader_type


def test_each_kind_is_told_from_the_type_alone() -> None:
    da = pytest.importorskip("dask.array")
    dd = pytest.importorskip("dask.dataframe")
    pd = pytest.importorskip("pandas")
    images = ImageList("memory://kind-of", ["a.jpg", "b.jpg"], [0, 1])
    frame = dd.from_pandas(pd.DataFrame({"a": [1.0, 2.0]}), npartitions=1)
    assert kind_of(images) is Kind.IMAGES
    assert kind_of(Subset(images, [1])) is Kind.IMAGES
    assert kind_of(frame) is kind_of(frame["a"]) is Kind.FRAME
    assert kind_of(da.zeros(4)) is Kind.ARRAY
    for other in ([1, 2], "s3://bucket/train", None, pd.DataFrame({"a": [1]})):
        assert kind_of(other) is None


def test_the_loader_class_follows_the_kind() -> None:
    images = ImageList("memory://kind-of", ["a.jpg"], [0])
    assert loader_type(Loader, images) is Loader

    class Mine(Loader):
        pass

    assert loader_type(Mine, images) is Mine
    with pytest.raises(TypeError, match="Loader got a list"):
        loader_type(Loader, [1, 2])
