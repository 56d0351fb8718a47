"""Commit notices on demand (`laminar.raft.raft`): a follower's answers say whether it wants
each commit told at once; the leader sends its commit-only append to those that do, and the
others learn the commit with their next entries or heartbeat."""

from __future__ import annotations

import pytest

from laminar.raft import MessageType
from laminar.raft.raft import NO_COMMIT_NOTICES

from .test_paper import (
    by_dst,
    entries_with_terms,
    make_leader,
    msg,
    new_raft,
    new_storage,
    of_type,
    persist,
    persist_ready,
)

MT = MessageType


def test_a_follower_says_in_each_answer_whether_it_wants_commit_notices() -> None:
    raft = new_raft("b", storage=new_storage(term=1))
    entries = tuple(entries_with_terms((1, 1)))
    raft.step(msg(MT.APPEND, "a", "b", 1, index=-1, log_term=0, entries=entries[:1], commit=0))
    (answer,) = of_type(persist(raft), MT.APPEND_RESP)
    assert answer.commit == 0  # it wants them (the default): its commit index
    raft.commit_wanted = lambda: False
    raft.step(msg(MT.APPEND, "a", "b", 1, index=0, log_term=1, entries=entries[1:], commit=0))
    raft.step(msg(MT.HEARTBEAT, "a", "b", 1, commit=1))
    answers = persist(raft)
    assert [m.commit for m in answers] == [NO_COMMIT_NOTICES, NO_COMMIT_NOTICES]


@pytest.mark.parametrize("wanted", [True, False])
def test_the_leader_tells_a_commit_at_once_only_to_a_follower_that_wants_it(wanted: bool) -> None:
    raft = new_raft()
    make_leader(raft)
    index = raft.propose(b"some data", 1)
    persist(raft)
    commit = index - 1 if wanted else NO_COMMIT_NOTICES
    raft.step(msg(MT.APPEND_RESP, "c", "a", 1, index=index, commit=commit))  # it commits
    assert raft.log.committed == index
    appends = by_dst(of_type(persist_ready(raft).messages, MT.APPEND))
    assert "b" in appends  # b never said: it is told, and it lacks the entry anyway
    if wanted:
        assert (appends["c"].entries, appends["c"].commit) == ((), index)
    else:
        assert "c" not in appends
        for _ in range(raft.config.heartbeat_ticks):
            raft.tick()
        (beat,) = [m for m in of_type(persist(raft), MT.HEARTBEAT) if m.dst == "c"]
        assert beat.commit == index  # the next heartbeat tells it


def test_a_follower_that_starts_wanting_notices_asks_and_is_told() -> None:
    follower = new_raft("c", storage=new_storage(term=1))
    follower.commit_wanted = lambda: False
    follower.step(msg(MT.HEARTBEAT, "a", "c", 1))
    persist(follower)
    follower.commit_wanted = lambda: True
    assert follower.ask_for_commits()
    (ask,) = persist(follower)
    assert (ask.type, ask.dst, ask.commit) == (MT.HEARTBEAT_RESP, "a", follower.log.committed)
    assert not follower.ask_for_commits()  # said once

    leader = new_raft()
    make_leader(leader)
    index = leader.propose(b"some data", 1)
    persist(leader)
    leader.step(msg(MT.APPEND_RESP, "c", "a", 1, index=index, commit=NO_COMMIT_NOTICES))
    persist(leader)
    leader.step(msg(MT.HEARTBEAT_RESP, "c", "a", 1, commit=index - 1))  # behind: tell it
    (append,) = [m for m in of_type(persist(leader), MT.APPEND) if m.dst == "c"]
    assert append.commit == index
