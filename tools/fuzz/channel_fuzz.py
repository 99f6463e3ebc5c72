"""atheris target: the results channel's entry check and the reader's reassembly.

Builds entries (well-formed or not, in wire form) from the fuzzer's bytes and feeds them to
:func:`~dask_ddp._channel.wire.parse_entry`, then every accepted one to the reader's
:meth:`Reader._take` (the client's reassembly of runs and parts) and, for a record, to the
client's :class:`~dask_ddp._channel.records.ResultWriter` in a scratch folder. The contract
checked: a malformed entry raises ``ValueError`` and nothing else; an accepted one never
raises in the reader; a record never raises in the writer and never writes outside its
folder.

    PYTHONPATH=src .venv/bin/python tools/fuzz/channel_fuzz.py -atheris_runs=1000000
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import atheris

with atheris.instrument_imports():
    from dask_ddp._channel import reader as _reader
    from dask_ddp._channel import records as _records
    from dask_ddp._channel.wire import Entry, FrameHeader, parse_entry

logging.disable(logging.CRITICAL)  # refused records are logged: millions of lines here


def _frames(fdp: atheris.FuzzedDataProvider, seq: int, n: int) -> bytes:
    out = b""
    for i in range(n):
        data = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64))
        topic = b"t" * fdp.ConsumeIntInRange(0, 3)
        length = len(data) if fdp.ConsumeBool() else fdp.ConsumeIntInRange(0, 1 << 20)
        out += FrameHeader(length, max(0, seq + i), 1, len(topic), 0, 1).pack() + topic + data
    return out


def _entry(fdp: atheris.FuzzedDataProvider) -> Any:
    kind = fdp.ConsumeIntInRange(0, 4)
    source = f"j/{fdp.ConsumeIntInRange(0, 2)}/n.1"
    seq = fdp.ConsumeIntInRange(-2, 40)
    if kind == 0:  # a run, its frames made well or not
        n = fdp.ConsumeIntInRange(0, 4)
        records = n if fdp.ConsumeBool() else fdp.ConsumeIntInRange(0, 1 << 20)
        return list(Entry.run(source, seq, records, _frames(fdp, seq, n)))
    if kind == 1:  # a part of a large record
        nparts = fdp.ConsumeIntInRange(2, 4)
        return [source, seq, 1, fdp.ConsumeIntInRange(0, 5), nparts,
                fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64))]
    if kind == 2:  # an end marker
        return list(Entry.end(source, seq))
    if kind == 3:  # raw fields of any type
        return [fdp.ConsumeUnicodeNoSurrogates(8), fdp.ConsumeInt(4), fdp.ConsumeInt(4),
                fdp.ConsumeInt(2), fdp.ConsumeInt(2), fdp.ConsumeBytes(32)]
    return fdp.ConsumeBytes(8) if fdp.ConsumeBool() else None


def _reader_without_client() -> Any:
    rd = object.__new__(_reader.Reader)  # the reassembly state only: no scheduler here
    rd.topic, rd.on_gap, rd.cursor, rd.streams, rd.gaps, rd.closed = "t", None, 0, {}, [], True
    rd.on_gap = lambda err: None
    return rd


def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    rd = _reader_without_client()
    # No job declared a storage here: every stored-result record is refused before any
    # store is opened (the writer's confinement is part of what is fuzzed).
    # A scratch folder per input, removed after it: libFuzzer ends the process with
    # exit(), so nothing made once for the whole campaign would be cleaned up.
    root = Path(tempfile.mkdtemp(prefix="channel-fuzz-"))
    out_dir = root / "results"
    writer = _records.ResultWriter(out_dir, storage_of=lambda job: None)
    try:
        for _ in range(fdp.ConsumeIntInRange(1, 6)):
            raw = _entry(fdp)
            try:
                entry = parse_entry(raw)
            except ValueError:
                continue
            out: list[Any] = []
            rd._take(out, entry)
            for rec in out:
                body = rec.payload
                if fdp.ConsumeBool():  # a result record with a fuzzed path and kind
                    path = fdp.ConsumeUnicode(12)
                    try:
                        body = _records.encode_result(path, fdp.ConsumeBytes(1), body)
                    except UnicodeEncodeError:
                        continue
                writer.write(_reader.Record(rec.source, rec.rank, rec.seq, body))
        writer.close()
        for dirpath, _, files in os.walk(root):
            for name in files:
                if not Path(dirpath, name).resolve().is_relative_to(out_dir.resolve()):
                    raise AssertionError(f"a record wrote {dirpath}/{name} outside its folder")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
