"""Object stores by URL: local files, S3, HTTP(S) and memory, over the C++ engine.

A store is opened on a root URL and addressed by keys relative to it, with ``/`` as
separator::

    from dask_ddp import storage

    store = storage.open("s3://my-bucket/datasets/flowers")
    for info in store.list("train/"):
        print(info.key, info.size)
    data = store.get("train/daisy/001.jpg")
    header = store.get_range("train/daisy/001.jpg", 0, 64)
    store.put("checkpoints/epoch-3.pt", payload)          # atomic for readers
    for key, data in store.get_many(keys):                # many requests in flight
        ...

URL schemes
-----------
The engine parses URLs in one place (:func:`parse_url`, used by the stores, the datasets
and the Loader alike): a string without ``scheme://`` is a local path, relative to the
working directory when relative; an unknown scheme is a ``ValueError`` naming it.

``file:///abs/path``, ``file://localhost/abs/path`` or a plain path
    A directory; keys are relative file paths. ``put`` writes a temporary file in the
    target's directory, fsyncs it and renames it into place (parents are created), so a
    reader sees the old or the new content, never a partial file.
``s3://bucket[/prefix]``
    Amazon S3 or any S3-compatible server. Configuration follows the AWS conventions:
    ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, and ``AWS_ENDPOINT_URL_S3`` /
    ``AWS_ENDPOINT_URL`` for custom endpoints (path-style addressing). ``anon=True``
    sends unsigned requests (public buckets). Otherwise credentials come from the first
    of, in AWS's order:

    1. ``AWS_PROFILE``: that profile of the shared credentials file
       (``AWS_SHARED_CREDENTIALS_FILE`` or ``~/.aws/credentials``) or config file;
    2. ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` (, ``AWS_SESSION_TOKEN``);
    3. the ``[default]`` profile;
    4. web identity (EKS service accounts): ``AWS_WEB_IDENTITY_TOKEN_FILE`` and
       ``AWS_ROLE_ARN`` exchanged by STS ``AssumeRoleWithWebIdentity`` (at
       ``AWS_ENDPOINT_URL_STS``, ``AWS_ENDPOINT_URL`` or the regional endpoint);
    5. container credentials (ECS, Fargate, EKS Pod Identity):
       ``AWS_CONTAINER_CREDENTIALS_RELATIVE_URI`` or ``_FULL_URI``, with
       ``AWS_CONTAINER_AUTHORIZATION_TOKEN(_FILE)``;
    6. EC2 instance metadata (IMDSv2), unless ``AWS_EC2_METADATA_DISABLED=true``;
       ``AWS_EC2_METADATA_SERVICE_ENDPOINT`` overrides its address.

    Temporary keys (4-6) are fetched when the store opens and refreshed before they
    expire, so long jobs never sign with expired keys. Nothing found raises
    ``PermissionError`` listing what to set. Objects above ``multipart_threshold`` bytes
    are uploaded with multipart upload (aborted on failure).
``http://host/base`` and ``https://...``
    Read-only: ``get``, ``get_range``, ``stat`` (HEAD) and ``get_many``. HTTP has no
    listing, so ``list`` reads a listing file named ``_index.txt`` at the base URL: one
    key per line (relative to the base), optionally followed by a tab and the size in
    bytes; blank lines and lines starting with ``#`` are ignored. Without that file
    ``list`` raises ``NotImplementedError`` saying so. ``put`` and ``delete`` raise
    ``NotImplementedError``. For https (here and for S3), ``ca_bundle=`` or
    ``AWS_CA_BUNDLE`` names a PEM file of CA certificates to trust instead of the
    system's.
``memory://name[/prefix]``
    Process-wide named in-memory stores (tests, examples); ``memory://`` alone opens a
    fresh anonymous one.

Errors
------
Engine errors arrive as built-in exceptions whose message names the URL or key and,
for HTTP back-ends, the HTTP status: ``FileNotFoundError`` (missing object),
``PermissionError`` (403, bad credentials), ``ValueError`` (bad URL, key or range),
``ConnectionError`` (server unreachable after retries), ``TimeoutError``, ``OSError``
(data loss such as a short read), ``NotImplementedError`` (operation not supported by
the back-end), ``OSError`` (``RESOURCE_EXHAUSTED``) for an answer body over
``max_body_bytes``. Retries follow AWS's standard mode, with jittered exponential back-off
(``max_attempts``): HTTP 500/502/503/504 and 429, dropped connections and timeouts, and
for S3 the error codes ``RequestTimeout`` (sent as HTTP 400), ``InternalError``,
``SlowDown`` and the other throttling codes. Other 4xx answers never are (nor
``RequestTimeTooSkewed``). Credentials, tokens and signatures never appear in messages,
and a ``user:password@`` in a URL is removed (:func:`redact_url`) from messages, reprs and
logs.

Every call releases the GIL while it waits on storage.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from dask_ddp import _core

__all__ = [
    "LISTING_FILE",
    "ObjectInfo",
    "Store",
    "StoreUrl",
    "is_local",
    "open",
    "parse_url",
    "redact_url",
]

logger = logging.getLogger(__name__)

#: The listing file an ``http(s)://`` store reads for ``list`` (see the module docstring).
LISTING_FILE = "_index.txt"


class ObjectInfo(NamedTuple):
    """An object's ``key`` (relative to the store root) and ``size`` in bytes."""

    key: str
    size: int


class StoreUrl(NamedTuple):
    """A store URL as the engine parses it (:func:`parse_url`)."""

    #: Lower-case scheme: ``"file"`` (also for plain paths), ``"s3"``, ``"http"``,
    #: ``"https"`` or ``"memory"``.
    scheme: str
    #: ``file``: the local path (``file:///x`` and ``file://localhost/x`` are ``/x``; a
    #: relative plain path stays relative); ``memory``: the name; others: the URL.
    location: str
    #: Whether it names the local file system.
    local: bool


def parse_url(url: str | os.PathLike[str]) -> StoreUrl:
    """The engine's parse of a store URL: the one every layer uses.

    Raises
    ------
    ValueError
        For an empty URL, an unsupported scheme (naming it) or a ``file://`` URL naming
        a host other than ``localhost``.

    Examples
    --------
    >>> parse_url("file://localhost/data/train")
    StoreUrl(scheme='file', location='/data/train', local=True)
    >>> parse_url("s3://bucket/prefix").scheme
    's3'
    """
    scheme, location, local = _core.parse_url(os.fspath(url))
    return StoreUrl(scheme, location, local)


def is_local(url: str | os.PathLike[str]) -> bool:
    """Whether ``url`` names the local file system (a plain path or ``file://``)."""
    return parse_url(url).local


def redact_url(url: str | os.PathLike[str]) -> str:
    """``url`` without any ``user:password@``, for messages and logs (the engine's)."""
    return str(_core.redact_url(os.fspath(url)))


# Options accepted by open(), with the engine's defaults (cpp/include/ddp/store.h).
_OPTIONS = {
    "endpoint_url": "S3 endpoint overriding AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL",
    "region": "S3 region overriding AWS_REGION / AWS_DEFAULT_REGION",
    "ca_bundle": "https: PEM file of CA certificates to trust (default: AWS_CA_BUNDLE)",
    "max_attempts": "total attempts per request, including the first",
    "initial_backoff": "first retry delay in seconds (jittered, doubling)",
    "max_backoff": "longest retry delay in seconds",
    "multipart_threshold": "S3 objects larger than this many bytes use multipart upload",
    "multipart_part_size": "S3 multipart part size in bytes",
    "max_in_flight": "requests kept in flight by get_many",
    "connect_timeout": "seconds to establish a connection",
    "low_speed_timeout": "seconds a transfer may stall before it is aborted and retried",
    "max_body_bytes": "http(s)/S3: largest answer body accepted (default 2 GiB)",
}


class Store:
    """An object store opened on a root URL; use :func:`open` to make one.

    Thread-safe: one store may be shared by many threads, and every method releases
    the GIL while it waits. A store pickles as its URL and options (Dask can send it to
    workers); credentials are read again from the environment where it is unpickled.
    """

    def __init__(self, core: Any, opened_with: tuple[str, bool, dict[str, Any]]) -> None:
        self._core = core
        self._opened_with = opened_with

    def __reduce__(self) -> tuple[Any, tuple[str, bool, dict[str, Any]]]:
        return (_reopen, self._opened_with)

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    @property
    def url(self) -> str:
        """The root URL, normalised and without credentials."""
        return str(self._core.url)

    @property
    def engine(self) -> Any:
        """The C++ engine's handle of this store (``dask_ddp._core.Store``), which the
        engine's loaders read through."""
        return self._core

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object whose key starts with ``prefix`` (all pages), sorted by key.

        Parameters
        ----------
        prefix
            A string prefix of the keys (``"train/"`` lists a folder; ``"train"`` also
            matches ``"training/..."``).
        """
        return [ObjectInfo(o.key, o.size) for o in self._core.list(prefix)]

    def stat(self, key: str) -> ObjectInfo:
        """The key and size of one object; ``FileNotFoundError`` if it does not exist."""
        o = self._core.stat(key)
        return ObjectInfo(o.key, o.size)

    def exists(self, key: str) -> bool:
        """Whether ``key`` names an object."""
        try:
            self._core.stat(key)
        except FileNotFoundError:
            return False
        return True

    def get(self, key: str) -> bytes:
        """The whole object's bytes."""
        return bytes(self._core.get(key))

    def get_range(self, key: str, offset: int, length: int | None = None) -> bytes:
        """``length`` bytes of an object from ``offset`` (``None``: to the end).

        A length reaching past the end is clamped to the end; an offset past the end
        raises ``ValueError``.
        """
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset} (key {key!r})")
        if length is not None and length < 0:
            raise ValueError(f"length must be >= 0 or None, got {length} (key {key!r})")
        return bytes(self._core.get(key, offset, length))

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        """Write an object, atomically replacing any previous content."""
        self._core.put(key, data)

    def delete(self, key: str) -> None:
        """Delete an object; deleting a missing key is not an error."""
        self._core.delete(key)

    def get_many(
        self, keys: Iterable[str], max_in_flight: int | None = None
    ) -> Iterator[tuple[str, bytes]]:
        """Fetch many whole objects concurrently, yielding ``(key, data)`` as each completes.

        Requests are kept in flight over reused connections by the engine while the
        caller consumes results; the order is completion order, not the order of
        ``keys``. A failed key raises its exception (e.g. ``FileNotFoundError``) when
        reached, which ends the iteration.

        Parameters
        ----------
        keys
            The keys to fetch.
        max_in_flight
            Requests kept in flight at once (default: the store's ``max_in_flight``).
        """
        if max_in_flight is not None and max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        key_list = [str(k) for k in keys]
        if not key_list:
            return iter(())
        return self._core.get_many(key_list, max_in_flight or 0)


def open(url: str | os.PathLike[str], *, anon: bool = False, **options: Any) -> Store:  # noqa: A001
    """Open the object store for a URL.

    Parameters
    ----------
    url
        ``file:///path`` or a plain path (``str`` or ``os.PathLike``), ``s3://bucket[/prefix]``,
        ``http(s)://host/base`` (read-only) or ``memory://name``.
    anon
        S3 only: send unsigned requests, as for public buckets. Otherwise credentials
        are resolved as the module documentation lists (environment, shared files, web
        identity, container credentials, EC2 instance metadata).
    **options
        ``endpoint_url``, ``region``, ``ca_bundle``, ``max_attempts``, ``initial_backoff``,
        ``max_backoff``, ``multipart_threshold``, ``multipart_part_size``,
        ``max_in_flight``, ``connect_timeout``, ``low_speed_timeout``,
        ``max_body_bytes`` (http(s) and S3: the largest answer body accepted, default
        2 GiB; a server announcing or sending more fails the request with
        ``OSError`` naming the URL and the limit, before the memory is allocated).

    Returns
    -------
    Store

    Raises
    ------
    ValueError
        For a malformed URL or an unsupported scheme, or a credential variable set
        wrong (e.g. ``AWS_WEB_IDENTITY_TOKEN_FILE`` without ``AWS_ROLE_ARN``).
    PermissionError
        S3: no credentials found, or the credential source refused (the message names
        it: a token file, the STS, container or instance-metadata endpoint).
    ConnectionError
        S3: a configured credential endpoint could not be reached.
    TypeError
        For an unknown option.

    Examples
    --------
    >>> store = open("memory://doc-example")
    >>> store.put("a/b.txt", b"hello")
    >>> [(i.key, i.size) for i in store.list("a/")]
    [('a/b.txt', 5)]
    """
    if isinstance(url, os.PathLike):
        url = os.fspath(url)
    if not isinstance(url, str):
        raise TypeError(f"url must be a str or a path, not {type(url).__name__}")
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise TypeError(
            f"unknown store option(s) {', '.join(unknown)} for {redact_url(url)!r}; "
            f"known: {', '.join(sorted(_OPTIONS))}"
        )
    logger.debug("opening store %s", redact_url(url))
    return Store(_core.open_store(url, anonymous=anon, **options), (url, anon, dict(options)))


def _reopen(url: str, anon: bool, options: dict[str, Any]) -> Store:
    """Unpickle a Store: open it again from its URL and options."""
    return open(url, anon=anon, **options)
