"""A dataset's store: opened once per process, pickled without its handle."""

from __future__ import annotations

import pickle

from dask_ddp import storage
from dask_ddp.data.datasets import ImageList
from dask_ddp.data.process_store import ProcessStore


def test_opened_once_and_reopened_after_unpickling() -> None:
    opened = ProcessStore("memory://process-store", storage_options={})
    store = opened.get()
    assert opened.get() is store
    copy = pickle.loads(pickle.dumps(opened))
    assert copy._store is None and copy.url == opened.url
    assert copy.get() is not store and copy.get().url == store.url


def test_a_given_store_is_used_in_its_process() -> None:
    store = storage.open("memory://process-store-given")
    assert ProcessStore("memory://process-store-given", store=store).get() is store


def test_image_list_reads_through_it_after_pickling() -> None:
    storage.open("memory://process-store-list").put("a/1.jpg", b"x")
    ds = ImageList("memory://process-store-list", ["a/1.jpg"], [0])
    copy = pickle.loads(pickle.dumps(ds))
    assert copy.store.get("a/1.jpg") == b"x" and copy.keys == ["a/1.jpg"]
    assert copy.samples == ds.samples and repr(copy) == repr(ds)
