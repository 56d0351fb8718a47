"""Benchmark laminar's segmented log against raw file I/O: append, durable append, reopen, read.

The log is `SegmentedLog`, driven as the broker drives it (raft/log_storage.py, server/node.py):
appends only write, and `sync` is one fdatasync covering everything written before it. fsync
`always` appends one batch and syncs it before the next; `always xN` is group commit, N
producers' batches written in one round and made durable by that round's one `sync`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any, ClassVar

from laminar.log import (
    BATCH_HEADER_BYTES,
    FileDirectory,
    FsyncPolicy,
    LogConfig,
    Record,
    SegmentedLog,
    encode_batch,
    verify_batch,
)
from laminar.log import records as record_rules

# Record value sizes, named as in laminarmq's benchmarks.
SIZES: dict[str, int] = {
    "tiny": 12,
    "tweet": 140,
    "half_k": 560,
    "k": 1120,
    "linked_in_post": 2940,
    "blog": 11760,
}
COUNTS = (10_000, 1_000_000)
BATCHES = (1, 10, 100, 1000)
FSYNCS = ("never", "always")
RECORD_OVERHEAD_BYTES = 14  # record header: i32 delta, i32 key len, i32 value len, u16 headers

MIB = 1024 * 1024
MB = 1_000_000  # throughput unit: 10^6 bytes of encoded batch data (headers + framing + values)
READ_CHUNK_BYTES = 4 * MIB
SEGMENT_BYTES = 64 * MIB
MAX_BATCH_BYTES = 16 * MIB
RAW_READ_PASSES = 2
POOL_BATCHES = 8  # distinct pre-encoded batches cycled by the writers
FIXED_NOW_MS = 1_700_000_000_000

# Targets from the issue: reported, never enforced through the exit status.
TARGET_DURABLE_RATIO = 0.70
TARGET_NOSYNC_MB_S = 400.0
TARGET_READ_MB_S = 1000.0

QUICK_MAX_SECONDS = 5.0
DEFAULT_MAX_SECONDS = 20.0
#: interleaved durable comparison (k records, batch 100): writes per side, writes per block
AB_WRITES, AB_QUICK_WRITES, AB_BLOCK_WRITES = 3000, 600, 20


#: --verify: records per batch, value bytes, calls per timed block, bytes each append side
#: may write before its log is started over (keeps the disk use bounded)
VERIFY_BATCHES = (1, 100, 1000)
VERIFY_VALUE_BYTES = 100
VERIFY_BLOCK_RECORDS = 10_000
VERIFY_LOG_BYTES = 256 * MIB

# ---- results --------------------------------------------------------------------------------


@dataclass(slots=True)
class WriteStats:
    records: int
    batches: int
    bytes: int
    seconds: float
    capped: bool
    latencies_ns: array[int]
    close_ms: float


@dataclass(slots=True)
class RawWrite:
    writes: int
    bytes: int
    seconds: float
    capped: bool
    p50_us: float  # per write (+ fdatasync)
    read_bytes: int = 0
    read_seconds: float = 0.0
    read_capped: bool = False

    @property
    def mb_s(self) -> float:
        return rate(self.bytes, self.seconds) / MB

    @property
    def read_mb_s(self) -> float:
        return rate(self.read_bytes, self.read_seconds) / MB


@dataclass(slots=True)
class ReadStats:
    open_ms: float
    bytes: int
    batches: int
    records: int
    seconds: float
    capped: bool
    complete: bool  # every record written was read back, in order


@dataclass(slots=True)
class EncodeResult:
    size: str
    value_bytes: int
    batch: int
    batch_bytes: int
    encodes: int
    seconds: float
    records_per_s: float
    mb_s: float


@dataclass(slots=True)
class CaseResult:
    size: str
    value_bytes: int
    count: int
    batch: int
    fsync: str  # "never", "always" (one producer) or "always xN" (rounds of N batches)
    concurrency: int
    batch_bytes: int
    records_written: int
    batches_written: int
    bytes_written: int
    time_capped: bool
    write_seconds: float
    records_per_s: float
    mb_s: float
    p50_us: float
    p99_us: float
    max_us: float
    close_ms: float
    raw_kind: str  # "write" or "write+fdatasync"
    raw_mb_s: float  # the best raw run next to this case (conservative for the ratio)
    raw_mb_s_runs: list[float]
    raw_writes: list[int]
    raw_p50_us: float  # best (lowest) per-write p50 of the raw runs
    #: raw_p50_us / p50_us: a latency ratio, robust to stalls (meaningful for 1 producer)
    p50_ratio: float | None
    ratio: float | None
    open_ms: float
    read_bytes: int
    read_seconds: float
    read_capped: bool
    read_complete: bool
    read_mb_s: float
    raw_read_mb_s: float
    raw_read_mb_s_runs: list[float]
    read_ratio: float | None
    notes: list[str] = field(default_factory=list)


def rate(amount: float, seconds: float) -> float:
    return amount / seconds if seconds > 0 else 0.0


def ratio(ours: float, raw: float) -> float | None:
    return ours / raw if raw > 0 else None


def percentile_us(sorted_ns: Sequence[int], fraction: float) -> float:
    """Nearest-rank percentile of sorted nanosecond samples, in microseconds."""
    if not sorted_ns:
        return 0.0
    rank = min(len(sorted_ns) - 1, max(0, math.ceil(fraction * len(sorted_ns)) - 1))
    return sorted_ns[rank] / 1000


# ---- workload ----------------------------------------------------------------------------


def batch_bytes_for(value_bytes: int, records: int) -> int:
    return BATCH_HEADER_BYTES + records * (RECORD_OVERHEAD_BYTES + value_bytes)


def make_records(rng: random.Random, value_bytes: int, count: int) -> list[Record]:
    return [Record(value=rng.randbytes(value_bytes)) for _ in range(count)]


def encode_pool(value_bytes: int, batch: int, batches: int, seed: int) -> list[bytes]:
    """Up to POOL_BATCHES distinct encoded batches of `batch` records each."""
    rng = random.Random(seed)
    pool = []
    for _ in range(max(1, min(POOL_BATCHES, batches))):
        encoded = encode_batch(make_records(rng, value_bytes, batch), now_ms=FIXED_NOW_MS)
        assert len(encoded) == batch_bytes_for(value_bytes, batch), len(encoded)
        pool.append(encoded)
    return pool


def make_schedule(pool: list[bytes], value_bytes: int, batch: int, count: int) -> list[bytes]:
    """The batches to append: `count` records, `batch` per batch (the last may be short)."""
    full, rest = divmod(count, batch)
    schedule = [pool[i % len(pool)] for i in range(full)]
    if rest:
        records = make_records(random.Random(count), value_bytes, rest)
        schedule.append(encode_batch(records, now_ms=FIXED_NOW_MS))
    return schedule


def measure_encode(size: str, value_bytes: int, batch: int, budget_s: float) -> EncodeResult:
    """Producer-side encode_batch throughput, kept apart from the append numbers."""
    records = make_records(random.Random(1), value_bytes, batch)
    encode_batch(records, now_ms=FIXED_NOW_MS)  # warm up
    clock = time.perf_counter
    encodes = 0
    start = clock()
    deadline = start + budget_s
    while True:
        encode_batch(records, now_ms=FIXED_NOW_MS)
        encodes += 1
        now = clock()
        if now >= deadline:
            break
    seconds = now - start
    size_bytes = batch_bytes_for(value_bytes, batch)
    return EncodeResult(
        size,
        value_bytes,
        batch,
        size_bytes,
        encodes,
        seconds,
        rate(encodes * batch, seconds),
        rate(encodes * size_bytes, seconds) / MB,
    )


# ---- our log --------------------------------------------------------------------------------


def log_config(fsync: str) -> LogConfig:
    return LogConfig(
        segment_bytes=SEGMENT_BYTES, max_batch_bytes=MAX_BATCH_BYTES, fsync=FsyncPolicy(fsync)
    )


def write_never(path: str, schedule: list[bytes], budget_ns: int) -> WriteStats:
    """SegmentedLog.append of every scheduled batch (no fsync), each call timed."""
    log = SegmentedLog.open(FileDirectory(path), log_config("never"))
    latencies = array("q")
    add = latencies.append
    append = log.append
    clock = time.perf_counter_ns
    nbytes = 0
    start = clock()
    deadline = start + budget_ns
    for batch in schedule:
        t0 = clock()
        append(batch)
        t1 = clock()
        add(t1 - t0)
        nbytes += len(batch)
        if t1 >= deadline:
            break
    seconds = (clock() - start) / 1e9
    records = log.next_index - log.start_index
    t0 = clock()
    log.close()
    close_ms = (clock() - t0) / 1e6
    capped = len(latencies) < len(schedule)
    return WriteStats(records, len(latencies), nbytes, seconds, capped, latencies, close_ms)


def write_always(path: str, schedule: list[bytes], budget_ns: int, concurrency: int) -> WriteStats:
    """SegmentedLog under fsync=always as the broker's driver uses it: rounds of `concurrency`
    batches (one from each of that many concurrent producers), each round appended and then
    made durable by one `sync`, so its batches share one fdatasync (group commit).

    Each batch's latency is its round's time, from the round's first write to the end of its
    fdatasync (every producer in a round waits for all of it); with concurrency 1 every batch
    is its own round: append, then fdatasync. Not included: the broker's hand-off of the sync
    to a worker thread, and a producer's wait for the round in flight when its batch arrives.
    """
    log = SegmentedLog.open(FileDirectory(path), log_config("always"))
    latencies = array("q")
    append, sync = log.append, log.sync
    clock = time.perf_counter_ns
    per_round = max(1, concurrency)
    nbytes = 0
    start = clock()
    deadline = start + budget_ns
    for first in range(0, len(schedule), per_round):
        round_ = schedule[first : first + per_round]
        t0 = clock()
        for batch in round_:
            append(batch)
        sync()
        t1 = clock()
        latencies.extend([t1 - t0] * len(round_))
        nbytes += sum(len(batch) for batch in round_)
        if t1 >= deadline:
            break
    seconds = (clock() - start) / 1e9
    records = log.next_index - log.start_index
    t0 = clock()
    log.close()
    close_ms = (clock() - t0) / 1e6
    capped = len(latencies) < len(schedule)
    return WriteStats(records, len(latencies), nbytes, seconds, capped, latencies, close_ms)


def durable_ab(
    work_dir: str, schedule: list[bytes], block_writes: int, max_writes: int, budget_ns: int
) -> dict[str, float]:
    """Ours (SegmentedLog.append then sync per batch, fsync=always) against raw
    os.write+fdatasync of the same bytes, interleaved in alternating blocks (the order flips
    every block) so that drift in this VM's disk speed lands on both sides alike. Same bytes
    each side: the ratio of times is the ratio of throughputs."""
    log = SegmentedLog.open(FileDirectory(os.path.join(work_dir, "ab-log")), log_config("always"))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(os.path.join(work_dir, "ab-raw"), flags, 0o644)
    clock = time.perf_counter_ns
    spent = {"ours": 0, "raw": 0}
    nbytes = writes = 0
    deadline = clock() + budget_ns
    try:
        block = 0
        while writes < max_writes and clock() < deadline:
            batches = [schedule[(writes + i) % len(schedule)] for i in range(block_writes)]
            for side in ("ours", "raw") if block % 2 == 0 else ("raw", "ours"):
                t0 = clock()
                if side == "ours":
                    for batch in batches:
                        log.append(batch)
                        log.sync()
                else:
                    for batch in batches:
                        os.write(fd, batch)
                        os.fdatasync(fd)
                spent[side] += clock() - t0
            writes += block_writes
            nbytes += sum(len(b) for b in batches)
            block += 1
    finally:
        os.close(fd)
        log.close()
        shutil.rmtree(os.path.join(work_dir, "ab-log"), ignore_errors=True)
        os.unlink(os.path.join(work_dir, "ab-raw"))
    return {
        "writes_per_side": writes,
        "ours_mb_s": rate(nbytes, spent["ours"] / 1e9) / MB,
        "raw_mb_s": rate(nbytes, spent["raw"] / 1e9) / MB,
        "ratio": spent["raw"] / spent["ours"] if spent["ours"] else 0.0,
    }


def read_back(path: str, fsync: str, expected_records: int, budget_ns: int) -> ReadStats:
    """Reopen (recovery) and read everything sequentially with read_range(4 MiB)."""
    clock = time.perf_counter_ns
    t0 = clock()
    log = SegmentedLog.open(FileDirectory(path), log_config(fsync))
    open_ms = (clock() - t0) / 1e6
    try:
        index, end = log.start_index, log.next_index
        read_range = log.read_range
        nbytes = batches = 0
        start = clock()
        deadline = start + budget_ns
        while index < end:
            result = read_range(index, READ_CHUNK_BYTES)
            nbytes += len(result.data)
            batches += result.batch_count
            index = result.next_index
            if clock() >= deadline:
                break
        seconds = (clock() - start) / 1e9
        capped = index < end
        complete = not capped and end - log.start_index == expected_records
        records = index - log.start_index
        return ReadStats(open_ms, nbytes, batches, records, seconds, capped, complete)
    finally:
        log.close()


# ---- the machine's limit ----------------------------------------------------------------------


def raw_write_read(
    path: str, schedule: list[bytes], max_writes: int, budget_ns: int, *, sync: bool
) -> RawWrite:
    """os.write the same batch bytes in the same sizes to a fresh file (fdatasync after each
    write if `sync`), then os.pread it back in 4 MiB chunks from the page cache."""
    clock = time.perf_counter_ns
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, 0o644)
    writes = nbytes = 0
    try:
        write, fdatasync = os.write, os.fdatasync
        latencies = array("q")
        add = latencies.append
        t0 = start = clock()
        deadline = start + budget_ns
        for batch in itertools.islice(schedule, max_writes):
            if write(fd, batch) != len(batch):
                raise OSError(f"short write to {path}")
            if sync:
                fdatasync(fd)
            t1 = clock()
            add(t1 - t0)
            t0 = t1
            writes += 1
            nbytes += len(batch)
            if t1 >= deadline:
                break
        seconds = (clock() - start) / 1e9
    finally:
        os.close(fd)
    capped = writes < min(max_writes, len(schedule))
    raw = RawWrite(writes, nbytes, seconds, capped, percentile_us(sorted(latencies), 0.5))
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        pread = os.pread
        for _ in range(RAW_READ_PASSES):  # keep the best pass: the limit, not our noise
            position = 0
            start = clock()
            deadline = start + budget_ns
            while True:
                data = pread(fd, READ_CHUNK_BYTES, position)
                if not data:
                    break
                position += len(data)
                if clock() >= deadline:
                    break
            seconds = (clock() - start) / 1e9
            if raw.read_seconds == 0 or rate(position, seconds) > raw.read_mb_s * MB:
                raw.read_bytes, raw.read_seconds = position, seconds
                raw.read_capped = position < nbytes
    finally:
        os.close(fd)
        os.unlink(path)
    return raw


def settle() -> None:
    """Untimed: flush dirty pages left by the previous phase so their writeback does not land
    inside the next phase's timing (each phase deletes its files, so little is left)."""
    os.sync()


def warm_allocator() -> None:
    """Allocate and free a buffer larger than a read chunk once, before any timing.

    glibc serves big allocations with mmap until a freed mmapped chunk raises its threshold;
    until then every 4 MiB read buffer is a fresh mapping that page-faults, and whichever
    reader runs first in the process looks slow. Warming up treats ours and raw alike.
    """
    buffer = bytearray(2 * READ_CHUNK_BYTES)
    buffer[::4096] = bytes(len(buffer) // 4096)
    del buffer


# ---- cases ----------------------------------------------------------------------------------


def case_result(
    size: str,
    count: int,
    batch: int,
    label: str,
    concurrency: int,
    schedule: list[bytes],
    written: WriteStats,
    read: ReadStats,
    raws: list[RawWrite],
    *,
    sync: bool,
) -> CaseResult:
    value_bytes = SIZES[size]
    latencies = sorted(written.latencies_ns)
    mb_s = rate(written.bytes, written.seconds) / MB
    read_mb_s = rate(read.bytes, read.seconds) / MB
    raw_mb_s = max(r.mb_s for r in raws)
    raw_read = max(r.read_mb_s for r in raws)
    raw_p50 = min(r.p50_us for r in raws)
    p50 = percentile_us(latencies, 0.50)
    notes = []
    if not read.complete and not read.capped:
        notes.append("READ MISMATCH: records read back differ from records written")
    if written.records != sum(_records_in(b) for b in schedule[: written.batches]):
        notes.append("WRITE MISMATCH: log next_index differs from records appended")
    return CaseResult(
        size=size,
        value_bytes=value_bytes,
        count=count,
        batch=batch,
        fsync=label,
        concurrency=concurrency,
        batch_bytes=batch_bytes_for(value_bytes, batch),
        records_written=written.records,
        batches_written=written.batches,
        bytes_written=written.bytes,
        time_capped=written.capped,
        write_seconds=written.seconds,
        records_per_s=rate(written.records, written.seconds),
        mb_s=mb_s,
        p50_us=p50,
        p99_us=percentile_us(latencies, 0.99),
        max_us=latencies[-1] / 1000 if latencies else 0.0,
        close_ms=written.close_ms,
        raw_kind="write+fdatasync" if sync else "write",
        raw_mb_s=raw_mb_s,
        raw_mb_s_runs=[round(r.mb_s, 1) for r in raws],
        raw_writes=[r.writes for r in raws],
        raw_p50_us=raw_p50,
        p50_ratio=ratio(raw_p50, p50),
        ratio=ratio(mb_s, raw_mb_s),
        open_ms=read.open_ms,
        read_bytes=read.bytes,
        read_seconds=read.seconds,
        read_capped=read.capped,
        read_complete=read.complete,
        read_mb_s=read_mb_s,
        raw_read_mb_s=raw_read,
        raw_read_mb_s_runs=[round(r.read_mb_s, 1) for r in raws],
        read_ratio=ratio(read_mb_s, raw_read),
        notes=notes,
    )


def _records_in(batch: bytes) -> int:
    return int.from_bytes(batch[28:32], "little")  # record_count field of the batch header


def run_cases(
    work_dir: str,
    size: str,
    count: int,
    batch: int,
    pool: list[bytes],
    fsyncs: Sequence[str],
    concurrency: int,
    budget_ns: int,
    emit: Callable[[CaseResult], None],
) -> list[CaseResult]:
    """The cases of one size/count/batch, each with raw runs right before and after it.

    never:  raw write, ours, raw write (same number of writes as ours).
    always: raw sync, ours (1 producer), raw sync, ours (rounds of N batches, one sync each),
    raw sync; each case is compared with the better raw run on either side of it.
    """
    value_bytes = SIZES[size]
    schedule = make_schedule(pool, value_bytes, batch, count)
    results: list[CaseResult] = []
    raw_path = os.path.join(work_dir, "raw.bin")

    def ours_dir(label: str) -> str:
        return os.path.join(work_dir, "log-" + label.replace(" ", ""))

    def read_and_remove(label: str, written: WriteStats, sync: bool) -> ReadStats:
        path = ours_dir(label)
        read = read_back(path, "always" if sync else "never", written.records, budget_ns)
        shutil.rmtree(path)  # before the raw run that follows, so nothing of ours is left dirty
        return read

    def raw(max_writes: int, sync: bool) -> RawWrite:
        settle()
        return raw_write_read(raw_path, schedule, max_writes, budget_ns, sync=sync)

    def report(
        label: str, n: int, written: WriteStats, read: ReadStats, raws: list[RawWrite], sync: bool
    ) -> None:
        result = case_result(size, count, batch, label, n, schedule, written, read, raws, sync=sync)
        results.append(result)
        emit(result)

    if "never" in fsyncs:
        before = raw(len(schedule), False)
        settle()
        written = write_never(ours_dir("never"), schedule, budget_ns)
        read = read_and_remove("never", written, False)
        after = raw(written.batches, False)
        report("never", 1, written, read, [before, after], False)

    if "always" in fsyncs:
        before = raw(len(schedule), True)
        settle()
        written = write_always(ours_dir("always"), schedule, budget_ns, 1)
        read = read_and_remove("always", written, True)
        between = raw(written.batches, True)
        report("always", 1, written, read, [before, between], True)
        if concurrency > 1:
            label = f"always x{concurrency}"
            settle()
            written = write_always(ours_dir(label), schedule, budget_ns, concurrency)
            read = read_and_remove(label, written, True)
            after = raw(written.batches, True)
            report(label, concurrency, written, read, [between, after], True)
    return results


# ---- output ---------------------------------------------------------------------------------

COLUMNS = (
    ("size", "<14"),
    ("count", ">9"),
    ("batch", ">5"),
    ("fsync", "<9"),
    ("written", ">9"),
    ("rec/s", ">10"),
    ("MB/s", ">8"),
    ("p50 us", ">8"),
    ("p99 us", ">8"),
    ("raw MB/s", ">8"),
    ("ratio", ">6"),
    ("rd MB/s", ">8"),
    ("raw rd", ">8"),
    ("rd ratio", ">8"),
    ("open ms", ">8"),
)


def format_row(values: Sequence[str]) -> str:
    return " ".join(f"{v:{spec}}" for v, (_, spec) in zip(values, COLUMNS, strict=True))


def fmt_mb(value: float) -> str:
    """MB/s with about three significant digits for small values."""
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}" if value >= 1 else f"{value:.3f}"


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def case_row(r: CaseResult) -> str:
    return format_row(
        (
            r.size,
            str(r.count),
            str(r.batch),
            r.fsync,
            f"{r.records_written}{'*' if r.time_capped else ''}",
            f"{r.records_per_s:,.0f}",
            fmt_mb(r.mb_s),
            f"{r.p50_us:.1f}",
            f"{r.p99_us:.1f}",
            fmt_mb(r.raw_mb_s),
            fmt_ratio(r.ratio),
            fmt_mb(r.read_mb_s) + ("*" if r.read_capped else ""),
            fmt_mb(r.raw_read_mb_s),
            fmt_ratio(r.read_ratio),
            f"{r.open_ms:.1f}",
        )
    ) + ("  " + "; ".join(r.notes) if r.notes else "")


def print_encode_table(results: list[EncodeResult]) -> None:
    print("encode_batch throughput (producer side, not part of the append numbers):")
    print(f"  {'size':<14} {'batch':>5} {'batch B':>10} {'records/s':>12} {'MB/s':>8}")
    for e in results:
        print(
            f"  {e.size:<14} {e.batch:>5} {e.batch_bytes:>10} "
            f"{e.records_per_s:>12,.0f} {e.mb_s:>8.1f}"
        )
    print()


def print_case_header(max_seconds: float, concurrency: int) -> None:
    print(
        "MB = 10^6 bytes of encoded batch data written or read (72 B batch header + 14 B per "
        "record + values); MB/s = batch bytes / wall seconds."
    )
    print(
        "raw MB/s: os.write of the same batches to a fresh file next to the log (never) or "
        "os.write+os.fdatasync per batch (always*); best run before/after the case; "
        "raw rd: best of 2 passes."
    )
    print(
        "ratio = MB/s / raw MB/s; rd = read_range(4 MiB) after reopen vs raw os.pread(4 MiB); "
        "latency per batch (always: append through the fdatasync covering it)."
    )
    print(
        f"* after 'written' or 'rd MB/s': cut by --max-seconds={max_seconds:g}; "
        f"'always x{concurrency}' = rounds of {concurrency} batches, one sync each (group "
        "commit)."
    )
    print()
    print(format_row([name for name, _ in COLUMNS]))
    print("-" * len(format_row([name for name, _ in COLUMNS])))


def headline(cases: list[CaseResult]) -> dict[str, Any]:
    """Headline numbers from the k (1120 B) records, batch 100 cases (largest count run)."""
    chosen = [c for c in cases if c.size == "k" and c.batch == 100]
    if chosen:
        count = max(c.count for c in chosen)
        chosen = [c for c in chosen if c.count == count]
    never = next((c for c in chosen if c.fsync == "never"), None)
    always = next((c for c in chosen if c.fsync == "always"), None)
    return {
        "headline_case": {"size": "k", "batch": 100, "count": chosen[0].count if chosen else None},
        "durable_ratio": always.ratio if always else None,
        "durable_p50_ratio": always.p50_ratio if always else None,
        "durable_mb_s": always.mb_s if always else None,
        "raw_sync_mb_s": always.raw_mb_s if always else None,
        "nosync_mb_s": never.mb_s if never else None,
        "raw_write_mb_s": never.raw_mb_s if never else None,
        "nosync_ratio": never.ratio if never else None,
        "read_mb_s": never.read_mb_s if never else None,
        "raw_read_mb_s": never.raw_read_mb_s if never else None,
        "read_ratio": never.read_ratio if never else None,
    }


def print_targets(head: dict[str, Any]) -> dict[str, bool | None]:
    """Print the issue's targets with PASS/FAIL markers (informational: never the exit code)."""
    checks = (
        ("durable_ratio", TARGET_DURABLE_RATIO, "{:.2f}"),
        ("nosync_mb_s", TARGET_NOSYNC_MB_S, "{:.1f}"),
        ("read_mb_s", TARGET_READ_MB_S, "{:.0f}"),
    )
    case = head["headline_case"]
    print()
    if case["count"] is None:
        print("targets: not evaluated (they need the k records, batch 100 cases: --sizes k ...)")
    else:
        print(f"targets (k records, batch {case['batch']}, count {case['count']}):")
    verdicts: dict[str, bool | None] = {}
    for key, target, fmt in checks:
        value = head[key]
        if value is None:
            verdicts[key] = None
            print(f"  [ n/a] {key} >= {target:g}: case not run")
            continue
        ok = value >= target
        verdicts[key] = ok
        print(f"  [{'PASS' if ok else 'FAIL'}] {key} >= {target:g}: {fmt.format(value)}")
    limits = (
        ("write", head["raw_write_mb_s"]),
        ("write+fdatasync", head["raw_sync_mb_s"]),
        ("pread", head["raw_read_mb_s"]),
    )
    if "durable_ab" in head:
        ab = head["durable_ab"]
        print(
            f"  (info) durable_ratio is interleaved A/B: {ab['writes_per_side']} appends vs "
            f"{ab['writes_per_side']} raw write+fdatasync in alternating blocks of "
            f"{AB_BLOCK_WRITES}: ours {fmt_mb(ab['ours_mb_s'])} MB/s, raw "
            f"{fmt_mb(ab['raw_mb_s'])} MB/s; separate-phase ratio "
            f"{fmt_ratio(head['durable_phase_ratio'])}"
        )
    if head["durable_p50_ratio"] is not None:
        print(
            "  (info) durable latency view, raw p50 / our p50 per append: "
            f"{head['durable_p50_ratio']:.2f}"
        )
    shown = [f"{name} {fmt_mb(value)} MB/s" for name, value in limits if value is not None]
    if shown:
        print("  raw limits next to those cases: " + ", ".join(shown))
    return verdicts


# ---- main -----------------------------------------------------------------------------------


def parse_list(text: str, allowed: Sequence[str] | None, kind: str) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"empty {kind} list")
    if allowed is not None:
        unknown = [item for item in items if item not in allowed]
        if unknown:
            raise argparse.ArgumentTypeError(
                f"unknown {kind} {', '.join(unknown)} (choose from {', '.join(allowed)})"
            )
    return items


def parse_ints(text: str, kind: str) -> list[int]:
    try:
        values = [int(item.replace("_", "")) for item in parse_list(text, None, kind)]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"bad {kind} list {text!r}") from e
    if any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{kind} must be positive")
    return values


# ---- --verify: what checking every record costs the append path (issue 19) ----------------


@dataclass(slots=True)
class VerifyResult:
    what: str  # verify_batch | append (SegmentedLog.append, fsync never)
    batch: int  # records per batch
    mode: str  # header+checksum | +records (C) | +records (Python)
    records_per_s: float  # records per batch / the median block's time per call
    p50_us: float  # per call (batch): percentiles of the blocks' means
    p99_us: float
    ratio: float | None = None  # records/s against header+checksum alone


def _timed_blocks(
    sides: dict[str, Callable[[], object]], calls: int, budget_ns: int
) -> dict[str, list[float]]:
    """Per-call ns of each side, one sample per block of `calls` calls; the sides take turns
    block by block (the order flipping every round), so drift on this noisy VM hits all. One
    untimed block of each first (warm caches and allocator)."""
    clock = time.perf_counter_ns
    samples: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for call in sides.values():
        for _ in range(calls):
            call()
    deadline = clock() + budget_ns
    rounds = 0
    while clock() < deadline or rounds < 5:
        order = names if rounds % 2 == 0 else names[::-1]
        for name in order:
            call = sides[name]
            t0 = clock()
            for _ in range(calls):
                call()
            samples[name].append((clock() - t0) / calls)
        rounds += 1
    return samples


def _summarise(
    what: str, batch: int, samples: dict[str, list[float]], base: str
) -> list[VerifyResult]:
    out = []
    rates = {}
    for mode, per_call in samples.items():
        ordered = [int(v) for v in sorted(per_call)]
        p50_us = percentile_us(ordered, 0.50)
        # from the median block: other processes on this 2-core VM inflate some blocks a lot
        rates[mode] = rate(batch, p50_us / 1e6)
        out.append(
            VerifyResult(what, batch, mode, rates[mode], p50_us, percentile_us(ordered, 0.99))
        )
    for result in out:
        result.ratio = ratio(result.records_per_s, rates[base])
    return out


def measure_verify(max_seconds: float, directory: str) -> list[VerifyResult]:
    """verify_batch with and without the record walk (C, and the Python reference for
    scale), then SegmentedLog.append (fsync never) with and without it, on batches of 1, 100
    and 1000 records of 100 B."""
    budget_ns = int(max_seconds * 1e9)
    results: list[VerifyResult] = []
    for batch in VERIFY_BATCHES:
        records = make_records(random.Random(batch), VERIFY_VALUE_BYTES, batch)
        data = encode_batch(records, now_ms=FIXED_NOW_MS)
        calls = max(1, VERIFY_BLOCK_RECORDS // batch)
        samples = _timed_blocks(_verify_sides(data), calls, budget_ns)
        results += _summarise("verify_batch", batch, samples, "header+checksum")
        with _AppendSides(data, directory) as sides:
            samples = _timed_blocks(sides.calls(), max(1, calls // 4), budget_ns)
        results += _summarise("append, fsync never", batch, samples, "header+checksum")
    return results


def _verify_sides(data: bytes) -> dict[str, Callable[[], object]]:
    header, _ = verify_batch(data, MAX_BATCH_BYTES)
    payload = memoryview(data)[BATCH_HEADER_BYTES:]
    count, first, top = header.record_count, header.first_timestamp_ms, header.max_timestamp_ms
    reference = record_rules.records_problem_py

    def checksum_only() -> object:
        return verify_batch(data, MAX_BATCH_BYTES, check_records=False)

    def with_records() -> object:
        return verify_batch(data, MAX_BATCH_BYTES)

    def with_python() -> object:
        verify_batch(data, MAX_BATCH_BYTES, check_records=False)
        return reference(payload, count, first, top)

    compiled = "+records (C)" if record_rules.COMPILED else "+records (no C!)"
    return {
        "header+checksum": checksum_only,
        compiled: with_records,
        "+records (Python)": with_python,
    }


class _AppendSides:
    """Two file logs (fsync never) appending `data`, one checking records and one not; each
    starts over past VERIFY_LOG_BYTES, so the disk use stays bounded."""

    MODES: ClassVar[dict[str, bool]] = {"header+checksum": False, "+records (C)": True}

    def __init__(self, data: bytes, directory: str) -> None:
        self.data = data
        self.paths = {m: tempfile.mkdtemp(prefix="verify-", dir=directory) for m in self.MODES}
        self.logs = {m: self._open(m) for m in self.MODES}

    def _open(self, mode: str) -> SegmentedLog:
        return SegmentedLog.open(FileDirectory(self.paths[mode]), log_config("never"))

    def calls(self) -> dict[str, Callable[[], object]]:
        return {mode: partial(self._append, mode, check) for mode, check in self.MODES.items()}

    def _append(self, mode: str, check: bool) -> object:
        log = self.logs[mode]
        if log.size_bytes >= VERIFY_LOG_BYTES:
            log.close()
            shutil.rmtree(self.paths[mode], ignore_errors=True)
            log = self.logs[mode] = self._open(mode)
        return log.append(self.data, check_records=check)

    def __enter__(self) -> _AppendSides:
        return self

    def __exit__(self, *_: object) -> None:
        for mode, log in self.logs.items():
            log.close()
            shutil.rmtree(self.paths[mode], ignore_errors=True)


def print_verify_table(results: list[VerifyResult], max_seconds: float) -> None:
    print(
        f"Record checks at append: batches of 1/100/1000 records of {VERIFY_VALUE_BYTES} B; "
        f"sides alternate in blocks, {max_seconds:g} s in all; records/s from the median "
        "block."
    )
    print(f"C walker built: {record_rules.COMPILED}")
    print(
        f"{'what':<22} {'batch':>5} {'mode':<18} {'records/s':>13} {'p50 us':>9} {'p99 us':>9} "
        f"{'ratio':>6}"
    )
    for r in results:
        print(
            f"{r.what:<22} {r.batch:>5} {r.mode:<18} {r.records_per_s:>13,.0f} "
            f"{r.p50_us:>9.2f} {r.p99_us:>9.2f} {fmt_ratio(r.ratio):>6}"
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=(
            "Benchmark laminar's segmented log (fsync never/always, group commit as the broker "
            "does it, reopen, sequential read) against raw os.write/fdatasync/pread on the "
            "same disk."
        )
    )
    parser.add_argument(
        "--sizes",
        type=lambda s: parse_list(s, list(SIZES), "size"),
        default=list(SIZES),
        help=f"record value sizes (default all: {','.join(SIZES)})",
    )
    parser.add_argument(
        "--counts",
        type=lambda s: parse_ints(s, "count"),
        default=list(COUNTS),
        help="records per case (default 10000,1000000)",
    )
    parser.add_argument(
        "--batches",
        type=lambda s: parse_ints(s, "batch size"),
        default=list(BATCHES),
        help="records per batch (default 1,10,100,1000)",
    )
    parser.add_argument(
        "--fsync",
        type=lambda s: parse_list(s, FSYNCS, "fsync policy"),
        default=list(FSYNCS),
        help="fsync policies (default never,always)",
    )
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help=f"time budget per phase of a case (default {DEFAULT_MAX_SECONDS:g}; "
        f"{QUICK_MAX_SECONDS:g} with --quick)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=8,
        help="batches per round (one sync each) in the group-commit 'always xN' case "
        "(<= 1 skips it; default 8)",
    )
    parser.add_argument(
        "--dir",
        default=None,
        help="parent of the temporary data directory (default: the system temp dir, /tmp)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="only k records, batch 100, 10000 records, never + always (+ concurrent); ~1 s",
    )
    parser.add_argument(
        "--json", action="store_true", help="print all results as one JSON object, last line"
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="only time verify_batch and SegmentedLog.append with and without the record "
        "checks (issue 19), batches of 1/100/1000 records of 100 B; --max-seconds per side "
        "(default 2)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.verify:
        seconds = 2.0 if args.max_seconds is None else args.max_seconds
        root = tempfile.mkdtemp(prefix="laminar-bench-verify-", dir=args.dir)
        try:
            verified = measure_verify(seconds, root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        print_verify_table(verified, seconds)
        if args.json:
            print(json.dumps({"verify": [asdict(v) for v in verified]}))
        return 0
    if args.quick:
        args.sizes, args.counts, args.batches = ["k"], [10_000], [100]
        args.fsync = list(FSYNCS)
    max_seconds = args.max_seconds
    if max_seconds is None:
        max_seconds = QUICK_MAX_SECONDS if args.quick else DEFAULT_MAX_SECONDS
    if max_seconds <= 0:
        print("--max-seconds must be positive", file=sys.stderr)
        return 2
    for size in args.sizes:
        for batch in args.batches:
            if batch_bytes_for(SIZES[size], batch) > MAX_BATCH_BYTES:
                print(f"a batch of {batch} {size} records exceeds 16 MiB", file=sys.stderr)
                return 2
    budget_ns = int(max_seconds * 1e9)
    encode_budget_s = 0.1 if args.quick else 0.3
    began = time.perf_counter()

    warm_allocator()
    if args.dir is not None:
        os.makedirs(args.dir, exist_ok=True)
    root = tempfile.mkdtemp(prefix="laminar-bench-", dir=args.dir)
    encodes: list[EncodeResult] = []
    cases: list[CaseResult] = []
    try:
        for size in args.sizes:
            for batch in args.batches:
                encodes.append(measure_encode(size, SIZES[size], batch, encode_budget_s))
        print_encode_table(encodes)
        print_case_header(max_seconds, args.concurrency)

        def emit(result: CaseResult) -> None:
            print(case_row(result), flush=True)

        case_number = 0
        for size in args.sizes:
            for batch in args.batches:
                most_batches = max(math.ceil(c / batch) for c in args.counts)
                pool = encode_pool(SIZES[size], batch, most_batches, seed=batch)
                for count in args.counts:
                    case_number += 1
                    work_dir = os.path.join(root, f"case-{case_number:03d}")
                    os.mkdir(work_dir)
                    print(f"[bench] {size} count={count} batch={batch}", file=sys.stderr)
                    try:
                        cases += run_cases(
                            work_dir,
                            size,
                            count,
                            batch,
                            pool,
                            args.fsync,
                            args.concurrency,
                            budget_ns,
                            emit,
                        )
                    finally:
                        shutil.rmtree(work_dir, ignore_errors=True)
                del pool
    finally:
        shutil.rmtree(root, ignore_errors=True)

    head = headline(cases)
    if "always" in args.fsync and "k" in args.sizes and 100 in args.batches:
        print("[bench] interleaved durable A/B, k records, batch 100", file=sys.stderr)
        schedule = encode_pool(SIZES["k"], 100, 8, seed=100)
        ab_dir = tempfile.mkdtemp(prefix="laminar-bench-ab-", dir=args.dir)
        try:
            settle()
            ab = durable_ab(
                ab_dir,
                schedule,
                AB_BLOCK_WRITES,
                AB_QUICK_WRITES if args.quick else AB_WRITES,
                budget_ns,
            )
        finally:
            shutil.rmtree(ab_dir, ignore_errors=True)
        head["durable_phase_ratio"] = head["durable_ratio"]
        head["durable_ratio"] = ab["ratio"]
        head["durable_ab"] = ab
    verdicts = print_targets(head)
    total_s = time.perf_counter() - began
    print(f"total {total_s:.1f} s")
    if args.json:
        document = {
            **head,
            "targets": {
                "durable_ratio": TARGET_DURABLE_RATIO,
                "nosync_mb_s": TARGET_NOSYNC_MB_S,
                "read_mb_s": TARGET_READ_MB_S,
                "pass": verdicts,
            },
            "settings": {
                "max_seconds": max_seconds,
                "concurrency": args.concurrency,
                "segment_bytes": SEGMENT_BYTES,
                "max_batch_bytes": MAX_BATCH_BYTES,
                "read_chunk_bytes": READ_CHUNK_BYTES,
                "mb": MB,
                "quick": args.quick,
            },
            "total_seconds": total_s,
            "encode": [asdict(e) for e in encodes],
            "cases": [asdict(c) for c in cases],
        }
        print(json.dumps(document))
    return 0


if __name__ == "__main__":
    sys.exit(main())
