"""Pure parts of reading: decoding a binary read answer (skipping records below `from` and
control batches, honouring max_records), the JSON fallback, and which replica serves reads."""

from __future__ import annotations

import base64
import struct
from collections import Counter

import pytest

from laminar.client import CorruptData, Member, PartitionState, decode_read_body, read_replicas
from laminar.client.client import decode_read_json, malformed_records
from laminar.log.batch import (
    BATCH_HEADER,
    CHECKSUM_OFFSET,
    Record,
    encode_batch,
    header_checksum,
    payload_hash,
    stamp_header,
    verify_batch,
)
from laminar.log.errors import BatchError, MalformedRecordsError
from laminar.placement import Candidate, partition_key, rank


def stored_batch(base_index: int, values: list[bytes], *, control: bool = False) -> bytes:
    """A batch as the log stores it: base index and term stamped, checksum redone."""
    data = encode_batch([Record(v, key=b"k") for v in values], now_ms=1000, control=control)
    _, digest = verify_batch(data, 1 << 20)
    return stamp_header(data, base_index, 1, digest) + data[72:]


BODY = (
    stored_batch(1, [b"a", b"b", b"c"])
    + stored_batch(4, [b"noop"], control=True)
    + stored_batch(5, [b"d", b"e"])
)


def read(from_index: int | None, max_records: int = 1000, next_index: int | None = 7) -> list:
    result = decode_read_body(
        BODY,
        from_index=from_index,
        max_records=max_records,
        next_index=next_index,
        commit_index=6,
        log_start=1,
    )
    return [[(r.index, r.value) for r in result.records], result.next_index]


def test_records_below_from_and_control_batches_are_skipped() -> None:
    assert read(None) == [[(1, b"a"), (2, b"b"), (3, b"c"), (5, b"d"), (6, b"e")], 7]
    assert read(2) == [[(2, b"b"), (3, b"c"), (5, b"d"), (6, b"e")], 7]
    assert read(6) == [[(6, b"e")], 7]


def test_max_records_cuts_and_moves_next_index_back() -> None:
    assert read(2, max_records=2) == [[(2, b"b"), (3, b"c")], 4]
    assert read(None, max_records=4) == [[(1, b"a"), (2, b"b"), (3, b"c"), (5, b"d")], 6]


def test_next_index_without_the_header() -> None:
    assert read(2, next_index=None)[1] == 7
    empty = decode_read_body(
        b"", from_index=9, max_records=10, next_index=None, commit_index=8, log_start=1
    )
    assert (empty.records, empty.next_index, empty.commit_index) == ([], 9, 8)


def test_a_damaged_answer_raises() -> None:
    damaged = bytearray(BODY)
    damaged[80] ^= 0xFF
    with pytest.raises(BatchError):
        decode_read_body(
            bytes(damaged), from_index=1, max_records=10, next_index=7, commit_index=6, log_start=1
        )


def test_the_json_answer_decodes_too() -> None:
    data = {
        "records": [
            {"index": 17, "timestamp_ms": 5, "key": "k1", "value": "hello", "headers": {"h": "v"}},
            {
                "index": 18,
                "timestamp_ms": 6,
                "key": None,
                "value": base64.b64encode(b"\xff\x00").decode(),
                "headers": {},
                "encoding": "base64",
            },
        ],
        "next_index": 19,
        "commit_index": 99,
        "log_start": 1,
    }
    result = decode_read_json(data, max_records=10)
    assert [(r.index, r.key, r.value, r.headers) for r in result.records] == [
        (17, b"k1", b"hello", (("h", b"v"),)),
        (18, None, b"\xff\x00", ()),
    ]
    assert (result.next_index, result.commit_index, result.log_start) == (19, 99, 1)
    assert decode_read_json(data, max_records=1).next_index == 18


MEMBERS = [
    Member("n1", "http://127.0.0.1:9001", "alive"),
    Member("n2", "http://127.0.0.1:9002/", "alive", weight=2),
    Member("n3", "http://127.0.0.1:9003", "alive"),
    Member("n4", "http://127.0.0.1:9004", "dead"),
    Member("n5", "http://127.0.0.1:9005", "alive", draining=True),
]


def state(in_sync: tuple[str, ...]) -> PartitionState:
    return PartitionState(0, "n1", "http://127.0.0.1:9001", in_sync, (), in_sync, 1, 10, 11)


def test_reads_go_to_in_sync_replicas_by_rendezvous_rank() -> None:
    urls = read_replicas("t", 3, state(("n1", "n2", "n3", "n4", "n5")), MEMBERS)
    expected = rank(partition_key("t", 3), [Candidate("n1"), Candidate("n2", 2), Candidate("n3")])
    assert urls == [f"http://127.0.0.1:900{node[1]}" for node in expected]
    assert read_replicas("t", 3, state(("n4", "n5", "n9")), MEMBERS) == []


def test_reads_of_many_partitions_spread_over_the_replicas() -> None:
    firsts = Counter(
        read_replicas("t", p, state(("n1", "n2", "n3")), MEMBERS)[0] for p in range(4000)
    )
    shares = {url[-1]: count / 4000 for url, count in firsts.items()}
    assert abs(shares["1"] - 0.25) < 0.04 and abs(shares["3"] - 0.25) < 0.04
    assert abs(shares["2"] - 0.5) < 0.04  # weight 2


def malformed_batch(base_index: int) -> bytes:
    """A stored batch whose checksum holds but whose key length runs past its record (what
    brokers accepted before appends checked records)."""
    payload = struct.pack("<iiiH", 0, 1000, 1, 0) + b"kv"
    header = BATCH_HEADER.pack(b"LMQB", 1, 0, base_index, 1, len(payload), 1, 0, 0, 1000, 1000, 0)[
        :CHECKSUM_OFFSET
    ]
    checksum = header_checksum(header, payload_hash(payload))
    return header + checksum.to_bytes(8, "little") + payload


def test_a_malformed_batch_ends_the_answer_and_the_reader_can_skip_it() -> None:
    body = stored_batch(1, [b"a", b"b"]) + malformed_batch(3) + stored_batch(4, [b"c"])
    result = decode_read_body(
        body, from_index=1, max_records=10, next_index=5, commit_index=4, log_start=1
    )
    # the records before it, and reading goes on at it (not at the answer's next index 5,
    # which would pass over it and the good batch after it unseen)
    assert [(r.index, r.value) for r in result.records] == [(1, b"a"), (2, b"b")]
    assert result.next_index == 3
    with pytest.raises(MalformedRecordsError) as raised:
        decode_read_body(
            body[len(stored_batch(1, [b"a", b"b"])) :],
            from_index=3,
            max_records=10,
            next_index=5,
            commit_index=4,
            log_start=1,
        )
    error = malformed_records("t", 0, raised.value)
    assert isinstance(error, CorruptData) and error.code == "corrupt_data"
    assert error.next_index == 4 and "key of 1000 bytes runs past" in error.message
