"""The records-section rules checked at append (issue 19, poison batches): every malformed
shape is refused with a clear message although the checksum holds, valid batches (control
batches, null keys and values, headers) pass, and the C walker agrees with its Python
reference on random and mutated batches."""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import laminar
from laminar.log import (
    BATCH_HEADER_BYTES,
    BatchFramingError,
    MemoryDirectory,
    Record,
    SegmentedLog,
    decode_batch,
    encode_batch,
    verify_batch,
)
from laminar.log.batch import (
    BATCH_HEADER,
    BATCH_MAGIC,
    BATCH_VERSION,
    CHECKSUM_OFFSET,
    CONTROL_ATTRIBUTE,
    header_checksum,
    payload_hash,
    records_from,
    stamp_header,
)
from laminar.log.errors import MalformedRecordsError
from laminar.log.records import (
    COMPILED,
    MAX_TIMESTAMP_MS,
    records_problem,
    records_problem_py,
)
from laminar.queue.entries import encode_entry
from laminar.queue.state import Accept
from laminar.raft.log_storage import LogStorage
from laminar.raft.messages import ConfChange, ConfChangeKind, ConfState, Entry, EntryKind
from laminar.raft.raft import encode_control

NOW_MS = 1_700_000_000_000


def record_bytes(
    delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[bytes, bytes]] = (),  # type: ignore[assignment]
    *,
    key_bytes: int | None = None,
    value_bytes: int | None = None,
    header_count: int | None = None,
) -> bytes:
    """One record as it is framed, any field overridable (to frame it wrongly)."""
    out = struct.pack(
        "<iiiH",
        delta,
        (-1 if key is None else len(key)) if key_bytes is None else key_bytes,
        (-1 if value is None else len(value)) if value_bytes is None else value_bytes,
        len(headers) if header_count is None else header_count,
    )
    out += (key or b"") + (value or b"")
    for name, field in headers:
        out += struct.pack("<HI", len(name), len(field)) + name + field
    return out


def raw_batch(
    payload: bytes,
    record_count: int,
    first_ms: int = NOW_MS,
    max_ms: int | None = None,
    *,
    control: bool = False,
) -> bytes:
    """A batch around `payload` with whatever header fields are given and a valid checksum:
    what a buggy producer (or a fuzzer) can send."""
    prefix = BATCH_HEADER.pack(
        BATCH_MAGIC,
        BATCH_VERSION,
        CONTROL_ATTRIBUTE if control else 0,
        0,
        0,
        len(payload),
        record_count,
        0,
        0,
        first_ms,
        first_ms if max_ms is None else max_ms,
        0,
    )[:CHECKSUM_OFFSET]
    checksum = header_checksum(prefix, payload_hash(payload))
    return prefix + checksum.to_bytes(8, "little") + payload


def malformed(batch: bytes) -> str:
    """The message verify_batch refuses `batch` with (it must refuse it)."""
    with pytest.raises(MalformedRecordsError) as raised:
        verify_batch(batch, 1 << 20)
    assert isinstance(raised.value, BatchFramingError)
    return str(raised.value)


def test_the_c_walker_is_built() -> None:
    # `pip install -e .` (or `python setup.py build_ext --inplace`) builds it; without it the
    # broker walks every appended record in Python
    assert COMPILED, "laminar.log._records is not built"


FALLBACK = """
import sys
sys.modules["laminar.log._records"] = None  # as if it were not built
from laminar.log import records, verify_batch
from laminar.log.errors import MalformedRecordsError
assert not records.COMPILED and records.records_problem is records.records_problem_py
try:
    verify_batch(bytes.fromhex(sys.argv[1]), 1 << 20)
except MalformedRecordsError as e:
    print(e)
"""


def test_without_the_extension_the_reference_checks_appends() -> None:
    source = str(Path(laminar.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([source, os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-c", FALLBACK, poison().hex()],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "record 0: key of 1000 bytes runs past" in result.stdout
    assert "appends check records in Python" in result.stderr  # the broker says so


# ---- each malformed shape ------------------------------------------------------------------


def test_a_key_or_value_past_the_end_is_refused() -> None:
    good = record_bytes(0, b"k", b"v")
    assert "record 1: key of 500 bytes runs past the records section end (byte 30 of 32)" in (
        malformed(raw_batch(good + record_bytes(0, b"k", b"v", key_bytes=500), 2))
    )
    message = malformed(raw_batch(record_bytes(0, b"k", b"v", value_bytes=3), 1))
    assert message.endswith(
        "record 0: value of 3 bytes runs past the records section end (byte 15 of 16)"
    )


def test_negative_lengths_other_than_null_are_refused() -> None:
    message = malformed(raw_batch(record_bytes(0, None, b"v", key_bytes=-2), 1))
    assert message.endswith("record 0: key length -2 is below -1")
    message = malformed(raw_batch(record_bytes(0, b"k", None, value_bytes=-(2**31)), 1))
    assert message.endswith(f"record 0: value length {-(2**31)} is below -1")


def test_headers_past_the_end_are_refused() -> None:
    headers = [(b"h", b"v")]
    message = malformed(raw_batch(record_bytes(0, None, b"x", headers, header_count=2), 1))
    assert "record 0: header 1 runs past the records section end (byte 23 of 23)" in message
    name_past = record_bytes(0, None, b"x", headers)[:-2]  # the name is the last byte but one
    name_past = name_past[:-6] + struct.pack("<HI", 9, 1)
    message = malformed(raw_batch(name_past, 1))
    assert "record 0: header 0: name of 9 bytes runs past" in message
    value_past = record_bytes(0, None, b"x", [(b"h", b"")])[:-7] + struct.pack("<HI", 1, 70)
    message = malformed(raw_batch(value_past + b"h", 1))
    assert "record 0: header 0: value of 70 bytes runs past" in message


def test_a_header_name_that_is_not_utf8_is_refused() -> None:
    for name in (b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"ok\xe2\x82"):  # overlong, surrogate
        message = malformed(raw_batch(record_bytes(0, None, b"x", [(name, b"v")]), 1))
        assert message.endswith("record 0: header 0: name is not valid UTF-8"), name


def test_a_record_count_that_disagrees_with_the_records_is_refused() -> None:
    two = record_bytes(0, b"a", b"1") + record_bytes(0, b"b", b"2")
    message = malformed(raw_batch(two + bytes(10), 3))  # (42 bytes could hold 3 headers)
    assert message.endswith(
        "record 2: its header runs past the records section end (byte 32 of 42)"
    )
    message = malformed(raw_batch(two, 1))
    assert message.endswith("16 bytes follow the last of 1 records")
    message = malformed(raw_batch(two + b"\0", 2))
    assert message.endswith("1 bytes follow the last of 2 records")
    # zero bytes frame empty records (delta 0, empty key and value): 30 are two, and 2 more
    message = malformed(raw_batch(two + bytes(30), 4))
    assert message.endswith("2 bytes follow the last of 4 records")


def test_timestamps_outside_the_valid_range_are_refused() -> None:
    one = record_bytes(0, None, b"x")
    # the fuzzer's: first_timestamp_ms near 2^63 plus a positive delta overflows 64 bits
    near = 2**63 - 10
    overflow = raw_batch(one + record_bytes(100, None, b"y"), 2, near, near)
    assert malformed(overflow).endswith(
        f"first_timestamp_ms {near} is outside [0, {MAX_TIMESTAMP_MS}]"
    )
    message = malformed(raw_batch(one + record_bytes(1, None, b"y"), 2, MAX_TIMESTAMP_MS))
    assert message.endswith(
        f"record 1: timestamp {MAX_TIMESTAMP_MS + 1} is outside [0, 253402300799999]"
    )
    message = malformed(raw_batch(one + record_bytes(-1, None, b"y"), 2, 0, 0))
    assert message.endswith("record 1: timestamp -1 is outside [0, 253402300799999]")
    message = malformed(raw_batch(one, 1, -5, -5))
    assert message.endswith("first_timestamp_ms -5 is outside [0, 253402300799999]")


def test_the_header_timestamps_must_agree_with_the_records() -> None:
    message = malformed(raw_batch(record_bytes(7, None, b"x"), 1, NOW_MS, NOW_MS + 7))
    assert "record 0: timestamp delta 7 is not 0" in message
    two = record_bytes(0, None, b"x") + record_bytes(40, None, b"y")
    message = malformed(raw_batch(two, 2, NOW_MS, NOW_MS + 39))
    assert message.endswith(
        f"max_timestamp_ms {NOW_MS + 39} is not the largest record timestamp, {NOW_MS + 40}"
    )
    assert "is not the largest" in malformed(raw_batch(two, 2, NOW_MS, NOW_MS + 41))


def test_encode_batch_refuses_timestamps_outside_the_range() -> None:
    for bad in (-1, MAX_TIMESTAMP_MS + 1, 2**63 - 1):
        with pytest.raises(BatchFramingError, match=f"record timestamp {bad} is outside"):
            encode_batch([Record(b"a", timestamp_ms=1), Record(b"b", timestamp_ms=bad)])
    encode_batch([Record(b"a", timestamp_ms=0), Record(b"b", timestamp_ms=2**31 - 1)])
    encode_batch([Record(b"a", timestamp_ms=MAX_TIMESTAMP_MS)])


# ---- valid batches -------------------------------------------------------------------------


def test_valid_batches_pass() -> None:
    batches = [
        encode_batch([Record(None)], now_ms=NOW_MS),
        encode_batch([Record(b"", b"")], now_ms=NOW_MS),
        encode_batch([Record(None, None, (("", b""), ("ü-名", b"\xff" * 3)))], now_ms=NOW_MS),
        encode_batch(
            [Record(b"v", b"k", timestamp_ms=t) for t in (5, 0, MAX_TIMESTAMP_MS - 2**31 + 6)][:2],
        ),
        encode_batch([Record(b"late", timestamp_ms=MAX_TIMESTAMP_MS)]),
        encode_batch([Record(bytes(100)) for _ in range(1000)], now_ms=NOW_MS),
        # the control batches the broker itself writes: Raft no-ops and configuration changes,
        # and queue commands (they go through the log too)
        encode_control(EntryKind.NOOP),
        encode_control(EntryKind.CONF, ConfChange(ConfChangeKind.ADD_LEARNER, "n2")),
        encode_entry(Accept("g", "c", (1, 2, 3), NOW_MS)),
    ]
    for batch in batches:
        header, _ = verify_batch(batch, 1 << 20)
        assert len(decode_batch(batch)) == header.record_count


def test_stamped_batches_carry_the_indexes_of_a_malformed_one() -> None:
    bad = raw_batch(record_bytes(0, b"k", b"v", key_bytes=50) + bytes(14), 2)
    _, digest = verify_batch(bad, 1 << 20, check_records=False)
    stamped = stamp_header(bad, 40, 3, digest) + bad[BATCH_HEADER_BYTES:]
    with pytest.raises(MalformedRecordsError) as raised:
        decode_batch(stamped)
    assert (raised.value.base_index, raised.value.next_index) == (40, 42)
    assert "malformed records in batch 40: record 0: key of 50 bytes" in str(raised.value)


# ---- the log and readers -------------------------------------------------------------------


def poison() -> bytes:
    """The fuzzer's finding: a valid checksum, a key length past the end of its record."""
    return raw_batch(record_bytes(0, b"key", b"value", key_bytes=1000), 1)


def test_the_log_refuses_malformed_records_and_stays_unchanged() -> None:
    log = SegmentedLog.open(MemoryDirectory())
    log.append(encode_batch([Record(b"a")]))
    size = log.size_bytes
    with pytest.raises(MalformedRecordsError, match="key of 1000 bytes"):
        log.append(poison())
    assert (log.next_index, log.size_bytes) == (1, size)
    # Raft replication stores what its leader holds (checked where it entered the cluster)
    assert log.append(poison(), check_records=False).base_index == 1


def test_raft_replicates_a_malformed_batch_its_leader_already_holds() -> None:
    """A follower stores what its leader committed, malformed or not: refusing it would stop
    replication of the partition for good (no replica could be added or repaired), and the
    broker's driver round would fail on every retry."""
    directory = MemoryDirectory()
    storage = LogStorage(directory, SegmentedLog.open(directory), conf=ConfState(("a",)))
    good = encode_batch([Record(b"a")])
    storage.append([Entry(0, 1, 1, good), Entry(1, 1, 1, poison()), Entry(2, 1, 1, good)])
    assert storage.last_index() == 2
    with pytest.raises(MalformedRecordsError):
        decode_batch(storage.log.read(1).data)


def test_a_streamed_batch_with_malformed_records_is_rolled_back() -> None:
    log = SegmentedLog.open(MemoryDirectory())
    log.append(encode_batch([Record(b"a")]))
    size = log.size_bytes
    batch = poison()
    stream = log.begin_stream(batch[:BATCH_HEADER_BYTES])
    stream.write(batch[BATCH_HEADER_BYTES:])
    with pytest.raises(MalformedRecordsError):
        stream.commit()
    assert (log.next_index, log.size_bytes) == (1, size)
    log.append(encode_batch([Record(b"b")]))  # the log takes appends again


def stored(batch: bytes, base: int) -> bytes:
    _, digest = verify_batch(batch, 1 << 20, check_records=False)
    return stamp_header(batch, base, 1, digest) + batch[BATCH_HEADER_BYTES:]


def test_records_from_stops_before_a_malformed_batch_and_names_where_to_go_on() -> None:
    good = stored(encode_batch([Record(b"a"), Record(b"b")]), 0)
    bad = stored(raw_batch(record_bytes(0, None, b"x") * 3, 2), 2)  # 3 records, count says 2
    after = stored(encode_batch([Record(b"c")]), 4)
    records, end, full = records_from(good + bad + after, 0, 100)
    assert [r.value for r in records] == [b"a", b"b"] and (end, full) == (2, True)
    for start in (2, 3):  # the read starts in it: nothing before it to answer
        with pytest.raises(MalformedRecordsError) as raised:
            records_from(bad + after, start, 100)
        assert raised.value.next_index == 4
    control = stored(encode_batch([Record(None, b"noop")], control=True), 2)
    with pytest.raises(MalformedRecordsError):
        records_from(control + stored(bad, 3), 2, 100)  # (control batches are no records)


# ---- the C walker against its reference ----------------------------------------------------

names = st.binary(max_size=6) | st.text(max_size=4).map(str.encode)
raw_records = st.lists(
    st.tuples(
        st.integers(-(2**31), 2**31 - 1) | st.integers(-3, 3),
        st.none() | st.binary(max_size=12),
        st.none() | st.binary(max_size=12),
        st.lists(st.tuples(names, st.binary(max_size=6)), max_size=3),
    ),
    min_size=0,
    max_size=8,
)
timestamps = st.sampled_from(
    [0, 1, NOW_MS, MAX_TIMESTAMP_MS, MAX_TIMESTAMP_MS + 1, -1, 2**63 - 1, -(2**63), 2**31]
) | st.integers(-(2**63), 2**63 - 1)
interesting_ints = st.sampled_from(
    [0, 1, -1, -2, 13, 14, 255, 2**15, 2**16 - 1, 2**31 - 1, -(2**31), 2**32 - 1]
)


def both(payload: bytes | bytearray | memoryview, count: int, first: int, top: int) -> str | None:
    """Both walkers' verdict, which must be the same, word for word."""
    compiled = records_problem(payload, count, first, top)
    reference = records_problem_py(payload, count, first, top)
    assert compiled == reference, (bytes(payload).hex(), count, first, top)
    return compiled


@pytest.mark.skipif(not COMPILED, reason="the C walker is not built")
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(raw_records, timestamps, st.integers(-1, 10), timestamps, st.data())
def test_the_walkers_agree_on_random_records(
    items: list[tuple[int, bytes | None, bytes | None, list[tuple[bytes, bytes]]]],
    first: int,
    count_shift: int,
    top: int,
    data: st.DataObject,
) -> None:
    payload = b"".join(record_bytes(*item) for item in items)
    counts = [len(items), len(items) + count_shift - 1, 0, 1]
    tops = [top]
    if items and 0 <= first <= MAX_TIMESTAMP_MS:
        tops.append(max(first + item[0] for item in items))
    for count in counts:
        for max_ms in tops:
            both(payload, count, first, max_ms)


@pytest.mark.skipif(not COMPILED, reason="the C walker is not built")
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.builds(
            Record,
            value=st.none() | st.binary(max_size=20),
            key=st.none() | st.binary(max_size=8),
            headers=st.lists(st.tuples(st.text(max_size=5), st.binary(max_size=5)), max_size=3).map(
                tuple
            ),
            timestamp_ms=st.integers(NOW_MS - 2**29, NOW_MS + 2**29),
        ),
        min_size=1,
        max_size=6,
    ),
    st.data(),
)
def test_the_walkers_agree_on_valid_and_mutated_batches(
    batch_records: list[Record], data: st.DataObject
) -> None:
    batch = encode_batch(batch_records, now_ms=NOW_MS, control=data.draw(st.booleans()))
    header, _ = verify_batch(batch, 1 << 20)  # valid as encoded
    payload = bytearray(batch[BATCH_HEADER_BYTES:])
    count, first, top = header.record_count, header.first_timestamp_ms, header.max_timestamp_ms
    assert both(payload, count, first, top) is None
    for _ in range(data.draw(st.integers(1, 4))):
        mutation = data.draw(st.sampled_from(["flip", "int32", "int16", "cut", "extend"]))
        if mutation == "flip" and payload:
            position = data.draw(st.integers(0, len(payload) - 1))
            payload[position] ^= 1 << data.draw(st.integers(0, 7))
        elif mutation in ("int32", "int16") and len(payload) >= 4:
            width = 4 if mutation == "int32" else 2
            position = data.draw(st.integers(0, len(payload) - width))
            value = data.draw(interesting_ints) % (1 << (8 * width))
            payload[position : position + width] = value.to_bytes(width, "little")
        elif mutation == "cut":
            del payload[data.draw(st.integers(0, len(payload))) :]
        else:
            payload += data.draw(st.binary(min_size=1, max_size=20))
        both(payload, count, first, top)
        both(bytes(payload), count + data.draw(st.integers(-1, 1)), first, top)


@pytest.mark.skipif(not COMPILED, reason="the C walker is not built")
@settings(max_examples=300)
@given(st.binary(max_size=200), st.integers(-5, 40), timestamps, timestamps)
def test_the_walkers_agree_on_random_bytes(
    payload: bytes, count: int, first: int, top: int
) -> None:
    both(payload, count, first, top)
    both(payload, count, 0, 0)


@pytest.mark.skipif(not COMPILED, reason="the C walker is not built")
def test_the_walker_reads_nothing_past_the_buffer_it_is_given() -> None:
    # a record whose value runs past the end of the view, but not past the end of the bytes
    # the view is cut from: a walker reading beyond its buffer would call it valid
    whole = record_bytes(0, None, b"0123456789")
    for cut in range(len(whole)):
        view = memoryview(whole)[:cut]
        assert both(view, 1, NOW_MS, NOW_MS) is not None
        assert both(bytearray(whole[:cut]), 1, NOW_MS, NOW_MS) is not None
    assert both(memoryview(b"xx" + whole)[2:], 1, NOW_MS, NOW_MS) is None
    with pytest.raises(TypeError):
        records_problem("not bytes", 1, 0, 0)  # type: ignore[arg-type]


@pytest.mark.skipif(not COMPILED, reason="the C walker is not built")
def test_the_walkers_agree_on_many_random_mutations_of_a_large_batch() -> None:
    """Beyond what Hypothesis explores: a 200-record batch, 3000 random mutations (seeded)."""
    rng = random.Random(19)
    batch = encode_batch(
        [
            Record(
                rng.randbytes(rng.randrange(0, 40)) if rng.random() < 0.9 else None,
                rng.randbytes(rng.randrange(0, 8)) if rng.random() < 0.5 else None,
                tuple(("h" * rng.randrange(4), rng.randbytes(3)) for _ in range(rng.randrange(3))),
                NOW_MS + rng.randrange(-1000, 1000),
            )
            for _ in range(200)
        ]
    )
    header, _ = verify_batch(batch, 1 << 20)
    payload = batch[BATCH_HEADER_BYTES:]
    problems = 0
    for _ in range(3000):
        mutated = bytearray(payload)
        for _ in range(rng.randrange(1, 4)):
            position = rng.randrange(len(mutated))
            mutated[position] = rng.randrange(256)
        problems += (
            both(mutated, header.record_count, header.first_timestamp_ms, header.max_timestamp_ms)
            is not None
        )
    assert problems > 1000  # most mutations break something, and both saw the same
