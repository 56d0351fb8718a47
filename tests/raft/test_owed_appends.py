"""Owed appends (`laminar.raft.raft`): what a leader's steps, ticks and proposals ask to send a
follower between two `ready()` calls goes out at the next one, as one append per follower (or
as few as `max_append_bytes` and the window allow), not one per proposal or per answer."""

from __future__ import annotations

import pytest

from laminar.raft import MessageType, RaftConfig, Role
from laminar.raft.storage import StorageUnavailable

from .test_paper import CFG, by_dst, make_leader, msg, new_raft, of_type, persist

MT = MessageType


def test_proposals_between_two_readies_go_to_each_follower_as_one_append() -> None:
    raft = new_raft()
    make_leader(raft)
    first = raft.propose(b"one", 1)
    raft.propose(b"two", 1)
    last = raft.propose(b"three", 1)
    appends = by_dst(of_type(persist(raft), MT.APPEND))  # (fails on a second one to a node)
    for node in ("b", "c"):
        assert [e.index for e in appends[node].entries] == [first, first + 1, last]
        assert list(raft.progress[node].inflight) == [last]  # one window slot, not three


def test_answers_that_commit_one_after_another_send_one_commit_append() -> None:
    raft = new_raft()
    make_leader(raft)
    first = raft.propose(b"one", 1)
    persist(raft)
    second = raft.propose(b"two", 1)
    persist(raft)
    # b answers both appends at once: each answer commits one more entry
    raft.step(msg(MT.APPEND_RESP, "b", "a", raft.term, index=first))
    raft.step(msg(MT.APPEND_RESP, "b", "a", raft.term, index=second))
    assert raft.log.committed == second
    appends = by_dst(of_type(persist(raft), MT.APPEND))
    assert {node: (m.entries, m.commit) for node, m in appends.items()} == {
        "b": ((), second),
        "c": ((), second),
    }


def test_what_one_append_cannot_hold_goes_in_several_up_to_the_window() -> None:
    config = RaftConfig(
        election_ticks=CFG.election_ticks,
        heartbeat_ticks=CFG.heartbeat_ticks,
        pre_vote=False,
        check_quorum=False,
        max_inflight_appends=3,
        max_append_bytes=1,  # one entry per append
    )
    raft = new_raft(config=config)
    make_leader(raft)
    proposed = [raft.propose(b"entry %d" % i, 1) for i in range(5)]
    to_b = [m for m in persist(raft) if m.type is MT.APPEND and m.dst == "b"]
    assert [[e.index for e in m.entries] for m in to_b] == [[i] for i in proposed[:3]]
    # b answers the first two: two window slots free, and the rest goes
    raft.step(msg(MT.APPEND_RESP, "b", "a", raft.term, index=proposed[1]))
    to_b = [m for m in persist(raft) if m.type is MT.APPEND and m.dst == "b"]
    assert [[e.index for e in m.entries] for m in to_b if m.entries] == [[i] for i in proposed[3:]]


def test_a_leader_that_steps_down_before_its_ready_sends_nothing_it_owed() -> None:
    raft = new_raft()
    make_leader(raft)
    raft.propose(b"data", 1)
    raft.step(msg(MT.APPEND, "b", "a", raft.term + 1, index=-1, log_term=0))  # b leads now
    assert raft.role is Role.FOLLOWER
    assert of_type(persist(raft), MT.APPEND) == []


def test_an_append_that_cannot_be_built_does_not_hold_up_the_ready(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Entries that cannot be read (damage on disk: the node repairs the log) are not sent,
    and the sender moves on rather than trying again and again."""
    raft = new_raft()
    make_leader(raft)
    raft.propose(b"data", 1)
    reads = []

    def damaged(first: int, max_bytes: int) -> object:
        reads.append(first)
        assert len(reads) < 10, "the sender keeps retrying an append it cannot build"
        raise StorageUnavailable("damaged")

    monkeypatch.setattr(raft.log, "entries", damaged)
    assert of_type(persist(raft), MT.APPEND) == []
    assert reads  # (it did try)
