"""The binary acquire answer: the broker's encoding of deliveries, the client's decoding."""

from __future__ import annotations

import pytest

from laminar.client.models import Acquired
from laminar.log.batch import (
    BATCH_HEADER_BYTES,
    Record,
    encode_batch,
    parse_header,
    payload_hash,
    split_batches,
    stamp_header,
)
from laminar.log.errors import BatchError
from laminar.partition.groups import Delivery, StoredBatch
from laminar.queue import Granted
from laminar.queue.wire import GRANT, PREAMBLE, decode_acquired, encode_acquired
from laminar.server.groups_api import encode_deliveries


def stored(base: int, count: int, term: int = 3) -> StoredBatch:
    records = [
        Record(
            value=f"v{base + i}".encode(),
            key=None if i % 3 else f"k{i}".encode(),
            headers=(("h", bytes([i % 256])),) if i % 2 else (),
            timestamp_ms=1_700_000_000_000 + i,
        )
        for i in range(count)
    ]
    batch = encode_batch(records)
    digest = payload_hash(memoryview(batch)[BATCH_HEADER_BYTES:])
    data = stamp_header(batch, base, term, digest) + batch[BATCH_HEADER_BYTES:]
    return StoredBatch(parse_header(data), data)


def deliveries(batch: StoredBatch, indexes: list[int]) -> list[Delivery]:
    return [Delivery(Granted(i, 1 + i % 4, 5_000 + i), batch) for i in indexes]


def decoded(body: bytes) -> list[tuple[object, ...]]:
    acquired = Acquired.from_binary(body, topic="t", partition=2)
    assert acquired.consumer == "c-1"
    return [
        (m.index, m.deliveries, m.lease_deadline_ms, m.timestamp_ms, m.key, m.value, m.headers)
        for m in acquired.messages
    ]


def expected(chosen: list[Delivery]) -> list[tuple[object, ...]]:
    return [
        (g.index, g.deliveries, g.deadline_ms, r.timestamp_ms, r.key, r.value, r.headers)
        for g, r in ((d.granted, d.record) for d in chosen)
    ]


def test_dense_deliveries_ship_their_stored_batches_as_they_are() -> None:
    first, second = stored(100, 10), stored(110, 6)
    chosen = deliveries(first, list(range(103, 110))) + deliveries(second, [110, 111, 112])
    body = encode_deliveries("c-1", chosen)
    assert decoded(body) == expected(chosen)
    _, grants, batches = decode_acquired(body)
    assert [g[0] for g in grants] == [d.granted.index for d in chosen]
    assert bytes(batches) == first.data + second.data  # verbatim, no per-record work


def test_sparse_deliveries_ship_only_their_records() -> None:
    batch = stored(1_000, 40)
    chosen = deliveries(batch, [1_003, 1_017, 1_039])
    body = encode_deliveries("c-1", chosen)
    assert decoded(body) == expected(chosen)
    _, _, batches = decode_acquired(body)
    singles = list(split_batches(batches))
    assert [parse_header(b).base_index for b in singles] == [1_003, 1_017, 1_039]
    assert all(parse_header(b).record_count == 1 for b in singles)
    assert len(body) < len(batch.data)


def test_empty_answer() -> None:
    assert Acquired.from_binary(encode_acquired("c-1", [], []), topic="t", partition=0) == (
        Acquired("c-1", [])
    )


@pytest.mark.parametrize(
    "damage",
    [
        lambda body: body[:5],  # shorter than its preamble
        lambda body: b"XXXX" + body[4:],  # not an acquire answer
        lambda body: body[: PREAMBLE.size + 3 + GRANT.size],  # ends inside its grants
        lambda body: body[:-1],  # a batch cut short
        lambda body: body[:-2] + bytes([body[-2] ^ 1]) + body[-1:],  # checksum mismatch
    ],
)
def test_a_damaged_answer_is_an_error(damage: object) -> None:
    batch = stored(0, 4)
    body = encode_deliveries("c-1", deliveries(batch, [0, 1, 2]))
    with pytest.raises(BatchError):
        Acquired.from_binary(damage(body), topic="t", partition=0)  # type: ignore[operator]


def test_a_granted_record_missing_from_the_batches_is_an_error() -> None:
    batch = stored(0, 4)
    body = encode_acquired("c-1", [(0, 1, 9), (7, 1, 9)], [batch.data])
    with pytest.raises(BatchError, match="1 granted messages are not in the answer"):
        Acquired.from_binary(body, topic="t", partition=0)
