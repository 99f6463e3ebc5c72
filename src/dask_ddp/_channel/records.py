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
import struct
import uuid
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


def check_path(path: Any) -> str:
    """``path`` if it is a relative path that stays inside the results folder."""
    if not isinstance(path, str) or not path:
        raise TypeError(f"submit_result(): path must be a non-empty str, got {path!r}")
    parts = path.replace("\\", "/").split("/")
    if path.startswith("/") or ".." in parts:
        raise ValueError(f"submit_result(): path {path!r} must stay inside the results folder")
    return path


def encode_metric(record: dict[str, Any]) -> bytes:
    return KIND_METRIC + json.dumps(record).encode()


def encode_result(path: str, kind: bytes, body: bytes) -> bytes:
    pathb = path.encode()
    return KIND_RESULT + _PATH_LEN.pack(len(pathb)) + pathb + kind + body


def encode_stored(ref: StoredRef) -> bytes:
    return KIND_STORED + json.dumps(ref._asdict()).encode()


class ResultWriter:
    """Writes results under a folder, keeping the appended-to files open."""

    def __init__(self, root: Path, max_open: int = 64) -> None:
        self.root = root
        self.files: dict[Path, Any] = {}
        self.max_open = max_open

    def _target(self, path: str) -> Path:
        target = (self.root / check_path(path)).resolve()
        if not target.is_relative_to(self.root.resolve()):
            raise ValueError(f"result path {path!r} leaves {self.root}")
        target.parent.mkdir(parents=True, exist_ok=True)
        return target

    def write(self, rec: Record) -> None:
        kind, payload = rec.payload[:1], rec.payload
        if kind == KIND_RESULT:
            (n,) = _PATH_LEN.unpack_from(payload, 1)
            path = payload[3 : 3 + n].decode()
            self._store(path, payload[3 + n : 4 + n], memoryview(payload)[4 + n :])
        elif kind == KIND_STORED:
            ref = StoredRef(**json.loads(payload[1:]))
            from dask_ddp import storage as _storage

            store = _storage.open(ref.url)
            data = store.get(ref.key)
            self._store(ref.path, ref.kind.encode(), memoryview(data))
            store.delete(ref.key)
        else:
            logger.error("unknown result record kind %r from rank %d", kind, rec.rank)

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
            tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")
            tmp.write_bytes(body)
            os.replace(tmp, target)

    def flush(self) -> None:
        for f in self.files.values():
            f.flush()

    def close(self) -> None:
        for f in self.files.values():
            f.close()
        self.files.clear()
