"""Log repair (`HardState.repair_floor`): a node whose log lost entries it may have
acknowledged does not campaign, votes as if its log still reached the floor, and fetches what
it lost from its leader, or from any member when it knows none. In the style of
test_paper.py: nodes over MemoryRaftStorage, messages stepped by hand or through Network."""

from __future__ import annotations

import random

from laminar.raft import ConfState, HardState, MemoryRaftStorage, Raft, Role

from .test_paper import (
    ABC,
    CFG,
    ET,
    GROUP,
    MT,
    PRE_VOTE,
    Network,
    entries_with_terms,
    log_entries,
    memory_storage,
    msg,
    new_storage,
    of_type,
    persist,
)


def damaged_storage(
    raft: Raft, cut: int, voters: tuple[str, ...] = ABC
) -> tuple[MemoryRaftStorage, tuple[int, int]]:
    """`raft`'s storage as it comes back from a restart that cut its log at `cut` (damage
    found on disk): the entries before the cut, the commit clamped below it, and the floor
    where its log ended before."""
    old = memory_storage(raft)
    floor = (raft.log.last_index(), raft.log.last_term())
    storage = MemoryRaftStorage(ConfState(voters))
    storage.append([e for e in old.log if e.last_index < cut])
    hard = old.hard_state
    commit = min(hard.commit, cut - 1)
    storage.set_hard_state(HardState(hard.term, hard.vote, commit, hard.conf, floor))
    return storage, floor


def repairing(voters: tuple[str, ...] = ABC, **kwargs: object) -> Raft:
    """Node "b" whose log holds entries of terms 1, 1 and whose floor is (3, 1)."""
    storage = new_storage(voters, terms=(1, 1), term=1, commit=1)
    hard = storage.hard_state
    storage.set_hard_state(HardState(hard.term, hard.vote, hard.commit, hard.conf, (3, 1)))
    return Raft(GROUP, "b", storage, kwargs.get("config", CFG), random.Random(3))  # type: ignore[arg-type]


def test_a_repairing_node_never_campaigns_nor_takes_a_transfer() -> None:
    raft = repairing()
    for _ in range(ET * 5):
        raft.tick()
    raft.step(msg(MT.TIMEOUT_NOW, "a", "b", 1))
    sent = persist(raft)
    assert raft.role is Role.FOLLOWER and raft.term == 1
    assert not of_type(sent, MT.VOTE) and not of_type(sent, MT.PRE_VOTE)


def test_a_repairing_node_votes_as_if_its_log_still_reached_the_floor() -> None:
    for kind, reply, config in (
        (MT.VOTE, MT.VOTE_RESP, CFG),
        (MT.PRE_VOTE, MT.PRE_VOTE_RESP, PRE_VOTE),
    ):
        for (index, term), granted in (((2, 1), False), ((3, 1), True), ((0, 2), True)):
            raft = repairing(config=config)
            raft.step(msg(kind, "c", "b", 2, index=index, log_term=term))
            (answer,) = of_type(persist(raft), reply)
            assert answer.reject is not granted, (kind, index, term)


def test_a_lone_voter_leads_even_while_repairing() -> None:
    """Nobody else holds what it lost: it cannot wait for anyone."""
    raft = repairing(voters=("b",))
    for _ in range(ET * 2):
        raft.tick()
    assert raft.role is Role.LEADER


def test_the_leader_sends_again_what_a_restarted_follower_lost() -> None:
    """The leader counted b's entries as replicated (match 4); b comes back without 3..4.
    Its REPAIR makes the leader send them again (a rejected append at an index the leader
    believes b holds is ignored as stale, so without it b would never catch up)."""
    net = Network.build()
    net.elect("a")
    net.propose("a", 4)
    leader = net["a"]
    assert leader.progress["b"].match == leader.log.last_index() == 4
    storage, floor = damaged_storage(net["b"], cut=3)
    net.nodes["b"] = Raft(GROUP, "b", storage, CFG, random.Random(9))
    assert net["b"].repair_floor == floor and net["b"].log.last_index() == 2
    net.heartbeat("a")  # b learns its leader
    net.tick(ET, nodes=["b"])
    assert of_type(net.delivered, MT.REPAIR)
    b = net["b"]
    assert b.repair_floor is None
    assert log_entries(b) == log_entries(leader)
    assert memory_storage(b).hard_state.repair_floor is None  # persisted


def test_a_repairing_node_fetches_from_any_member_when_it_knows_no_leader() -> None:
    """The leader is gone; b, which lost entries, asks every member and c sends them: b may
    then campaign again (c could not be elected without it, nor b without them)."""
    net = Network.build()
    net.elect("a")
    net.propose("a", 4)
    net.isolate("a")
    storage, _ = damaged_storage(net["b"], cut=2)
    net.nodes["b"] = Raft(GROUP, "b", storage, CFG, random.Random(9))
    assert net["b"].lead is None
    net.tick(ET // 2, nodes=["b"])
    answers = of_type(net.delivered, MT.REPAIR_RESP)
    assert [m.src for m in answers] == ["c"]
    b = net["b"]
    assert b.repair_floor is None and b.role is Role.FOLLOWER
    assert log_entries(b) == log_entries(net["c"])
    assert b.log.committed == net["c"].log.committed  # as far as c knows them committed


def test_a_member_sends_nothing_where_its_log_differs() -> None:
    c = Raft(GROUP, "c", new_storage(ABC, terms=(1, 2, 2), term=2), CFG, random.Random(1))
    c.step(msg(MT.REPAIR, "b", "c", 2, index=1, log_term=1))  # c holds term 2 there
    assert not of_type(persist(c), MT.REPAIR_RESP)
    c.step(msg(MT.REPAIR, "b", "c", 2, index=0, log_term=1))
    (answer,) = of_type(persist(c), MT.REPAIR_RESP)
    assert [e.term for e in answer.entries] == [2, 2]


def test_entries_from_a_member_never_replace_committed_ones() -> None:
    raft = repairing()
    raft.step(
        msg(
            MT.REPAIR_RESP,
            "c",
            "b",
            1,
            index=0,
            log_term=1,
            entries=tuple(entries_with_terms((2,), 1)),
        )
    )
    assert [e.term for e in log_entries(raft)] == [1, 1]
