"""Bit rot: bytes flipped in closed segments are detected, and corrupt batches never served."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from laminar.log import (
    CorruptBatchError,
    FileDirectory,
    LogConfig,
    SegmentedLog,
    split_batches,
)
from laminar.log.segment import index_name, store_name
from laminar.log.store import STORE_HEADER_BYTES

from .helpers import make_batch

CONFIG = LogConfig(segment_bytes=8192, max_batch_bytes=4096)


def build(path: str) -> tuple[dict[int, bytes], tuple[int, ...]]:
    """A closed log of several segments; returns every batch's bytes by base index."""
    log = SegmentedLog.open(FileDirectory(path), CONFIG)
    for tag in range(120):
        log.append(make_batch(tag, records=1 + tag % 4), term=1)
    batches: dict[int, bytes] = {}
    index = 0
    while index < log.next_index:
        result = log.read_range(index, 1 << 20)
        for batch in split_batches(result.data):
            batches[int.from_bytes(batch[8:16], "little")] = bytes(batch)
        index = result.next_index
    bases = log.segment_base_indexes
    log.close()
    return batches, bases


def flip(path: Path, position: int, mask: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)[0]
        f.seek(position)
        f.write(bytes([byte ^ mask]))


def served_batches(log: SegmentedLog) -> tuple[dict[int, bytes], list[int]]:
    """Read every index one batch at a time: what is served, and which batches are refused."""
    served: dict[int, bytes] = {}
    refused: list[int] = []
    index = log.start_index
    while index < log.next_index:
        try:
            result = log.read(index)
        except CorruptBatchError as e:
            refused.append(e.index)
            index = log.batch_range(index)[1]
            continue
        served[result.first_index] = result.data
        index = result.next_index
    return served, refused


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("lose_index", [False, True])
def test_flipped_bytes_in_a_sealed_segment_are_never_served(
    tmp_path: Path, seed: int, lose_index: bool
):
    rng = random.Random(seed)
    path = tmp_path / "log"
    batches, bases = build(str(path))
    victim = bases[rng.randrange(len(bases) - 1)]  # a sealed segment
    store = path / store_name(victim)
    size = store.stat().st_size
    flipped = sorted(rng.sample(range(STORE_HEADER_BYTES, size), rng.randint(1, 3)))
    for position in flipped:
        flip(store, position, 1 << rng.randrange(8))
    if lose_index:
        (path / index_name(victim)).unlink()

    log = SegmentedLog.open(FileDirectory(str(path)), CONFIG)
    served, refused = served_batches(log)
    assert refused, "damage must be detected"
    for base, data in served.items():
        assert data == batches[base]  # whatever is served is exactly what was written
    # nothing outside the damaged segment is lost or refused
    victim_end = bases[bases.index(victim) + 1]
    for base in batches:
        if not victim <= base < victim_end:
            assert base in served
    assert all(victim <= i < victim_end for i in refused)
    # a range read that reaches the damage stops before it, never past or through it
    first_bad = refused[0]
    if first_bad > victim:
        result = log.read_range(victim, 1 << 20)
        assert result.next_index <= first_bad
        assert b"".join(batches[b] for b in sorted(served) if victim <= b < first_bad).startswith(
            result.data
        )
    log.close()


def test_flipped_store_header_is_repaired_without_losing_batches(tmp_path: Path):
    path = tmp_path / "log"
    batches, bases = build(str(path))
    flip(path / store_name(bases[1]), 20, 0xFF)  # created_ms field
    log = SegmentedLog.open(FileDirectory(str(path)), CONFIG)
    assert log.recovery.repairs and not log.recovery.cuts
    served, refused = served_batches(log)
    assert refused == [] and served == batches
    log.close()


def test_flipped_index_file_is_rebuilt(tmp_path: Path):
    path = tmp_path / "log"
    batches, bases = build(str(path))
    index_file = path / index_name(bases[0])
    flip(index_file, index_file.stat().st_size - 3, 0x10)  # inside an entry's position
    log = SegmentedLog.open(FileDirectory(str(path)), CONFIG)
    assert log.recovery.segments[0].index_rebuilt
    served, refused = served_batches(log)
    assert refused == [] and served == batches
    log.close()


def test_damaged_length_field_with_lost_index_becomes_a_refused_hole(tmp_path: Path):
    """Two faults in a sealed segment (a length field and the index file): the framing chain
    breaks, so recovery resynchronises at the next valid batch and refuses the span between.
    Nothing after the damage is lost."""
    path = tmp_path / "log"
    batches, bases = build(str(path))
    log = SegmentedLog.open(FileDirectory(str(path)), CONFIG)
    positions = list(log._segments[0].index.positions)
    log.close()
    flip(path / store_name(bases[0]), positions[3] + 27, 0x7F)  # high byte of payload_bytes
    (path / index_name(bases[0])).unlink()
    log = SegmentedLog.open(FileDirectory(str(path)), CONFIG)
    assert log.recovery.cuts == () and log.recovery.corrupt_indexes
    served, refused = served_batches(log)
    damaged_base = sorted(batches)[3]
    assert refused == [damaged_base]
    assert served == {b: d for b, d in batches.items() if b != damaged_base}
    log.close()


def test_damaged_tail_of_a_sealed_segment_is_a_hole_up_to_the_next_segment(tmp_path: Path):
    path = tmp_path / "log"
    batches, bases = build(str(path))
    log = SegmentedLog.open(FileDirectory(str(path)), CONFIG)
    last_position = log._segments[0].index.positions[-1]
    log.close()
    flip(path / store_name(bases[0]), last_position + 1, 0x01)  # magic of its last batch
    (path / index_name(bases[0])).unlink()
    log = SegmentedLog.open(FileDirectory(str(path)), CONFIG)
    served, refused = served_batches(log)
    last_base = max(b for b in batches if b < bases[1])
    assert refused == [last_base]
    assert served == {b: d for b, d in batches.items() if b != last_base}
    assert log.segment_base_indexes == bases
    log.close()


def _active_log(path: Path, batches: int = 6) -> list[tuple[int, int, int]]:
    """A log of one segment (never sealed) with `batches` batches of terms 1, 1, ... then 2:
    each batch's (position, end, base index); the log is closed without an index file."""
    log = SegmentedLog.open(FileDirectory(str(path)), CONFIG)
    for tag in range(batches):
        log.append(make_batch(tag, records=2), term=1 if tag < batches - 1 else 2)
    located = [(*log.batch_location(i)[1:], i) for i in range(0, log.next_index, 2)]
    log.close()
    (path / index_name(0)).unlink(missing_ok=True)  # the next open scans the store
    return located


def test_damage_inside_the_active_segment_is_reported_with_what_followed(tmp_path: Path):
    located = _active_log(tmp_path)
    start, _, base = located[2]
    flip(tmp_path / store_name(0), start + 80, 0x04)
    log = SegmentedLog.open(FileDirectory(str(tmp_path)), CONFIG)
    assert log.next_index == base  # cut at the damaged batch, as before
    assert log.recovery.lost is not None
    assert log.recovery.lost.first_index == base
    assert log.recovery.lost.last == (11, 2)  # the last record of what followed, its term


def test_a_whole_last_batch_that_fails_its_checksum_is_damage_not_a_torn_write(tmp_path: Path):
    located = _active_log(tmp_path)
    start, _, base = located[-1]
    flip(tmp_path / store_name(0), start + 80, 0x04)
    log = SegmentedLog.open(FileDirectory(str(tmp_path)), CONFIG)
    assert log.next_index == base
    assert log.recovery.lost is not None and log.recovery.lost.first_index == base
    assert log.recovery.lost.last is None  # nothing valid followed: its own header is suspect


def test_a_torn_write_at_the_end_loses_nothing_that_was_written(tmp_path: Path):
    located = _active_log(tmp_path)
    start, end, base = located[-1]
    with open(tmp_path / store_name(0), "r+b") as f:
        f.truncate(start + (end - start) // 2)
    log = SegmentedLog.open(FileDirectory(str(tmp_path)), CONFIG)
    assert log.next_index == base and log.recovery.cut_bytes > 0
    assert log.recovery.lost is None
