"""Commit notices on demand (`laminar.raft.raft`): a follower's answers say whether it wants
each commit told at once; the leader sends its commit-only append to those that do, and the
others learn the commit with their next entries or heartbeat."""

from __future__ import annotations

from dataclasses import replace

import pytest

from laminar.raft import ConfChangeKind, ConfState, MessageType
from laminar.raft.multi import MultiRaft
from laminar.raft.raft import COMMIT_TOLD, NO_COMMIT_NOTICES, Raft

from .test_paper import (
    by_dst,
    change,
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


def lazy_follower() -> Raft:
    """Follower c of leader a in term 1, whose last answer said it wants no commit notices."""
    follower = new_raft("c", storage=new_storage(term=1))
    follower.commit_wanted = lambda: False
    follower.step(msg(MT.HEARTBEAT, "a", "c", 1))
    (answer,) = persist(follower)
    assert answer.commit == NO_COMMIT_NOTICES
    return follower


def test_a_follower_told_lazily_asks_for_the_commit_index_and_waits_for_the_answer() -> None:
    follower = lazy_follower()
    heard: list[int] = []
    follower.on_commit_heard = lambda: heard.append(follower.commit_told)
    assert follower.ask_for_commits()
    (ask,) = persist(follower)
    assert (ask.type, ask.dst, ask.commit) == (MT.HEARTBEAT_RESP, "a", follower.log.committed)
    assert ask.index > 0 and follower.commit_asked
    assert not follower.ask_for_commits()  # asked once: it now wants them told at once
    follower.step(msg(MT.HEARTBEAT, "a", "c", 1, commit=0))
    assert follower.commit_asked and not heard  # a leader's message is not the answer
    told = msg(MT.READ_INDEX_RESP, "a", "c", 1, index=7, context=COMMIT_TOLD)
    follower.step(replace(told, reject_hint=ask.index - 1))  # a late answer to an older ask
    assert follower.commit_asked and not heard
    follower.step(replace(told, reject_hint=ask.index))
    assert not follower.commit_asked and heard == [7] and follower.commit_told == 7
    assert follower.read_states == []  # (not a read index)


def test_the_leader_answers_an_ask_at_once_with_its_commit_index() -> None:
    leader = new_raft()
    make_leader(leader)
    index = leader.propose(b"some data", 1)
    persist(leader)
    leader.step(msg(MT.APPEND_RESP, "c", "a", 1, index=index, commit=NO_COMMIT_NOTICES))
    leader.step(msg(MT.APPEND_RESP, "b", "a", 1, index=index, commit=NO_COMMIT_NOTICES))
    persist(leader)  # committed; neither follower was told
    leader.step(msg(MT.HEARTBEAT_RESP, "c", "a", 1, commit=index, index=41))  # up to date
    (told,) = persist(leader)
    assert (told.type, told.dst, told.context) == (MT.READ_INDEX_RESP, "c", COMMIT_TOLD)
    assert (told.index, told.reject_hint) == (index, 41)
    leader.step(msg(MT.HEARTBEAT_RESP, "b", "a", 1, commit=index - 1, index=9))  # behind
    told, append = persist(leader)  # the index, then an append that carries it
    assert (told.type, told.dst, told.index, told.reject_hint) == (
        MT.READ_INDEX_RESP,
        "b",
        index,
        9,
    )
    assert (append.type, append.dst, append.commit) == (MT.APPEND, "b", index)
    leader.step(msg(MT.HEARTBEAT_RESP, "b", "a", 1, commit=index))  # not an ask
    assert of_type(persist(leader), MT.READ_INDEX_RESP) == []


def test_no_ask_where_commits_are_told_at_once_or_none_are_coming() -> None:
    follower = lazy_follower()
    MultiRaft("c", quiesce=True).add(follower)
    follower.become_follower(2, "a")
    assert not follower.ask_for_commits()  # a new term's leader has not heard it: it tells
    follower.step(msg(MT.HEARTBEAT, "a", "c", 2))
    persist(follower)  # now it has: no notices
    follower.step(msg(MT.HEARTBEAT, "a", "c", 2, reject=True, index=-1, log_term=0))
    assert follower.quiesced and persist(follower) == []
    assert not follower.ask_for_commits()  # quiesced: its leader had nothing more to commit
    follower.wake()
    persist(follower)  # (the wake's ping said it wants none)
    assert follower.ask_for_commits()


def test_a_reader_that_asked_goes_on_when_the_term_ends() -> None:
    follower = lazy_follower()
    heard: list[bool] = []
    follower.on_commit_heard = lambda: heard.append(follower.commit_asked)
    assert follower.ask_for_commits()
    follower.step(msg(MT.VOTE, "b", "c", 2, index=5, log_term=1))
    assert heard == [False] and not follower.commit_asked


def test_a_configuration_change_s_commit_is_told_to_every_member_at_once() -> None:
    """Which members campaign, and whose votes count, follows from what each knows committed:
    a commit that takes a configuration change is told at once to followers that want no
    notices too (a leader that removes itself tells it with a last heartbeat: test_paper).
    Without both, node simulation seed 56 with workers and transactions ended with a group
    no one could lead."""
    raft = new_raft()
    make_leader(raft)
    index = raft.propose_conf_change(change(ConfChangeKind.ADD_LEARNER, "d"))
    persist(raft)
    raft.step(msg(MT.APPEND_RESP, "b", "a", 1, index=index, commit=NO_COMMIT_NOTICES))
    raft.step(msg(MT.APPEND_RESP, "c", "a", 1, index=index, commit=NO_COMMIT_NOTICES))
    assert (raft.log.committed, raft.conf) == (index, ConfState(("a", "b", "c"), ("d",)))
    appends = by_dst(of_type(persist(raft), MT.APPEND))
    assert {node: appends[node].commit for node in ("b", "c")} == {"b": index, "c": index}
