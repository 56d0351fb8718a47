"""Flipping one bit inside a batch's payload in a sealed segment of a stopped broker's data
directory (docs/formats.md §1-2: a 40-byte store header, then 72-byte batch headers each
followed by its payload)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from laminar.log.batch import BATCH_HEADER_BYTES, parse_header
from laminar.log.store import STORE_HEADER_BYTES


@dataclass(frozen=True)
class Flip:
    path: str
    byte_offset: int
    bit: int
    batch_base_index: int
    batch_record_count: int
    control: bool


def sealed_segments(data_dir: Path) -> list[Path]:
    """Every store file that is not the newest of its partition directory."""
    found: list[Path] = []
    for directory in sorted((data_dir / "partitions").glob("*/*")):
        stores = sorted(directory.glob("*.log"))
        found.extend(stores[:-1])
    return found


def batch_spans(path: Path) -> list[tuple[int, int, int, int, bool]]:
    """(offset, payload_bytes, base_index, record_count, control) of each whole batch."""
    data = path.read_bytes()
    spans = []
    offset = STORE_HEADER_BYTES
    while offset + BATCH_HEADER_BYTES <= len(data):
        header = parse_header(data, offset)
        if offset + header.batch_bytes > len(data):
            break
        spans.append(
            (offset, header.payload_bytes, header.base_index, header.record_count,
             header.is_control)
        )  # fmt: skip
        offset += header.batch_bytes
    return spans


def flip_sealed_bit(data_dir: Path, rng: random.Random) -> Flip | None:
    """Flip one bit in the payload of a batch (user data when there is any) of a sealed
    segment; None when the broker has no sealed segment."""
    candidates = [(p, batch_spans(p)) for p in sealed_segments(data_dir)]
    candidates = [(p, spans) for p, spans in candidates if spans]
    if not candidates:
        return None
    path, spans = candidates[rng.randrange(len(candidates))]
    data_spans = [s for s in spans if not s[4]] or spans
    offset, payload_bytes, base_index, count, control = data_spans[rng.randrange(len(data_spans))]
    byte_offset = offset + BATCH_HEADER_BYTES + rng.randrange(payload_bytes)
    bit = rng.randrange(8)
    with open(path, "r+b") as f:
        f.seek(byte_offset)
        byte = f.read(1)[0]
        f.seek(byte_offset)
        f.write(bytes([byte ^ (1 << bit)]))
    return Flip(str(path), byte_offset, bit, base_index, count, control)
