"""A broker whose stored metadata log holds a damaged committed batch (a bit flipped while it
was down) opens, replays up to the damage, cuts its log there and fetches the rest from the
metadata leader, on whole node cores (`NodeCore`) over in-memory storage. Opening used to
replay straight into the damage and fail (a simulation seed found this)."""

from __future__ import annotations

import logging

import pytest

from laminar.log.batch import BATCH_HEADER_BYTES
from laminar.metadata import METADATA_GROUP

from .test_leader_balance import TOPIC, Cluster


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="laminar")  # (put back after the test)


def test_a_damaged_committed_metadata_batch_is_cut_on_opening_and_fetched_again() -> None:
    cluster = Cluster()
    cluster.create_topic(3)
    cluster.run_until(lambda: cluster.all_led(3), 200)
    leader = cluster.metadata_leader()
    assert leader is not None
    follower = next(n for n, c in sorted(cluster.cores.items()) if c is not leader)
    core = cluster.cores[follower]
    assert core.meta is not None
    log = core.meta.storage.log
    created = core.state.topics[TOPIC].created_index  # (committed)
    assert log.start_index <= created < log.next_index
    name, start, end = log.batch_location(created)
    assert end - start > BATCH_HEADER_BYTES
    cluster.stop(follower)
    stored = cluster.disks[follower][METADATA_GROUP].files[name]
    for data in (stored.data, stored.durable):
        data[end - 1] ^= 0x10  # (in the payload: only the checksum tells)
    cluster.start(follower)
    core = cluster.cores[follower]
    cluster.run_until(
        lambda: (
            core.meta is not None
            and core.meta.raft.log.committed == leader.meta.raft.log.committed  # type: ignore[union-attr]
            and TOPIC in core.state.topics
        ),
        200,
    )
    assert core.counters["corrupt_batches"] >= 1
    assert core.state.topics == leader.state.topics
