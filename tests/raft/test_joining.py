"""A member created by a leader's message (`HardState.joining`): it neither campaigns nor
votes until its log holds an entry a leader wrote, then it is an ordinary member. Regression
(the kind e2e, a scale from 3 to 5 brokers): replicas removed from a partition's group and
dropped were created again by later messages with the group's initial voters and empty logs,
voted a removed member (or each other) into leadership beside the real leader, and the
partition lost its acknowledged records."""

from __future__ import annotations

import random

from laminar.log import MemoryDirectory, SegmentedLog
from laminar.raft import ConfState, HardState, MemoryRaftStorage, Raft, RaftConfig, Role
from laminar.raft.log_storage import LogStorage

from .test_log_storage import CONFIG
from .test_paper import (
    ABC,
    CFG,
    ET,
    GROUP,
    MT,
    PRE_VOTE,
    entries_with_terms,
    msg,
    of_type,
    persist,
)


def joining(config: object = CFG) -> Raft:
    """Node "b", just created by a message: the initial voters, an empty log, joining."""
    storage = MemoryRaftStorage(ConfState(ABC))
    storage.set_hard_state(HardState(conf=ConfState(ABC), joining=True))
    return Raft(GROUP, "b", storage, config, random.Random(3))  # type: ignore[arg-type]


def test_a_joining_member_never_campaigns_nor_takes_a_transfer() -> None:
    raft = joining()
    for _ in range(ET * 5):
        raft.tick()
    raft.step(msg(MT.TIMEOUT_NOW, "a", "b", 1))
    sent = persist(raft)
    assert raft.role is Role.FOLLOWER and raft.term <= 1
    assert not of_type(sent, MT.VOTE) and not of_type(sent, MT.PRE_VOTE)


def test_a_joining_member_grants_no_vote_whatever_the_candidate_holds() -> None:
    for kind, reply, config in ((MT.VOTE, MT.VOTE_RESP, CFG), (MT.PRE_VOTE, MT.PRE_VOTE_RESP,
                                                                PRE_VOTE)):  # fmt: skip
        for index, term in ((-1, 0), (5, 3)):  # another empty member; a removed one's log
            raft = joining(config)
            raft.step(msg(kind, "c", "b", 4, index=index, log_term=term))
            (answer,) = of_type(persist(raft), reply)
            assert answer.reject, (kind, index, term)
            assert raft.vote is None


def test_a_leaders_entries_make_it_an_ordinary_member() -> None:
    raft = joining()
    raft.step(msg(MT.APPEND, "a", "b", 1, index=-1, log_term=0,
                  entries=tuple(entries_with_terms([1])), commit=0))  # fmt: skip
    persist(raft)
    assert not raft.joining and raft.hard_state().joining is False
    raft.step(msg(MT.VOTE, "c", "b", 2, index=0, log_term=1))
    (answer,) = of_type(persist(raft), MT.VOTE_RESP)
    assert not answer.reject


def test_joining_is_durable_from_creation() -> None:
    """A joining member that crashes before any entry reached it comes back joining (else,
    with its initial voters saved, it could vote after a restart)."""
    directory = MemoryDirectory()
    LogStorage(directory, SegmentedLog.open(directory, CONFIG), conf=ConfState(ABC), joining=True)
    directory.crash()
    reopened = LogStorage(directory, SegmentedLog.open(directory, CONFIG), conf=ConfState(()))
    assert reopened.initial_state()[0] == HardState(conf=ConfState(ABC), joining=True)


def test_a_learner_stops_ignoring_votes_once_its_leader_is_silent() -> None:
    """Vote stickiness (check-quorum) ignores a candidate while a leader is heard from. A
    member that may not campaign (a learner: it believes itself outside the voters, perhaps
    because the change that made it a voter has not reached it) must still let that lease run
    out, or a group whose leader died for good could never elect another."""
    config = RaftConfig(election_ticks=ET, heartbeat_ticks=1, pre_vote=True, check_quorum=True)
    storage = MemoryRaftStorage(ConfState(("a", "c"), ("b",)))
    raft = Raft(GROUP, "b", storage, config, random.Random(3))
    raft.step(msg(MT.HEARTBEAT, "a", "b", 1, commit=-1))
    persist(raft)
    assert raft.lead == "a"
    raft.step(msg(MT.PRE_VOTE, "c", "b", 2, index=-1, log_term=0))
    assert not of_type(persist(raft), MT.PRE_VOTE_RESP)  # within the lease: ignored
    for _ in range(ET):  # the leader is gone: nothing more from it
        raft.tick()
    for tick in range(ET * 3):  # from then on, every time
        raft.tick()
        persist(raft)
        raft.step(msg(MT.PRE_VOTE, "c", "b", 2, index=-1, log_term=0))
        answers = of_type(persist(raft), MT.PRE_VOTE_RESP)
        assert len(answers) == 1 and not answers[0].reject, tick
