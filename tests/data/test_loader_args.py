"""The Loader's arguments in a REPL: a real signature, and data it does not read named
with the fix (no cluster)."""

from __future__ import annotations

import inspect

import numpy as np
import pandas as pd
import pytest

from dask_ddp.data import Loader, TableLoader


def test_signatures_show_the_parameters() -> None:
    params = inspect.signature(Loader).parameters
    assert list(params)[:2] == ["dataset", "batch_size"]
    assert "transform" in params and "self" not in params
    table_params = inspect.signature(TableLoader).parameters
    assert list(table_params)[:2] == ["table", "batch_size"]
    assert {"features", "label", "window"} <= set(table_params)


def test_the_table_loaders_class_names_the_loaders_methods() -> None:
    # TableLoader.state_dict and the like, read off the class (as help() and autodoc do),
    # are the Loader's: a table Loader is a Loader.
    for name in ("state_dict", "load_state_dict", "set_epoch", "reshard", "close"):
        assert getattr(TableLoader, name) is getattr(Loader, name)
    with pytest.raises(AttributeError):
        TableLoader.no_such_member  # noqa: B018


@pytest.mark.parametrize("data, named", [
    (pd.DataFrame({"a": [1.0], "y": [0]}), "pandas DataFrame"),
    (pd.Series([1.0]), "pandas Series"),
    ([1, 2, 3], "a list"),
    (np.zeros((4, 2)), "numpy.ndarray"),
])
def test_in_memory_data_is_named_with_the_fix(data: object, named: str) -> None:
    # features= is a TableLoader option: the error names the data, not the keyword.
    with pytest.raises(TypeError, match=named) as info:
        Loader(data, 4, features=["a"], label="y")
    assert "submit()" in str(info.value)
    assert "unexpected keyword" not in str(info.value)
