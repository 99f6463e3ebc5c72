"""The results channel's entries are checked whole at the scheduler and at the reader: a
malformed entry is refused with a reason, never half-read, and costs no other record."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from distributed import Client, LocalCluster

from dask_ddp._channel import reader as _reader
from dask_ddp._channel.wire import Entry, FrameHeader, parse_entry


def frames(topic: str, seq: int, datas: list[bytes]) -> bytes:
    """Whole frames, as a rank writes them to its pipe."""
    t = topic.encode()
    return b"".join(FrameHeader(len(d), seq + i, 1, len(t), 0, 1).pack() + t + d
                    for i, d in enumerate(datas))


def wire(e: Entry) -> list[Any]:
    return list(e)


def test_well_formed_entries_parse() -> None:
    run = Entry.run("j/0/n.1", 0, 2, frames("t", 0, [b"a", b"bc"]))
    assert parse_entry(wire(run)) == run
    assert parse_entry(wire(Entry.end("j/0/n.1", 2))).is_end
    part = Entry("j/0/n.1", 2, 1, 1, 3, b"xyz")
    assert parse_entry(wire(part)) == part


MALFORMED = {
    "a million records in 10 bytes": (Entry("s/0/n.1", 0, 1_000_000, 0, 1, b"x" * 10),
                                      "claims 1000000 records in 10 bytes"),
    "a frame longer than the run": (
        Entry.run("s/0/n.1", 0, 1, FrameHeader(10_000, 0, 1, 1, 0, 1).pack() + b"tdata"),
        "ends past"),
    "bytes after the records": (Entry.run("s/0/n.1", 0, 1, frames("t", 0, [b"a"]) + b"zz"),
                                "2 bytes after"),
    "a negative sequence": (Entry.run("s/0/n.1", -5, 1, frames("t", 0, [b"a"])), "negative"),
    "an end marker with data": (Entry("s/0/n.1", 3, 0, 0, 0, b"data"), "end marker"),
    "a part past the record's parts": (Entry("s/0/n.1", 0, 1, 4, 3, b"x"), "part 4"),
    "no stream name": (Entry("", 0, 1, 0, 2, b"x"), "stream name"),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_entries_are_refused_with_a_reason(name: str) -> None:
    entry, reason = MALFORMED[name]
    with pytest.raises(ValueError, match=reason):
        parse_entry(wire(entry))


@pytest.mark.parametrize("raw", [None, 5, "abc", [1, 2, 3], ["s", "x", 1, 0, 1, b""]])
def test_garbage_is_not_an_entry(raw: Any) -> None:
    with pytest.raises(ValueError, match="not a results entry"):
        parse_entry(raw)


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    # A cluster of its own, in this process: its scheduler's reader is under test.
    with LocalCluster(n_workers=1, processes=False, dashboard_address=":0",
                      scheduler_port=0) as cluster, Client(cluster) as c:
        yield c


@pytest.mark.dask
def test_a_malformed_put_is_refused_and_the_reader_goes_on(
        client: Client, caplog: pytest.LogCaptureFixture) -> None:
    """A writer puts a good run, a malformed run (a million records claimed in 10 bytes,
    which crashed the reader with a bare struct.error) and a later good run: the scheduler
    refuses the bad one with a logged reason and takes the others; the reader reports the
    gap and delivers every good record."""
    topic = "dask-ddp-test-wire-" + client.id[-8:]
    gaps: list[str] = []
    rd = _reader.Reader(client, topic, on_gap=lambda e: gaps.append(str(e)))
    src = "job/1/nonce.7"
    puts = [wire(Entry.run(src, 0, 2, frames(topic, 0, [b"r0", b"r1"]))),
            wire(Entry(src, 2, 1_000_000, 0, 1, b"x" * 10)),
            wire(Entry.run(src, 3, 1, frames(topic, 3, [b"r3"]))),
            wire(Entry.end(src, 4))]
    with caplog.at_level(logging.WARNING, logger="dask_ddp._channel.scheduler"):
        reply = client.sync(client.scheduler.dask_ddp_results_put, topic=topic, entries=puts,
                            writer="test-writer")
    assert reply["accepted"] == 4, reply  # the malformed one is taken and dropped
    got: list[Any] = []
    for _ in range(20):  # bounded: each fetch waits at most 0.5 s
        got += rd.fetch(timeout=0.5)
        if rd.streams.get(src) is not None and rd.streams[src].ended:
            break
    rd.close()
    assert [(r.seq, r.payload) for r in got] == [(0, b"r0"), (1, b"r1"), (3, b"r3")]
    assert any("records 2..2 are missing" in g for g in gaps), gaps
    # The scheduler runs in this process (processes=False): its warning is here.
    refused = [r.getMessage() for r in caplog.records if "refused a malformed" in r.getMessage()]
    assert refused and "1000000 records in 10 bytes" in refused[0] and "test-writer" in refused[0]
