"""The partitioner: a key always lands on the same partition, in every process and version, and
keys spread evenly; keyless records go round-robin (sticky per batch in the producer)."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

from laminar.client import StickyPartitioner, key_hash, partition_for

# xxh64 with seed 0: these values are the wire contract every client implementation must share.
PINNED = [
    (b"", 0xEF46DB3751D8E999),
    (b"key", 0x447762562DE14334),
    (b"customer-42", 0xCA6E96E956958C0F),
    ("ключ".encode(), 0xA17D2DD13D89D19C),
]


@pytest.mark.parametrize(("key", "digest"), PINNED)
def test_the_hash_is_xxh64_with_seed_0(key: bytes, digest: int) -> None:
    assert key_hash(key) == digest
    for partitions in (1, 2, 6, 12, 100, 1000):
        assert partition_for(key, partitions) == digest % partitions


def test_the_same_key_gets_the_same_partition_in_another_process() -> None:
    keys = [f"user-{i}".encode() for i in range(200)]
    here = [partition_for(k, 12) for k in keys]
    code = (
        "from laminar.client import partition_for\n"
        "print([partition_for(f'user-{i}'.encode(), 12) for i in range(200)])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == str(here)
    assert here == [partition_for(k, 12) for k in keys]


@pytest.mark.parametrize("partitions", [3, 12, 64])
def test_keys_spread_evenly(partitions: int) -> None:
    n = 60_000
    counts = Counter(partition_for(f"key-{i}".encode(), partitions) for i in range(n))
    assert set(counts) == set(range(partitions))
    mean = n / partitions
    # A uniform hash: each count is within 5 standard deviations (about sqrt(mean)) of the mean.
    assert max(abs(c - mean) for c in counts.values()) < 5 * mean**0.5, counts


def test_a_none_key_goes_round_robin() -> None:
    seen = [partition_for(None, 5) for _ in range(10)]
    first = seen[0]
    assert seen == [(first + i) % 5 for i in range(10)]


def test_partitions_must_be_positive() -> None:
    with pytest.raises(ValueError):
        partition_for(b"k", 0)
    with pytest.raises(ValueError):
        partition_for(None, 0)
    with pytest.raises(ValueError):
        StickyPartitioner().current(0)


def test_the_sticky_partitioner_moves_on_only_when_its_batch_closes() -> None:
    sticky = StickyPartitioner(start=2)
    assert [sticky.current(4) for _ in range(5)] == [2] * 5
    sticky.batch_closed(1)  # another partition's batch: no effect
    assert sticky.current(4) == 2
    sticky.batch_closed(2)
    assert sticky.current(4) == 3
    sticky.batch_closed(3)
    assert sticky.current(4) == 0  # wraps around
    visited = []
    for _ in range(8):
        p = sticky.current(4)
        visited.append(p)
        sticky.batch_closed(p)
    assert Counter(visited) == {0: 2, 1: 2, 2: 2, 3: 2}


def test_the_sticky_partitioner_follows_a_smaller_partition_count() -> None:
    sticky = StickyPartitioner(start=7)
    assert sticky.current(10) == 7
    assert sticky.current(3) in range(3)
