"""Helpers shared by the log tests: deterministic batches and whole-log reads."""

from __future__ import annotations

from laminar.log import Record, SegmentedLog, decode_batches, encode_batch


def make_batch(tag: int, records: int = 3, value_bytes: int = 20) -> bytes:
    """A batch whose record values identify it: b'<tag>.<i>' padded to value_bytes."""
    return encode_batch(
        [
            Record(
                value=f"{tag}.{i}".encode().ljust(value_bytes, b"."),
                key=f"k{tag}".encode(),
                headers=(("h", str(i).encode()),),
                timestamp_ms=1_700_000_000_000 + tag,
            )
            for i in range(records)
        ],
        producer_id=7,
        producer_seq=tag,
    )


def read_records(log: SegmentedLog) -> list[tuple[int, bytes | None]]:
    """(index, value) of every record, checking indexes are dense and ascending."""
    out: list[tuple[int, bytes | None]] = []
    index = log.start_index
    while index < log.next_index:
        result = log.read_range(index, 1 << 20)
        assert result.batch_count > 0
        for record in decode_batches(result.data):
            out.append((record.index, record.value))
        index = result.next_index
    assert [i for i, _ in out] == list(range(log.start_index, log.next_index))
    return out
