"""What the records of :mod:`dask_ddp.results` carry, and the client's results folder.

A record's first byte is its kind:

- ``M`` a metric (``report()``): the rest is one JSON object;
- ``R`` a result (``submit_result``): ``!H`` path length, path (utf-8), ``s`` (a text
  line to append) or ``b`` (bytes that replace the file), then the data;
- ``S`` a stored result: JSON ``{"path", "url", "key", "kind"}``, the data being in the
  job's storage at ``url``/``key`` (the client moves it into the folder, then deletes it).
"""

from __future__ import annotations

import json
import logging
import os
import re
import struct
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from dask_ddp._channel.reader import Record

logger = logging.getLogger(__name__)

KIND_METRIC = b"M"
KIND_RESULT = b"R"
KIND_STORED = b"S"
_PATH_LEN = struct.Struct("!H")


class StoredRef(NamedTuple):
    """Where a large result waits in the job's storage."""

    path: str
    url: str
    key: str
    kind: str  # "s" or "b"


#: Limits of a result's path: the whole path and each of its names, in UTF-8 bytes (Linux's
#: PATH_MAX leaves room for the results folder; NAME_MAX is 255 on every common file system).
MAX_PATH_BYTES = 1024
MAX_NAME_BYTES = 255


def check_path(path: Any) -> str:
    """``path`` if it names a file inside the results folder, else an error naming the rule.

    A path is relative, ``/``-separated, at most :data:`MAX_PATH_BYTES` bytes, each name
    non-empty, at most :data:`MAX_NAME_BYTES` bytes, neither ``.`` nor ``..``, with no
    backslash, NUL or other control character. Checked in the rank (``submit_result``)
    and again by the client for every record that arrives.
    """
    if not isinstance(path, str) or not path:
        raise TypeError(f"submit_result(): path must be a non-empty str, got {path!r}")
    rule = _broken_rule(path)
    if rule is not None:
        raise ValueError(f"submit_result(): result path {path[:300]!r} is refused: {rule}")
    return path


def _broken_rule(path: str) -> str | None:
    try:
        size = len(path.encode())
    except UnicodeEncodeError:
        return "it is not valid UTF-8 text"
    if size > MAX_PATH_BYTES:
        return f"it is {size} bytes long (at most {MAX_PATH_BYTES})"
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        return "it contains a control character (NUL, newline, ...)"
    if "\\" in path:
        return "it contains a backslash (use '/' between names)"
    if path.startswith("/"):
        return "it is absolute (it must be relative to the results folder)"
    for name in path.split("/"):
        if name in ("", ".", ".."):
            return (f"it has an empty, '.' or '..' name ({name!r}): a result is a file "
                    "inside the results folder")
        if len(name.encode()) > MAX_NAME_BYTES:
            return f"its name {name[:40]!r}... is over {MAX_NAME_BYTES} bytes"
    return None


def encode_metric(record: dict[str, Any]) -> bytes:
    return KIND_METRIC + json.dumps(record).encode()


def encode_result(path: str, kind: bytes, body: bytes) -> bytes:
    pathb = path.encode()
    return KIND_RESULT + _PATH_LEN.pack(len(pathb)) + pathb + kind + body


def encode_stored(ref: StoredRef) -> bytes:
    return KIND_STORED + json.dumps(ref._asdict()).encode()


class ResultWriter:
    """Writes results under a folder, keeping the appended-to files open.

    ``storage_of(job_id)`` is the storage URL the job's launching client declared: a
    stored result is fetched only from there and only under the job's own
    ``_results/<job id>/`` prefix (the job is that of the record's stream, which the
    rank's worker names), then deleted; any other reference is refused.
    """

    def __init__(self, root: Path, max_open: int = 64,
                 storage_of: Callable[[str], str | None] | None = None) -> None:
        self.root = root
        self.storage_of = storage_of
        self.files: dict[Path, Any] = {}
        self.max_open = max_open
        #: Records refused or not written: ``(rank, reason)``, oldest first (the first 100).
        self.failures: list[tuple[int, str]] = []
        self.failed = 0
        #: The first record's error, raised by ``process_results(raise_errors=True)`` once
        #: every other record is written.
        self.first_error: Exception | None = None

    def _target(self, path: str) -> Path:
        target = (self.root / check_path(path)).resolve()
        root = self.root.resolve()
        if target == root or not target.is_relative_to(root):
            raise ValueError(f"result path {path[:300]!r} leaves {self.root}")
        target.parent.mkdir(parents=True, exist_ok=True)
        return target

    def write(self, rec: Record) -> bool:
        """Write one record; True if it was written.

        A record that cannot be written (a refused path, a malformed record, a full disk,
        a stored result that cannot be fetched) is logged, counted in :attr:`failed` and
        skipped: one bad record never costs the others.
        """
        try:
            self._write(rec)
            return True
        except Exception as exc:  # noqa: BLE001 - any failure of one record is that record's
            self.failed += 1
            if self.first_error is None:
                self.first_error = exc
            reason = f"{type(exc).__name__}: {exc}"
            if len(self.failures) < 100:
                self.failures.append((rec.rank, reason))
            logger.error("a result of rank %d was not written (skipped): %s", rec.rank, reason)
            return False

    def _write(self, rec: Record) -> None:
        kind, payload = rec.payload[:1], rec.payload
        if kind == KIND_RESULT:
            (n,) = _PATH_LEN.unpack_from(payload, 1)
            path = payload[3 : 3 + n].decode()
            self._store(path, payload[3 + n : 4 + n], memoryview(payload)[4 + n :])
        elif kind == KIND_STORED:
            ref = self._confined(rec, payload)
            from dask_ddp import storage as _storage

            store = _storage.open(ref.url)
            data = store.get(ref.key)
            self._store(ref.path, ref.kind.encode(), memoryview(data))
            store.delete(ref.key)
        else:
            logger.error("unknown result record kind %r from rank %d", kind, rec.rank)

    def _confined(self, rec: Record, payload: bytes) -> StoredRef:
        """The stored result a record names, if it lies in its job's own storage."""
        fields = json.loads(payload[1:])
        if not isinstance(fields, dict) or set(fields) != set(StoredRef._fields) or not all(
                isinstance(v, str) for v in fields.values()):
            raise ValueError("a stored-result record that is not {path, url, key, kind}")
        ref = StoredRef(**fields)
        job_id = rec.source.split("/", 1)[0]
        declared = self.storage_of(job_id) if self.storage_of is not None else None
        if declared is None:
            raise ValueError(f"stored result {ref.path[:200]!r}: job {job_id[:40]!r} declared "
                             "no storage to this client")
        if ref.url.rstrip("/") != declared.rstrip("/"):
            from dask_ddp.storage import redact_url

            raise ValueError(f"stored result {ref.path[:200]!r} names {redact_url(ref.url)!r}, "
                             f"not its job's storage {redact_url(declared)!r}")
        if not re.fullmatch(rf"_results/{re.escape(job_id)}/[0-9a-f]{{32}}", ref.key):
            raise ValueError(f"stored result {ref.path[:200]!r} names the key "
                             f"{ref.key[:200]!r}, outside its job's _results/{job_id}/")
        return ref

    def _store(self, path: str, kind: bytes, body: memoryview) -> None:
        target = self._target(path)
        if kind == b"s":
            f = self.files.get(target)
            if f is None:
                if len(self.files) >= self.max_open:
                    self.files.pop(next(iter(self.files))).close()
                f = self.files[target] = open(target, "ab")  # noqa: SIM115 - kept open
            f.write(body)
            f.write(b"\n")
        else:
            old = self.files.pop(target, None)
            if old is not None:
                old.close()
            tmp = target.with_name(f".{target.name[:200]}.{uuid.uuid4().hex[:8]}.tmp")
            try:
                tmp.write_bytes(body)
                os.replace(tmp, target)
            except BaseException:
                tmp.unlink(missing_ok=True)  # no temporary file is left beside the results
                raise

    def flush(self) -> None:
        for f in self.files.values():
            f.flush()

    def close(self) -> None:
        for f in self.files.values():
            f.close()
        self.files.clear()
