"""The disk's cost model for a broker's round: what an append's fdatasync costs against the
bytes it flushes and against how many files are flushed at once, and what one journal for all
files would save.

A round (`laminar.server.node`) writes each log it appended to and fdatasyncs each, the logs'
jobs in concurrent threads. Four measurements, each of `--rounds` rounds:

* one file, appended to and fdatasync'd, at growing sizes: a fixed cost and a bandwidth;
* the same bytes a round spread over 1, 2, 4 and 8 files synced concurrently: whether the
  syncs of different files overlap on this disk, or each pays the fixed cost in turn;
* 4 files appended to (each append changes the file's size, so ext4 commits its own journal
  too) against 4 files written where zeros were written and synced before;
* the same 4 files made durable through one journal instead: each written without a sync, the
  round's bytes appended to the journal and only that synced, the files synced every
  `CHECKPOINT_ROUNDS` rounds by a thread of their own; the journal extending, or written into
  zeros (a journal allocated once and reused).

    python3 bench/disk_bench.py [--dir DIR] [--rounds 300] [--max-seconds 60]

Prints a table, then one JSON line. The files live in a directory made under `--dir` (default:
the current directory) and are removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/: machine
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "broker"))
from machine import load_avg_1m

from laminar.bench import percentile_ms

KIB = 1024
SIZES_KIB = (4, 16, 64, 256, 1024)
#: a round's bytes, and the numbers of files they are spread over
SPREAD_KIB = 256
SPREADS = (1, 2, 4, 8)
#: the zeros and journal comparisons: files a round, bytes each
ROUND_FILES, ROUND_KIB = 4, 64
#: rounds between two syncs of the files behind a journal
CHECKPOINT_ROUNDS = 64
#: a file's bytes at most (zeros written, or appended): past them, writes go round to its start
#: again, an appended file emptied first so that it goes on growing
MAX_FILE_BYTES = 64 * 1024 * KIB
MAX_ROUNDS = 10_000


def advance(fd: int, position: int, size: int, zeroed: int) -> int:
    """Where a write of `size` bytes goes after one at `position`: the end of that one, or the
    start when it would not fit the zeros written before (`zeroed` bytes), or, in a file that
    is appended to (`zeroed` 0), `MAX_FILE_BYTES`; such a file is emptied then."""
    position += size
    if position + size <= (zeroed or MAX_FILE_BYTES):
        return position
    if not zeroed:
        os.ftruncate(fd, 0)
    return 0


def write_zeros(fd: int, size: int) -> None:
    """`size` bytes of zeros from the start of `fd`, synced (its blocks then exist: a write
    there changes neither the file's size nor its extents)."""
    zeros = bytes(1024 * KIB)
    for position in range(0, size, len(zeros)):
        os.pwrite(fd, zeros[: size - position], position)
    if size:
        os.fsync(fd)


class Round:
    """Files in `directory`, each appended `size` bytes and fdatasync'd a round, the files'
    work in concurrent threads."""

    def __init__(self, directory: Path, name: str, files: int, size: int, zeroed: int) -> None:
        """`zeroed`: bytes of zeros written and synced to each file first (0: none)."""
        self.block = os.urandom(size)
        self.zeroed = zeroed
        self.descriptors = []
        for i in range(files):
            fd = os.open(directory / f"{name}-{i}", os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o600)
            self.descriptors.append(fd)
            write_zeros(fd, zeroed)
        self.positions = [0] * files

    def one(self, i: int) -> None:
        fd = self.descriptors[i]
        os.pwrite(fd, self.block, self.positions[i])
        os.fdatasync(fd)
        self.positions[i] = advance(fd, self.positions[i], len(self.block), self.zeroed)

    def close(self) -> None:
        for fd in self.descriptors:
            os.close(fd)


class JournalRound(Round):
    """The same files and bytes a round, made durable through one journal: each file is
    written without a sync, the round's bytes appended to a journal and that one fdatasync'd,
    and every `CHECKPOINT_ROUNDS` rounds the files synced in a thread of their own while the
    rounds go on (so the journal up to there could be dropped)."""

    def __init__(self, directory: Path, name: str, files: int, size: int, zeroed: int) -> None:
        """`zeroed`: bytes of zeros written and synced to the journal first (0: none)."""
        super().__init__(directory, name, files, size, 0)
        self.journal = os.open(directory / f"{name}-journal", os.O_CREAT | os.O_RDWR, 0o600)
        write_zeros(self.journal, zeroed)
        self.journal_zeroed = zeroed
        self.journal_at = 0
        self.rounds = 0
        self.checkpoints = ThreadPoolExecutor(1)
        self.checkpoint: Future[None] | None = None

    def write(self, i: int) -> None:
        fd = self.descriptors[i]
        os.pwrite(fd, self.block, self.positions[i])
        self.positions[i] = advance(fd, self.positions[i], len(self.block), 0)

    def run(self, pool: ThreadPoolExecutor) -> None:
        writes = [pool.submit(self.write, i) for i in range(len(self.descriptors))]
        parts = [self.block] * len(self.descriptors)
        os.pwritev(self.journal, parts, self.journal_at)
        self.journal_at = advance(
            self.journal, self.journal_at, len(self.block) * len(parts), self.journal_zeroed
        )
        os.fdatasync(self.journal)
        for write in writes:
            write.result()
        self.rounds += 1
        if self.rounds % CHECKPOINT_ROUNDS == 0:
            if self.checkpoint is not None:
                self.checkpoint.result()  # one at a time: a slow disk slows the rounds
            self.checkpoint = self.checkpoints.submit(self.sync_files)

    def sync_files(self) -> None:
        for fd in self.descriptors:
            os.fdatasync(fd)

    def close(self) -> None:
        self.checkpoints.shutdown(wait=True)
        os.close(self.journal)
        super().close()


def timed(run: Callable[[], object], rounds: int, until: float) -> list[float]:
    """Each round's seconds (sorted), `rounds` of them or fewer at `until` (at least one)."""
    taken: list[float] = []
    while len(taken) < rounds and (not taken or time.monotonic() < until):
        started = time.perf_counter()
        run()
        taken.append(time.perf_counter() - started)
    return sorted(taken)


def measure(
    directory: Path,
    pool: ThreadPoolExecutor,
    name: str,
    files: int,
    size: int,
    *,
    rounds: int,
    seconds: float,
    zeroed: bool = False,
    journal: bool = False,
) -> dict[str, float]:
    """`rounds` rounds (fewer if they take over `seconds`) of `files` files, `size` bytes each:
    each file synced, or (`journal`) through a journal. `zeroed`: into zeros written before,
    for the rounds or `MAX_FILE_BYTES` (the writes then go round)."""
    if journal:
        zeros = min(files * size * rounds, MAX_FILE_BYTES) if zeroed else 0
        journaled = JournalRound(directory, name, files, size, zeros)
        until = time.monotonic() + seconds
        try:
            taken = timed(lambda: journaled.run(pool), rounds, until)
        finally:
            journaled.close()
        return summary(taken, files, size)
    zeros = min(size * rounds, MAX_FILE_BYTES) if zeroed else 0
    work = Round(directory, name, files, size, zeros)
    until = time.monotonic() + seconds
    try:
        if files == 1:
            taken = timed(lambda: work.one(0), rounds, until)
        else:
            taken = timed(lambda: list(pool.map(work.one, range(files))), rounds, until)
    finally:
        work.close()
    return summary(taken, files, size)


def summary(taken_s: list[float], files: int, size: int) -> dict[str, float]:
    """Percentiles of a case's rounds (seconds, sorted) of `files` files of `size` bytes."""
    p50_ms, p90_ms = (percentile_ms(taken_s, q) for q in (0.5, 0.9))
    assert p50_ms is not None and p90_ms is not None  # `timed` runs at least one round
    p50_us = p50_ms * 1000
    return {
        "p50_us": round(p50_us, 1),
        "p90_us": round(p90_ms * 1000, 1),
        "mb_per_s": round(files * size / p50_us, 1),  # bytes per µs
        "rounds": len(taken_s),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=Path.cwd(), help="where to make the files")
    parser.add_argument("--rounds", type=int, default=300, help="rounds a measurement")
    parser.add_argument("--max-seconds", type=float, default=60.0, help="bound on the whole run")
    args = parser.parse_args(argv)
    if not 1 <= args.rounds <= MAX_ROUNDS:
        parser.error(f"--rounds must be 1..{MAX_ROUNDS}")
    if not 0 < args.max_seconds <= 3600:
        parser.error("--max-seconds must be above 0 and at most 3600")
    cases = len(SIZES_KIB) + len(SPREADS) + 4
    share_s = args.max_seconds / cases
    directory = Path(tempfile.mkdtemp(prefix="disk-bench-", dir=args.dir))
    result: dict[str, object] = {"load_avg_1m": load_avg_1m(), "dir": str(args.dir)}
    print(f"{'case':50} {'p50 µs':>9} {'p90 µs':>9} {'MB/s':>8}")

    def row(key: str, label: str, measured: dict[str, float]) -> None:
        result[key] = measured
        print(
            f"{label:50} {measured['p50_us']:9.1f} {measured['p90_us']:9.1f}"
            f" {measured['mb_per_s']:8.1f}",
            flush=True,
        )

    try:
        with ThreadPoolExecutor(max(SPREADS)) as pool:
            for kib in SIZES_KIB:
                measured = measure(
                    directory, pool, f"size{kib}", 1, kib * KIB,
                    rounds=args.rounds, seconds=share_s,
                )  # fmt: skip
                row(f"one_file_{kib}kib", f"1 file, {kib} KiB appended and synced", measured)
            for files in SPREADS:
                kib = SPREAD_KIB // files
                measured = measure(
                    directory, pool, f"spread{files}", files, kib * KIB,
                    rounds=args.rounds, seconds=share_s,
                )  # fmt: skip
                label = f"{SPREAD_KIB} KiB over {files} files at once"
                row(f"spread_{files}_files", label, measured)
            for zeroed in (False, True):
                measured = measure(
                    directory, pool, f"zeroed{zeroed}", ROUND_FILES, ROUND_KIB * KIB,
                    rounds=args.rounds, seconds=share_s, zeroed=zeroed,
                )  # fmt: skip
                how = "into zeros written before" if zeroed else "extending"
                label = f"{ROUND_FILES} files x {ROUND_KIB} KiB, {how}"
                row(f"files_{'zeroed' if zeroed else 'extending'}", label, measured)
            for zeroed in (False, True):
                measured = measure(
                    directory, pool, f"journal{zeroed}", ROUND_FILES, ROUND_KIB * KIB,
                    rounds=args.rounds, seconds=share_s, zeroed=zeroed, journal=True,
                )  # fmt: skip
                how = "into zeros written before" if zeroed else "extending"
                label = f"{ROUND_FILES} x {ROUND_KIB} KiB, one journal, {how}"
                row(f"journal_{'zeroed' if zeroed else 'extending'}", label, measured)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    one, four = (result[f"spread_{n}_files"]["p50_us"] for n in (1, 4))  # type: ignore[index]
    result["spread_4_over_1"] = round(four / one, 2)
    print(f"{SPREAD_KIB} KiB over 4 files takes {result['spread_4_over_1']}x as long as in 1")
    files, journal = (result[k]["p50_us"] for k in ("files_extending", "journal_zeroed"))  # type: ignore[index]
    result["journal_zeroed_over_files"] = round(journal / files, 2)
    print(
        f"{ROUND_FILES} files through a journal written into zeros take"
        f" {result['journal_zeroed_over_files']}x as long as synced each"
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
