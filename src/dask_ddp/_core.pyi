"""
C++ engine of dask-ddp: object stores, image decode and the batch loader.
"""

from collections.abc import Sequence
from typing import overload

import numpy
from numpy.typing import NDArray
import torch


class ObjectInfo:
    """An object's key (relative to the store root) and size."""

    @overload
    def __init__(self) -> None: ...

    @overload
    def __init__(self, key: str, size: int) -> None: ...

    @property
    def key(self) -> str:
        """The key, relative to the store root."""

    @key.setter
    def key(self, arg: str, /) -> None: ...

    @property
    def size(self) -> int:
        """Size in bytes."""

    @size.setter
    def size(self, arg: int, /) -> None: ...

    def __eq__(self, other: object, /) -> bool: ...

    def __repr__(self) -> str: ...

class GetManyIterator:
    """Iterator of (key, bytes) in completion order (see Store.get_many)."""

    def __iter__(self) -> object: ...

    def __next__(self) -> tuple: ...

class Store:
    """An object store opened on a root URL (see open_store)."""

    @property
    def url(self) -> str:
        """The root URL (normalised, no credentials)."""

    def list(self, prefix: str = '') -> list[ObjectInfo]:
        """Every object whose key starts with `prefix`, sorted by key."""

    def stat(self, key: str) -> ObjectInfo:
        """The object's size; FileNotFoundError if missing."""

    def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        """
        The object's bytes, or `length` bytes from `offset` (None: to the end).
        """

    def put(self, key: str, data: object) -> None:
        """Write an object (atomically replacing any old one)."""

    def delete(self, key: str) -> None:
        """Delete an object; deleting a missing key is not an error."""

    def get_many(self, keys: Sequence[str], max_in_flight: int = 0) -> GetManyIterator:
        """
        Fetch many objects concurrently; an iterator of (key, bytes) in completion order.
        """

def open_store(url: str, *, anonymous: bool = False, endpoint_url: str = '', region: str = '', ca_bundle: str = '', max_attempts: int = 5, initial_backoff: float = 0.05, max_backoff: float = 5.0, multipart_threshold: int = 16777216, multipart_part_size: int = 8388608, max_in_flight: int = 64, connect_timeout: float = 10.0, low_speed_timeout: float = 30.0) -> Store:
    """
    Open the store for a URL: file:// or a plain path, s3://, http(s)://, memory://.
    """

def decode_image(data: bytes, url: str = '', max_side: int = 16384, scale_denom: int = 1) -> NDArray[numpy.uint8]:
    """
    Decode JPEG or PNG bytes to an RGB uint8 array (H, W, 3). `url` names the data in errors.
    """

def image_info(data: bytes, url: str = '', max_side: int = 16384) -> tuple:
    """(width, height, format) from the header."""

def transform_image(data: bytes, ops: Sequence[tuple[str, Sequence[float]]], seed: int = 0, epoch: int = 0, index: int = 0, scaled_decode: bool = False, region_decode: bool = False, url: str = '') -> NDArray:
    """
    Decode one image and apply transform ops, as the loader does for sample `index`; returns a (3, H, W) numpy array.
    """

def sample_plan(width: int, height: int, ops: Sequence[tuple[str, Sequence[float]]], seed: int = 0, epoch: int = 0, index: int = 0, scaled_decode: bool = False, region_decode: bool = False) -> tuple:
    """
    The random choices the loader makes for sample `index` of an image of this size: (RandomResizedCrop boxes as (top, left, height, width), flips, JPEG scale denominator, decoded region as (top, left, height, width) or None).
    """

def rrc_box(width: int, height: int, scale: Sequence[float], ratio: Sequence[float], draws: Sequence[float]) -> tuple:
    """
    RandomResizedCrop's (top, left, height, width) for an image, using `draws` (uniform [0, 1) values) where torchvision draws random numbers; also returns how many were used.
    """

def decode_throughput(blobs: Sequence[bytes], num_threads: int, rounds: int = 1, scale_denom: int = 1) -> float:
    """
    Images per second of full-size decode only (no fetch, no transform) on N threads.
    """

class ImageLoader:
    """The C++ batch loader (use dask_ddp.data.Loader)."""

    def __init__(self, url: str, anonymous: bool, keys: Sequence[str], labels: Sequence[int], ops: Sequence[tuple[str, Sequence[float]]], batch_size: int, shuffle: bool, seed: int, rank: int, world_size: int, drop_last: bool, num_threads: int, prefetch: int, skip_errors: bool, max_side: int, scaled_decode: bool, region_decode: bool = True, max_in_flight: int = 0, skip_missing: bool = False) -> None: ...

    def start_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Start (or restart) an epoch at a batch; cancels work in flight."""

    def next(self) -> tuple[torch.Tensor, torch.Tensor, int] | None:
        """The next (images, labels, batch_index), or None at the epoch's end."""

    def close(self) -> None:
        """Stop the threads and free the buffers not held by tensors."""

    @property
    def num_batches(self) -> int: ...

    @property
    def num_samples(self) -> int: ...

    @property
    def skipped(self) -> int: ...

    @property
    def sample_shape(self) -> tuple: ...

    @property
    def float_output(self) -> bool: ...
