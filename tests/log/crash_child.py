"""Child process for the SIGKILL crash test: appends with fsync=always until it is killed.

Prints `ack <base_index> <tag> <records>` (flushed) after each append that CommitLog reported
durable. Half the producers stream their batches in slow chunks, so a kill usually lands in
the middle of a streaming append and leaves a torn batch on disk.
"""

from __future__ import annotations

import asyncio
import random
import sys
from collections.abc import AsyncIterator

from laminar.log import BATCH_HEADER_BYTES, CommitLog, LogConfig

from .helpers import make_batch

CONFIG = LogConfig(segment_bytes=64 * 1024, max_batch_bytes=16 * 1024, fsync="always")
MAX_APPENDS_PER_PRODUCER = 100_000


async def chunks(batch: bytes, rng: random.Random) -> AsyncIterator[bytes]:
    yield batch[:BATCH_HEADER_BYTES]
    offset = BATCH_HEADER_BYTES
    while offset < len(batch):
        size = rng.randint(1, 400)
        yield batch[offset : offset + size]
        offset += size
        await asyncio.sleep(0.0005)


async def produce(log: CommitLog, producer: int, seed: int, out: list[str]) -> None:
    rng = random.Random(seed * 100 + producer)
    for n in range(MAX_APPENDS_PER_PRODUCER):
        tag = producer * MAX_APPENDS_PER_PRODUCER + n
        batch = make_batch(tag, records=rng.randint(1, 8), value_bytes=rng.randint(1, 300))
        if producer % 2:
            result = await log.append_stream(chunks(batch, rng))
        else:
            result = await log.append(batch)
        sys.stdout.write(f"ack {result.base_index} {tag} {result.record_count}\n")
        sys.stdout.flush()


async def main(path: str, seed: int) -> None:
    log = await CommitLog.open(path, CONFIG)
    sys.stdout.write(f"open {log.next_index}\n")
    sys.stdout.flush()
    await asyncio.gather(*(produce(log, p, seed, []) for p in range(6)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
