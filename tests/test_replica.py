"""A partition replica on real files: commit waiters, and the idempotent-producer table
rebuilt from the log's batch headers by a new leader (after a restart)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from laminar.log.batch import Record, encode_batch, parse_header
from laminar.log.config import LogConfig
from laminar.partition.replica import Replica, SequenceConflict
from laminar.raft.config import RaftConfig
from laminar.raft.messages import ConfState


def open_replica(path: Path) -> Replica:
    return Replica(
        "t", 0, "n1", path, LogConfig(segment_bytes=4096), RaftConfig(), ConfState(("n1",))
    )


def drive(replica: Replica) -> None:
    """What the broker's driver does, for a single-voter group."""
    while replica.raft.has_ready():
        ready = replica.raft.ready()
        if ready.entries:
            replica.storage.append(ready.entries)
            replica.storage.sync()
        if ready.hard_state is not None:
            replica.storage.set_hard_state(ready.hard_state)
        if ready.committed is not None:
            replica.on_committed(*ready.committed)
        replica.raft.advance(ready)
        replica.on_leadership()


def lead(replica: Replica) -> None:
    replica.raft.campaign()
    drive(replica)
    assert replica.is_leader


def batch(producer_id: int, sequence: int, size: int = 600) -> bytes:
    return encode_batch(
        [Record(value=b"v" * size), Record(value=b"w" * size)],
        producer_id=producer_id,
        producer_seq=sequence,
    )


async def test_duplicates_are_answered_with_the_original_index_across_a_restart(
    tmp_path: Path,
) -> None:
    replica = open_replica(tmp_path / "p")
    lead(replica)
    bases = {}
    for sequence in range(0, 40, 2):  # spans several 4 KiB segments
        data = batch(7, sequence)
        future, duplicate = replica.propose(data, parse_header(data))
        drive(replica)
        bases[sequence] = await asyncio.wait_for(future, 1)
        assert not duplicate
    assert len(replica.log.segment_base_indexes) > 2
    replica.close()

    reopened = open_replica(tmp_path / "p")
    lead(reopened)  # a new term: the table comes from the log's headers
    data = batch(7, 38)
    future, duplicate = reopened.propose(data, parse_header(data))
    assert duplicate and await asyncio.wait_for(future, 1) == bases[38]
    end = reopened.log_end
    with pytest.raises(SequenceConflict):
        reopened.propose(batch(7, 31), parse_header(batch(7, 31)))
    data = batch(7, 40)
    future, duplicate = reopened.propose(data, parse_header(data))
    drive(reopened)
    assert not duplicate and await asyncio.wait_for(future, 1) == end
    assert reopened.log_end > end
    reopened.close()
