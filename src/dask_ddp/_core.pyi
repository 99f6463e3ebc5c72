"""
C++ engine of dask-ddp: object stores, image decode and the batch loader.
"""

from collections.abc import Sequence
from typing import Annotated, overload

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

def parse_url(url: str) -> tuple[str, str, bool]:
    """
    The engine's parse of a store URL: (scheme, location, local). `location` is the local path for file URLs and plain paths (file:///x and file://localhost/x are '/x'), the name for memory://, the URL itself for s3:// and http(s)://. ValueError names an unknown scheme or a file URL naming a host.
    """

def redact_url(url: str) -> str:
    """
    The URL without any 'user:password@' in its authority, for messages and logs.
    """

def open_store(url: str, *, anonymous: bool = False, endpoint_url: str = '', region: str = '', ca_bundle: str = '', max_attempts: int = 5, initial_backoff: float = 0.05, max_backoff: float = 5.0, multipart_threshold: int = 16777216, multipart_part_size: int = 8388608, max_in_flight: int = 64, connect_timeout: float = 10.0, low_speed_timeout: float = 30.0, max_body_bytes: int = 2147483648) -> Store:
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

def sampler_indices(n: int, epoch: int, rank: int, world_size: int, *, shuffle: bool = True, seed: int = 0, drop_last: bool = False) -> Annotated[NDArray[numpy.int64], dict(shape=(None,))]:
    """
    The dataset indices (int64 array) rank `rank` of `world_size` reads in `epoch`, in order: the engine's DistributedSampler (shuffle by (seed, epoch), padding by the order's head or dropping the tail, rank r at r, r + world_size, ...).
    """

class ImageLoader:
    """The C++ batch loader (use dask_ddp.data.Loader)."""

    def __init__(self, store: Store, keys: Sequence[str], labels: Sequence[int], ops: Sequence[tuple[str, Sequence[float]]], *, batch_size: int = 64, shuffle: bool = True, seed: int = 0, rank: int = 0, world_size: int = 1, drop_last: bool = False, num_threads: int = 0, prefetch: int = 4, skip_errors: bool = False, skip_missing: bool = False, max_side: int = 16384, scaled_decode: bool = True, region_decode: bool = True, max_in_flight: int = 0) -> None:
        """
        A loader reading `keys` (labels[i] for keys[i]) through `store` (an open Store, whose options it keeps), applying transform `ops` ((name, params) pairs).

        batch_size: samples per batch. shuffle, seed: the per-epoch order and every sample's random draws depend on (seed, epoch, index). rank, world_size: this process's shard (DistributedSampler semantics). drop_last: drop the uneven tail and the last short batch. num_threads: decode threads (0: one per core). prefetch: batch buffers in use (in flight plus held by the caller). skip_errors: leave bad images out (counted in `skipped`) instead of raising. skip_missing: with skip_errors, also skip keys naming no object. max_side: longest image side accepted. scaled_decode: allow JPEG DCT-scaled decode. region_decode: decode only the JPEG rows/columns a crop reads. max_in_flight: requests in flight for remote stores (0: the store's option).
        """

    def start_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Start (or restart) an epoch at a batch; cancels work in flight."""

    def restart(self, keys: Sequence[str], labels: Sequence[int]) -> None:
        """
        Read `keys` (labels[i] for keys[i], under the same store) from now on, keeping the threads, batch buffers (lent ones too) and options: cancels work in flight; next() returns None until start_epoch() starts the new list. Batches already returned stay as they are. ValueError for a loader over tar shards or a closed one, or when the counts of keys and labels differ.
        """

    def next(self) -> tuple[torch.Tensor, torch.Tensor, int] | None:
        """
        The next (images, labels, batch_index), or None at the epoch's end. Raises ValueError if the loader is (or gets) closed meanwhile.
        """

    def close(self) -> None:
        """
        Stop the threads and free the buffers not held by tensors. Safe from any thread, also while another waits in next(); closing twice is harmless.
        """

    @property
    def num_batches(self) -> int:
        """Batches per epoch for this rank."""

    @property
    def num_samples(self) -> int:
        """Samples per epoch for this rank (padding included)."""

    @property
    def skipped(self) -> int:
        """Samples left out so far (skip_errors)."""

    @property
    def decode_buffer_bytes(self) -> int:
        """Bytes of decode buffers the threads keep between samples."""

    @property
    def sample_shape(self) -> tuple:
        """(3, H, W) of each sample."""

    @property
    def float_output(self) -> bool:
        """Whether images are float32 (else uint8)."""

    @property
    def batch_buffer_bytes(self) -> int:
        """
        Bytes of one batch's images and labels: what each lent buffer must hold.
        """

    def adopt_buffers(self, buffers: Sequence[Annotated[NDArray[numpy.uint8], dict(shape=(None,), order='C', device='cpu')]]) -> None:
        """
        Lend the loader memory for batches, images and labels (1-D uint8 CPU arrays, 8-byte aligned, of at least batch_buffer_bytes each, e.g. pinned torch tensors' numpy views): used before its own buffers and kept referenced while a batch may use them.
        """

class TarShardLoader(ImageLoader):
    """The C++ batch loader over tar shards (use dask_ddp.data.Loader)."""

    def __init__(self, store: Store, keys: Sequence[str], counts: Sequence[int], ops: Sequence[tuple[str, Sequence[float]]], *, batch_size: int = 64, shuffle: bool = True, seed: int = 0, rank: int = 0, world_size: int = 1, drop_last: bool = False, num_threads: int = 0, prefetch: int = 4, skip_errors: bool = False, max_side: int = 16384, scaled_decode: bool = True, region_decode: bool = True, max_in_flight: int = 0, shuffle_buffer: int = 1000, label_field: str = '', lookahead_shards: int = 2, range_bytes: int = 8388608, fields: Sequence[str] = []) -> None:
        """
        A loader reading the tar shards `keys` of `store` (counts[i] samples in keys[i]) in the order of shard_rank_order, as ImageLoader does objects.

        shuffle_buffer: samples mixed within a rank. label_field: the integer field of each sample's .json member holding its label (empty: the .cls member). Shards stream as ranged GETs of range_bytes, parsed as they arrive: the current shard and lookahead_shards more read at once, two ranges ahead each. fields: the members that make a sample, by extension ('jpg;png' alternatives); then next() returns (images or None, labels, index, [the other fields: .npy stacked into one tensor, .cls/.idx an int64 tensor, else a list of bytes]). skip_errors also leaves out bad tar members and samples without an image. Other arguments as ImageLoader.
        """

    def set_epoch_segments(self, epoch: int, segments: Sequence[tuple[int, int, int]]) -> None:
        """
        For `epoch` only, read these (shard, begin, end) sample ranges instead of every shard whole.
        """

    def epoch_samples(self, epoch: int) -> int:
        """
        Samples this rank yields in `epoch` (the same on every rank; padding included).
        """

def tar_shard_counts(store: Store, keys: Sequence[str], skip_errors: bool = False, label_field: str = '', max_in_flight: int = 0, range_bytes: int = 8388608, fields: Sequence[str] = []) -> tuple:
    """
    (samples per shard, samples skipped): each shard streamed as ranged GETs of range_bytes and its tar headers parsed, max_in_flight shards at once (0: 8); with `fields`, a sample is good when it has every one of them.
    """

def shard_rank_order(counts: Sequence[int], segments: Sequence[tuple[int, int, int]] | None, epoch: int, rank: int, world_size: int, shuffle: bool = True, seed: int = 0, drop_last: bool = False, shuffle_buffer: int = 1000) -> tuple:
    """
    (sample ids in order, this rank's (shard, begin, end) parts in reading order, the epoch's segments) for a rank of a sharded dataset: `segments` the epoch's (shard, begin, end) list (None: every shard whole, shuffled by (seed, epoch)).
    """

def shard_unread_segments(counts: Sequence[int], segments: Sequence[tuple[int, int, int]] | None, epoch: int, position: int, world_size: int, shuffle: bool = True, seed: int = 0, drop_last: bool = False, shuffle_buffer: int = 1000) -> list[tuple[int, int, int]]:
    """
    The (shard, begin, end) runs of samples no rank of `world_size` had yielded once each yielded `position` samples of `epoch`, in the epoch's order.
    """

class GatherPool:
    """Threads of the table gather (the calling thread takes part)."""

    def __init__(self, threads: int) -> None: ...

    @property
    def threads(self) -> int:
        """Threads, the caller included."""

class TableWindow:
    """
    The column buffers of the table segments a rank holds, gathered into batches.

    columns: (name, row_bytes, record_bytes, record_offset, output, output_offset,
    [the uint8 records of each segment]);
    outputs: (DLPack type code, bits, shape after the batch dimension, row_bytes).
    """

    def __init__(self, columns: Sequence[tuple[str, int, int, int, int, int, Sequence[Annotated[NDArray[numpy.uint8], dict(shape=(None,), order='C', device='cpu', writable=False)]]]], segment_names: Sequence[str], segment_rows: Sequence[int], outputs: Sequence[tuple[int, int, Sequence[int], int]]) -> None: ...

    def gather(self, pool: GatherPool, segment: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)], row: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> list:
        """
        Rows row[i] of segments segment[i] as one tensor per output (GIL released).
        """

    @property
    def num_segments(self) -> int:
        """Segments in the window."""

def pack_records(out: Annotated[NDArray[numpy.uint8], dict(shape=(None, None), order='C', device='cpu')], columns: Sequence[tuple[str, Annotated[NDArray, dict(device='cpu', writable=False)], int, bool]], begin: int, rows: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)] | None, where: str) -> None:
    """
    Pack columns into records (uint8 [rows, record bytes]) in one pass, the GIL
    released. columns: (name, values, offset in the record, picked); record i takes
    row begin + i (rows[i] when rows is given) of each picked column, row i of the
    others. Errors name the column and `where`.
    """

def map_records(path: str, record_bytes: int) -> Annotated[NDArray[numpy.uint8], dict(shape=(None, None), writable=False)]:
    """
    A host cache file of a partition's records mapped read-only: uint8 [rows,
    record_bytes], owning the mapping. FileNotFoundError when not written yet; an
    error naming the file when its header or size is wrong.
    """

def write_records(path: str, records: Annotated[NDArray[numpy.uint8], dict(shape=(None, None), order='C', device='cpu', writable=False)]) -> None:
    """
    Write records (uint8 [rows, record bytes]) as the host cache file path (0600):
    a temporary file beside it, space reserved, then linked to path; a file already
    there is kept. OSError naming the file when the file system is full.
    """

def create_records_file(tmp: str, rows: int, record_bytes: int, token: bytes) -> None:
    """
    Make the temporary host cache file tmp (0600, new) of rows records for another
    process to write after the header: space reserved, token where the header goes.
    OSError naming the file when the file system has no room.
    """

def commit_records_file(tmp: str, path: str, rows: int, record_bytes: int) -> None:
    """
    Write the header of tmp (made by create_records_file, its records written) and
    link it to path (a file already there is kept); tmp is removed.
    """

def free_bytes(dir: str) -> int:
    """Bytes files may still take where dir is."""

def shuffle_rows(ids: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu')], seed: int, epoch: int, salt: int, window: int) -> None:
    """
    Permute ids (int64, in place) uniformly, in the order the key (seed, epoch, salt,
    window) gives (the GIL released).
    """

def windowed_sequence(counts: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], order: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], window: int, shuffle: bool, seed: int, epoch: int, salt: int, rows: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu')], wins: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu')]) -> None:
    """
    Fill rows and wins with the rows of the partitions order names, window
    partitions at a time (shuffled inside each window when shuffle) and each one's
    window. ValueError naming a bad count or order entry.
    """

def rank_sequence(counts: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], order: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], window: int, shuffle: bool, seed: int, epoch: int, salt: int, world: int, rank: int, drop_last: bool) -> tuple:
    """
    (rows, wins): rank's entries of the sequence windowed_sequence lays out, padded
    over world ranks as DistributedSampler pads (or cut, drop_last), without the
    whole sequence. ValueError naming a bad count, order entry or rank.
    """

def index_window(rows: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], offsets: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], whole: bool) -> tuple:
    """
    A window's rows split by partition: (partitions, sizes, seg, row, piece_rows);
    piece_rows (not whole) holds each piece's distinct sorted rows end to end.
    ValueError naming the first position whose row is not in the table.
    """

class HostLock:
    """
    An exclusive lock on a file between the processes of a host (flock;
    released by release() or when the process ends).
    """

    def __init__(self, path: str) -> None: ...

    def acquire(self, timeout_s: float) -> bool:
        """
        True when taken within timeout_s seconds (0: one try), the GIL released.
        """

    def release(self) -> None:
        """Release the lock (no-op when not held)."""

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""

class TableBatches:
    """
    An epoch's batches gathered ahead on the engine's thread (GIL released).

    Windows of rows are pushed (push), cut into batches of batch_size rows (a window's
    last batch may be shorter), gathered at most prefetch batches ahead and handed out
    in order by next() as form says: 'list' of tensors, 'dict' by names, 'x', or 'xy'.
    ahead=False: no thread; next() gathers each batch in the calling thread.
    """

    def __init__(self, pool: object, outputs: Sequence[tuple[int, int, Sequence[int], int]], names: Sequence[str], form: str, batch_size: int, prefetch: int, max_jobs: int, ahead: bool = True) -> None: ...

    def push(self, window: object, segment: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)], row: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> None:
        """
        Queue rows row[i] of segments segment[i] of window (blocks while max_jobs
        windows are queued; the GIL released).
        """

    def finish(self) -> None:
        """No more windows: next() returns None after them."""

    def next(self, timeout_s: float) -> object:
        """
        The next batch, None after the last; TimeoutError after timeout_s without one.
        """

    def close(self) -> None:
        """Stop the thread; push and next return at once."""

    @property
    def jobs_done(self) -> int:
        """Windows whose batches are out."""

    @property
    def batch_buffer_bytes(self) -> int:
        """
        Bytes of one batch's outputs (each at a 64-byte boundary): what each lent
        buffer must hold.
        """

    def adopt_buffers(self, buffers: Sequence[Annotated[NDArray[numpy.uint8], dict(shape=(None,), order='C', device='cpu')]]) -> None:
        """
        Lend the stream memory for batches (1-D uint8 CPU arrays, 8-byte aligned, of at
        least batch_buffer_bytes each, e.g. pinned torch tensors' numpy views): used while
        one is free, each back once its batch's tensors are freed; dropped after close().
        """
