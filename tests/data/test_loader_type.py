"""The kind of a dataset, told in one place (``data/loader_type.py``), and what makes
``Loader(dataset)`` for it."""

from __future__ import annotations

import pytest
from torch.utils.data import Subset

from dask_ddp.data import ImageList
from dask_ddp.data.loader_type import Kind, kind_of, maker_of


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


def test_the_maker_follows_the_kind() -> None:
    """Images (and any Source) are made by the Loader's own ``__init__``; a table by
    ``TableLoader``, a Dask collection by the pending maker; in-memory data is refused."""
    from dask_ddp.data import TableLoader
    from dask_ddp.data.table.pending import pending_loader

    dd = pytest.importorskip("dask.dataframe")
    pd = pytest.importorskip("pandas")
    images = ImageList("memory://kind-of", ["a.jpg"], [0])
    assert maker_of(images) is None
    assert maker_of(Subset(images, [0])) is None
    assert maker_of(dd.from_pandas(pd.DataFrame({"a": [1.0]}), npartitions=1)) is pending_loader
    table = pytest.importorskip("dask_ddp.data.table.table")
    assert maker_of(object.__new__(table.Table)) is TableLoader
    with pytest.raises(TypeError, match="Loader got a list"):
        maker_of([1, 2])
