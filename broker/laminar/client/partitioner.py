"""Which partition a record goes to.

A keyed record goes to `xxh64(key, seed 0) mod partitions`: the same key always lands on the
same partition (as long as the partition count does not change), so the records of one key
keep their order. Every client (this one, the Spark sink, other languages) must use the same
function so that they agree.

Records without a key have no hash. `partition_for(None, n)` spreads them round-robin with a
process-wide counter; the `Producer` does better with a `StickyPartitioner`: it keeps sending
keyless records to one partition until that partition's batch is closed, then moves to the
next, so keyless records make full batches instead of one small batch per partition.
"""

from __future__ import annotations

import itertools
import random

import xxhash

_ROUND_ROBIN = itertools.count()


def key_hash(key: bytes) -> int:
    """The unsigned 64-bit hash that places `key`: XXH64 with seed 0."""
    return int(xxhash.xxh64_intdigest(key))


def partition_for(key: bytes | None, partitions: int) -> int:
    """The partition of `key` among `partitions`: `xxh64(key) % partitions`, stable across
    processes and versions. A None key gets the next partition of a process-wide round-robin."""
    if partitions < 1:
        raise ValueError(f"partitions={partitions} must be at least 1")
    if key is None:
        return next(_ROUND_ROBIN) % partitions
    return key_hash(key) % partitions


class StickyPartitioner:
    """Round-robin for keyless records, sticking to one partition per batch.

    `current(partitions)` is the partition keyless records go to now; `batch_closed(p)` moves
    on to the next partition once the batch of the current one has been closed (it was full,
    or it was handed to the sender).
    """

    def __init__(self, start: int | None = None) -> None:
        self._next = random.randrange(1 << 30) if start is None else start
        self._current: int | None = None

    def current(self, partitions: int) -> int:
        if partitions < 1:
            raise ValueError(f"partitions={partitions} must be at least 1")
        if self._current is None or self._current >= partitions:
            self._current = self._next % partitions
            self._next = self._current + 1
        return self._current

    def batch_closed(self, partition: int) -> None:
        if partition == self._current:
            self._current = None
