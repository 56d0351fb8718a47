"""Quiet commit appends (`laminar.raft.raft`): a leader's empty append to a follower known to
hold its whole log asks for no answer, and such a follower gives none; any other append is
answered as before."""

from __future__ import annotations

from laminar.raft import MessageType, Role
from laminar.raft.codec import decode, encode

from .test_paper import (
    Network,
    by_dst,
    entry,
    make_leader,
    msg,
    new_raft,
    new_storage,
    of_type,
    persist,
    persist_ready,
)

MT = MessageType


def test_the_commit_reaches_a_matched_follower_quietly_and_a_lagging_one_loudly() -> None:
    raft = new_raft()
    make_leader(raft)
    index = raft.propose(b"some data", 1)
    persist(raft)
    window_of_c = list(raft.progress["c"].inflight)
    raft.step(msg(MT.APPEND_RESP, "b", "a", 1, index=index))  # b holds it: it commits
    ready = persist_ready(raft)
    assert raft.log.committed == index
    appends = by_dst(of_type(ready.messages, MT.APPEND))
    to_b, to_c = appends["b"], appends["c"]
    # b has the whole log: the empty append only carries the commit, and asks for no answer
    assert (to_b.entries, to_b.commit, to_b.index, to_b.reject) == ((), index, index, True)
    assert list(raft.progress["b"].inflight) == []  # no window slot waits for an answer
    # c has not answered the entry yet: its empty append is an ordinary one, answered
    assert (to_c.entries, to_c.commit, to_c.reject) == ((), index, False)
    assert list(raft.progress["c"].inflight) == [*window_of_c, index]


def test_a_matching_follower_takes_the_commit_and_stays_silent() -> None:
    raft = new_raft(storage=new_storage(terms=(1, 1), term=1))
    raft.step(msg(MT.APPEND, "b", "a", 1, index=1, log_term=1, commit=1, reject=True))
    assert raft.log.committed == 1
    ready = persist_ready(raft)
    assert ready.committed == (0, 1)
    assert ready.messages == []


def test_a_follower_that_does_not_match_answers_a_quiet_append_with_its_rejection() -> None:
    raft = new_raft(storage=new_storage(terms=(1,), term=1))  # lacks index 1
    raft.step(msg(MT.APPEND, "b", "a", 1, index=1, log_term=1, commit=1, reject=True))
    (reply,) = persist(raft)
    assert (reply.type, reply.dst, reply.reject, reply.index) == (MT.APPEND_RESP, "b", True, 1)
    assert raft.log.committed == -1


def test_an_ordinary_empty_append_is_still_answered() -> None:
    """What a leader from before the flag sends: answered as it always was."""
    raft = new_raft(storage=new_storage(terms=(1, 1), term=1))
    raft.step(msg(MT.APPEND, "b", "a", 1, index=1, log_term=1, commit=1))
    (reply,) = persist(raft)
    assert (reply.type, reply.reject, reply.index) == (MT.APPEND_RESP, False, 1)


def test_an_append_with_entries_is_answered_even_if_flagged() -> None:
    raft = new_raft(storage=new_storage(terms=(1,), term=1))
    entries = (entry(1, 1),)
    raft.step(msg(MT.APPEND, "b", "a", 1, index=0, log_term=1, entries=entries, reject=True))
    (reply,) = persist(raft)
    assert (reply.type, reply.reject, reply.index) == (MT.APPEND_RESP, False, 1)


def test_the_flag_survives_the_wire() -> None:
    quiet = msg(MT.APPEND, "a", "b", 3, index=7, log_term=2, commit=7, reject=True)
    assert decode(encode(quiet)) == quiet


def test_two_voters_keep_committing_and_agree_on_the_commit() -> None:
    """With two voters every commit needs the follower's answer: quiet commit appends must
    never hold back the next entry's answer, and the follower learns every commit."""
    net = Network.build(("a", "b"))
    net.elect("a")
    leader, follower = net.nodes["a"], net.nodes["b"]
    for n in range(20):
        index = leader.propose(f"entry {n}".encode(), 1)
        net.run()
        assert leader.log.committed == index
        assert follower.log.committed == index
    quiet = [m for m in net.delivered if m.type is MT.APPEND and m.reject]
    answers = [m for m in net.delivered if m.type is MT.APPEND_RESP]
    assert quiet, "no commit went out quietly"
    assert len(answers) == len([m for m in net.delivered if m.type is MT.APPEND]) - len(quiet)
    assert leader.role is Role.LEADER
