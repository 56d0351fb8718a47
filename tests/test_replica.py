"""A partition replica on real files: commit waiters, and the idempotent-producer table
rebuilt from the log's batch headers by a new leader (after a restart)."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path
from typing import Any

import pytest

from laminar.log.batch import Record, encode_batch, parse_header
from laminar.partition.errors import ReplicaClosed
from laminar.partition.groups import now_ms
from laminar.partition.replica import Replica, SequenceConflict
from laminar.queue import Accept, Release, Renew
from laminar.raft.messages import Message, MessageType
from tests import replicas
from tests.replicas import ack, depose, drive, elect, until


def open_replica(path: Path) -> Replica:
    return replicas.open_replica(path, ("n1",))


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


def loop_errors() -> list[dict[str, Any]]:
    """What the running loop's exception handler is given from now on: asyncio reports a
    collected future whose exception nobody retrieved there ("Future exception was never
    retrieved", logged by the default handler)."""
    seen: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: seen.append(context))
    return seen


async def test_waits_that_gave_up_leave_no_unretrieved_failure(tmp_path: Path) -> None:
    errors = loop_errors()
    replica = replicas.open_replica(tmp_path / "p")
    elect(replica)
    assert replica.groups is not None
    data = batch(0, 0)
    append, _ = replica.propose(data, parse_header(data))
    command = replica.groups.propose(Accept("g", "c", (0,)))
    drive(replica)
    for future in (append, command):  # as the API waits: its request timeout passed
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.shield(future), 0)
    del append, command, future
    depose(replica)  # leadership lost: the command fails, the append waits for its index
    assert len(replica.pending) == 1
    replica.close()  # and fails: nobody waits for either any more
    assert not replica.pending
    gc.collect()
    assert [context["message"] for context in errors] == []


async def test_a_retry_reaching_a_new_leader_before_its_first_round_is_a_duplicate(
    tmp_path: Path,
) -> None:
    """n1 appended (producer 9, sequence 0) and lost the leadership before the commit; it
    leads again, and the client's retry arrives before the driver's round ends (on_leadership
    not called yet): the retry must still be recognised as the entry already in the log."""
    replica = replicas.open_replica(tmp_path / "p")
    elect(replica)
    data = batch(9, 0)
    first, duplicate = replica.propose(data, parse_header(data))
    assert not duplicate
    drive(replica)
    depose(replica)
    raft = replica.raft
    raft.campaign()  # leads again: only the core knows yet
    raft.step(Message(MessageType.PRE_VOTE_RESP, raft.group, "n2", raft.id, raft.term + 1))
    raft.step(Message(MessageType.VOTE_RESP, raft.group, "n2", raft.id, raft.term))
    assert replica.is_leader
    retry, duplicate = replica.propose(data, parse_header(data))
    assert duplicate
    drive(replica)
    ack(replica)
    assert await retry == await first
    replica.close()


async def test_a_stopping_broker_refuses_proposals_as_closed(tmp_path: Path) -> None:
    """Once the broker stops, its driver persists nothing: a proposal then would only be
    answered "outcome unknown" at close. It is refused (503: nothing was done)."""
    replica = replicas.open_replica(tmp_path / "p")
    elect(replica)
    replica.refuse_proposals()
    data = batch(1, 0)
    assert replica.groups is not None
    with pytest.raises(ReplicaClosed):
        replica.propose(data, parse_header(data))
    with pytest.raises(ReplicaClosed):
        replica.groups.propose(Accept("g", "c", (0,)))
    assert not replica.pending
    replica.close()


async def test_a_parked_acquire_is_proposed_right_behind_new_records(tmp_path: Path) -> None:
    """A long-polling acquire waits parked; records proposed by an append are handed to it in
    the same call: its Acquire is in the log right behind them before the driver's next round,
    so the round that persists the records persists the Acquire too and both commit in it."""
    replica = open_replica(tmp_path / "p")
    lead(replica)
    groups = replica.groups
    assert groups is not None
    acquiring = asyncio.create_task(groups.acquire("g", "c", 10, 30_000, 5.0, 1 << 20))
    await asyncio.sleep(0)  # the acquire finds nothing and parks
    assert not acquiring.done()
    data = batch(0, 0)
    appended, _ = replica.propose(data, parse_header(data))
    last = replica.raft.log.last_index()
    behind = next(iter(replica.raft.log.entries(last, 1 << 20)))
    assert parse_header(behind.data).is_control  # the Acquire, proposed before any round
    base = last - 2  # the two records, right before it
    drive(replica)  # one round: records and Acquire persisted and committed together
    assert appended.done() and await appended == base
    deliveries = await asyncio.wait_for(acquiring, 1)
    assert [d.granted.index for d in deliveries] == [base, base + 1]
    assert [d.record.value for d in deliveries] == [b"v" * 600, b"w" * 600]
    replica.close()


async def test_acquires_parked_behind_a_handed_off_one_get_the_rest(tmp_path: Path) -> None:
    """Parked acquires are served first come first served; one whose room is full leaves the
    records to the next, and an acquire that ended (its request gone) is skipped."""
    replica = open_replica(tmp_path / "p")
    lead(replica)
    groups = replica.groups
    assert groups is not None
    first = asyncio.create_task(groups.acquire("g", "a", 1, 30_000, 5.0, 1 << 20))
    await asyncio.sleep(0)
    gone = asyncio.create_task(groups.acquire("g", "x", 10, 30_000, 5.0, 1 << 20))
    await asyncio.sleep(0)
    second = asyncio.create_task(groups.acquire("g", "b", 10, 30_000, 5.0, 1 << 20))
    await asyncio.sleep(0)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    data = batch(0, 0)
    appended, _ = replica.propose(data, parse_header(data))
    drive(replica)
    base = await appended
    got_first = await asyncio.wait_for(first, 1)
    assert [d.granted.index for d in got_first] == [base]  # it asked for one
    # the second was handed the other record at once too (both Acquires in that round)
    got_second = await asyncio.wait_for(second, 1)
    assert [d.granted.index for d in got_second] == [base + 1]
    replica.close()


async def test_a_parked_acquire_sleeps_through_commits_that_free_nothing_for_it(
    tmp_path: Path,
) -> None:
    """Every commit used to wake every parked acquire of the partition, each only to pick
    nothing and park again. Now one stays parked (the same wait) through a commit that frees
    nothing it could take, and is woken by the one that does."""
    replica = open_replica(tmp_path / "p")
    lead(replica)
    groups = replica.groups
    assert groups is not None
    data = batch(0, 0)
    appended, _ = replica.propose(data, parse_header(data))
    drive(replica)
    base = await appended
    holding = asyncio.create_task(groups.acquire("g", "b", 10, 30_000, 0.0, 1 << 20))
    await asyncio.sleep(0)  # it proposes its Acquire
    drive(replica)
    held = await asyncio.wait_for(holding, 1)
    assert [d.granted.index for d in held] == [base, base + 1]
    waiting = asyncio.create_task(groups.acquire("g", "a", 10, 30_000, 5.0, 1 << 20))
    await asyncio.sleep(0)  # nothing free: it parks
    [parked] = groups._parked
    renewed = groups.propose(Renew("g", "b", (base, base + 1), 30_000, now_ms()))
    drive(replica)
    assert (await asyncio.wait_for(renewed, 1)).done == [base, base + 1]
    await asyncio.sleep(0)
    assert groups._parked == [parked] and not waiting.done()  # not woken
    released = groups.propose(Release("g", "b", (base + 1,)))
    last = replica.raft.log.last_index()  # the Release
    drive(replica)
    assert not groups._parked  # woken by its commit
    assert (await asyncio.wait_for(released, 1)).done == [base + 1]
    await asyncio.wait_for(until(lambda: replica.raft.log.last_index() > last), 1)  # its Acquire
    drive(replica)
    got = await asyncio.wait_for(waiting, 1)
    assert [(d.granted.index, d.granted.deliveries) for d in got] == [(base + 1, 2)]
    replica.close()
