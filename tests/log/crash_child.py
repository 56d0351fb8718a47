"""Child process for the SIGKILL crash test: appends to a SegmentedLog until it is killed.

It works as the broker's driver does: each round writes a few batches, then one `sync` makes
them all durable, and only then are they acknowledged: `ack <base_index> <tag> <records>`
(flushed) per batch. A kill cannot tear a single `pwritev`, so some batches are written with
`begin_stream` in small chunks with pauses between them: a kill usually lands in the middle of
one and leaves a torn batch on disk for recovery to cut.
"""

from __future__ import annotations

import random
import sys
import time

from laminar.log import BATCH_HEADER_BYTES, FileDirectory, FsyncPolicy, LogConfig, SegmentedLog

from .helpers import make_batch

CONFIG = LogConfig(segment_bytes=64 * 1024, max_batch_bytes=16 * 1024, fsync=FsyncPolicy.ALWAYS)
MAX_ROUNDS = 100_000
MAX_BATCHES_PER_ROUND = 6


def stream(log: SegmentedLog, batch: bytes, rng: random.Random) -> int:
    """Write `batch` in chunks of 1-400 bytes, pausing between them; its base index."""
    append = log.begin_stream(batch[:BATCH_HEADER_BYTES])
    offset = BATCH_HEADER_BYTES
    while offset < len(batch):
        size = rng.randint(1, 400)
        append.write(batch[offset : offset + size])
        offset += size
        time.sleep(0.0005)
    return append.commit().base_index


def main(path: str, seed: int) -> None:
    log = SegmentedLog.open(FileDirectory(path), CONFIG)
    sys.stdout.write(f"open {log.next_index}\n")
    sys.stdout.flush()
    # every run differs, and its tags start above every earlier run's (a tag <= its base)
    rng = random.Random(f"{seed} {log.next_index}")
    tag = log.next_index
    for _ in range(MAX_ROUNDS):
        written: list[tuple[int, int, int]] = []
        for _ in range(rng.randint(1, MAX_BATCHES_PER_ROUND)):
            records = rng.randint(1, 8)
            batch = make_batch(tag, records=records, value_bytes=rng.randint(1, 300))
            if rng.random() < 0.5:
                base_index = stream(log, batch, rng)
            else:
                base_index = log.append(batch).base_index
            written.append((base_index, tag, records))
            tag += 1
        log.sync()  # the round's one fdatasync: every batch above is durable now
        sys.stdout.write("".join(f"ack {b} {t} {r}\n" for b, t, r in written))
        sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
