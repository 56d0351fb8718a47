"""Hypothesis strategies shared by the fuzz tests: valid encodings, and mutations of them."""

from __future__ import annotations

from hypothesis import strategies as st

from laminar.log.batch import (
    BATCH_HEADER_BYTES,
    CHECKSUM_OFFSET,
    Record,
    encode_batch,
    header_checksum,
    payload_hash,
)

U64 = 2**64 - 1
NOW_MS = 1_700_000_000_000

# ---- mutations --------------------------------------------------------------------------------

EXTREMES = (b"\x00", b"\xff", b"\x7f", b"\x80", b"\xff\xff\xff\xff", b"\x00\x00\x00\x80")


@st.composite
def mutated(draw: st.DrawFn, data: bytes, *, keep: int = 0) -> bytes:
    """`data` with 1 to 4 mutations, its first `keep` bytes left as they are."""
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "extreme", "insert", "delete", "truncate"]))
        if len(buf) <= keep:
            op = "insert"
        at = draw(st.integers(keep, max(keep, len(buf) - 1)))
        if op == "flip":
            buf[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "extreme":
            value = draw(st.sampled_from(EXTREMES))
            buf[at : at + len(value)] = value
        elif op == "insert":
            buf[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del buf[at : at + draw(st.integers(1, 8))]
        else:
            del buf[at:]
    return bytes(buf)


def fuzzed(valid: st.SearchStrategy[bytes], *, keep: int = 0) -> st.SearchStrategy[bytes]:
    """Valid encodings, mutated ones (mostly) and random bytes."""
    return st.one_of(
        valid,
        valid.flatmap(lambda data: mutated(data, keep=keep)),
        valid.flatmap(lambda data: mutated(data, keep=keep)),
        st.binary(max_size=300),
    )


def texts(max_bytes: int, *, min_size: int = 1) -> st.SearchStrategy[str]:
    return st.text(min_size=min_size, max_size=12).filter(lambda s: len(s.encode()) <= max_bytes)


records = st.builds(
    Record,
    value=st.none() | st.binary(max_size=40),
    key=st.none() | st.binary(max_size=20),
    headers=st.lists(st.tuples(texts(30, min_size=0), st.binary(max_size=20)), max_size=3).map(
        tuple
    ),
    timestamp_ms=st.integers(NOW_MS - 1000, NOW_MS + 1000),
)


@st.composite
def batches(draw: st.DrawFn) -> bytes:
    return encode_batch(
        draw(st.lists(records, min_size=1, max_size=5)),
        producer_id=draw(st.integers(0, U64)),
        producer_seq=draw(st.integers(0, U64)),
        control=draw(st.booleans()),
    )


def resealed(data: bytes) -> bytes:
    """`data` with its batch checksum made to match whatever header and payload it has, so
    that a mutation reaches the framing and record checks behind the checksum."""
    if len(data) < BATCH_HEADER_BYTES:
        return data
    payload = data[BATCH_HEADER_BYTES:]
    checksum = header_checksum(data[:CHECKSUM_OFFSET], payload_hash(payload))
    return data[:CHECKSUM_OFFSET] + checksum.to_bytes(8, "little") + payload
