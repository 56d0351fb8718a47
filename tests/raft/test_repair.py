"""Log repair (`HardState.repair_floor`): a node whose log lost entries it may have
acknowledged does not campaign, votes as if its log still reached the floor, and fetches what
it lost from its leader, or from any member when it knows none; stuck with no leader, it asks
the voters where their logs end and lowers its floor once enough are short of it. In the style
of test_paper.py: nodes over MemoryRaftStorage, messages stepped by hand or through Network."""

from __future__ import annotations

import random

from laminar.raft import ConfState, HardState, MemoryRaftStorage, Raft, Role
from laminar.raft.messages import ConfChange, ConfChangeKind, Message
from laminar.raft.raft import REPAIR_PROBE

from .test_paper import (
    ABC,
    CFG,
    CHECK_QUORUM,
    ET,
    GROUP,
    MT,
    PRE_VOTE,
    Network,
    entries_with_terms,
    log_entries,
    make_leader,
    memory_storage,
    msg,
    new_raft,
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


def answer(src: str, term: int, position: tuple[int, int], **fields: object) -> Message:
    """`src`'s answer to b's probe: its log ends at `position`, it has committed voters a, b
    and c (unless `context` says otherwise)."""
    fields.setdefault("context", REPAIR_PROBE + b"=a,b,c")
    index, log_term = position
    return msg(MT.REPAIR_RESP, src, "b", term, index=index, log_term=log_term, **fields)


def test_a_repair_stuck_with_no_leader_probes_every_voter_in_the_next_term() -> None:
    raft = repairing()
    for _ in range(2 * ET - 1):
        raft.tick()
    assert not [m for m in of_type(persist(raft), MT.REPAIR) if m.context == REPAIR_PROBE]
    for _ in range(ET):
        raft.tick()
    probes = [m for m in of_type(persist(raft), MT.REPAIR) if m.context == REPAIR_PROBE]
    assert sorted({m.dst for m in probes}) == ["a", "c"]
    assert {(m.term, m.index, m.log_term) for m in probes} == {(2, 1, 1)}
    assert raft.term == 1  # the answers bring ours along: a probe nobody takes changes nothing


def test_the_floor_comes_down_once_more_than_n_minus_q_voters_are_short_of_it() -> None:
    """Three voters: a quorum holds, besides b, at least one other; with both others short
    of the floor, nothing past the furthest of them was committed."""
    raft = repairing()
    raft.probe_term = 2
    raft.step(answer("a", 2, (1, 1)))
    assert raft.repair_floor == (3, 1) and raft.term == 2  # one answer of two needed
    raft.step(answer("c", 2, (0, 1)))
    assert raft.repair_floor is None  # down to (1, 1), where b's log ends
    persist(raft)
    assert memory_storage(raft).hard_state.repair_floor is None  # persisted


def test_a_floor_lowered_past_the_log_waits_for_the_entries_up_to_it() -> None:
    raft = repairing()
    raft.probe_term = 2
    raft.step(answer("a", 2, (2, 1)))
    raft.step(answer("c", 2, (5, 0)))  # (5, 0) is behind (2, 1)
    assert raft.repair_floor == (2, 1)  # b's log ends at (1, 1): it fetches (2, 1) from a


def test_answers_that_cannot_vouch_for_their_log_do_not_count() -> None:
    cases: list[tuple[str, int, dict[str, object]]] = [
        ("repairing", 2, {"reject": True}),
        ("an older probe", 1, {}),
    ]
    for case, term, fields in cases:
        raft = repairing()
        raft.probe_term = 2
        raft.step(answer("a", 2, (2, 1)))
        raft.step(answer("c", term, (2, 1), **fields))
        assert raft.repair_floor == (3, 1), case
    raft = repairing()
    raft.probe_term = 2
    raft.step(answer("a", 2, (2, 1)))
    raft.step(answer("c", 2, (3, 1)))  # c may lead, and repair b as Raft does
    assert raft.repair_floor == (3, 1)


def test_every_configuration_an_answer_reports_needs_enough_answers() -> None:
    """c's log holds two changes uncommitted, to voters a..d then a..e: either may be
    committed unknown to b, and an entry after it then by a quorum of those voters."""
    raft = repairing()
    raft.probe_term = 2
    raft.step(answer("a", 2, (2, 1)))
    raft.step(answer("c", 2, (2, 1), context=REPAIR_PROBE + b"=a,b,c;a,b,c,d;a,b,c,d,e"))
    assert raft.repair_floor == (3, 1)  # a, c: not more than 5 - 3 of a..e
    raft.step(answer("d", 2, (1, 1)))
    assert raft.repair_floor == (2, 1)


def test_a_member_answers_a_probe_with_its_log_end_and_its_voters() -> None:
    c = Raft(GROUP, "c", new_storage(ABC, terms=(1, 1, 1), term=1), CFG, random.Random(1))
    c.step(msg(MT.REPAIR, "b", "c", 2, index=1, log_term=1, context=REPAIR_PROBE))
    (reply,) = of_type(persist(c), MT.REPAIR_RESP)
    assert (reply.term, reply.index, reply.log_term, reply.reject) == (2, 2, 1, False)
    assert reply.context == REPAIR_PROBE + b"=a,b,c" and not reply.entries
    assert c.term == 2 and c.role is Role.FOLLOWER

    # a configuration change in its log, not yet committed: the voters after it too
    leader = new_raft(voters=ABC)
    make_leader(leader)
    leader.propose_conf_change(ConfChange(ConfChangeKind.REMOVE, "c"))
    persist(leader)
    leader.become_follower(leader.term, None)
    leader.step(
        msg(MT.REPAIR, "b", "a", leader.term + 1, index=0, log_term=0, context=REPAIR_PROBE)
    )
    (reply,) = of_type(persist(leader), MT.REPAIR_RESP)
    assert reply.context == REPAIR_PROBE + b"=a,b,c;a,b" and not reply.reject

    # a member that joins (created anew, perhaps after its removal) cannot vouch for its log
    storage = new_storage(ABC, term=1)
    hard = storage.hard_state
    storage.set_hard_state(HardState(hard.term, hard.vote, hard.commit, hard.conf, joining=True))
    joining = Raft(GROUP, "c", storage, CFG, random.Random(1))
    joining.step(msg(MT.REPAIR, "b", "c", 2, index=1, log_term=1, context=REPAIR_PROBE))
    (reply,) = of_type(persist(joining), MT.REPAIR_RESP)
    assert reply.reject

    # a member of a later term tells it, so that the next probe is in a term past it
    c.step(msg(MT.REPAIR, "b", "c", 1, index=1, log_term=1, context=REPAIR_PROBE))
    (reply,) = of_type(persist(c), MT.REPAIR_RESP)
    assert (reply.term, reply.context) == (2, b"")


def test_a_member_that_hears_its_leader_ignores_a_probe() -> None:
    """As for a vote (leader stickiness): a probe never disrupts a working group."""
    net = Network.build(config=CHECK_QUORUM)
    net.elect("a")
    term = net["a"].term
    net["c"].step(msg(MT.REPAIR, "b", "c", term + 1, index=0, log_term=0, context=REPAIR_PROBE))
    assert net["c"].term == term and not persist(net["c"])


def test_a_two_voter_group_recovers_when_the_damaged_voter_alone_held_the_lost_entries() -> None:
    """b led, wrote entries a never got, and lost them to damage on disk: a cannot win
    without b's vote, which the floor withholds, and b does not campaign. b's probe finds a
    short of the floor; they were never committed, and the group elects a leader again,
    committed entries intact."""
    net = Network.build(voters=("a", "b"))
    net.elect("b")
    net.propose("b", 2)
    committed = log_entries(net["b"])
    assert net["b"].log.committed == committed[-1].index
    net.isolate("b")
    net.propose("b", 3)  # only b holds these
    storage, floor = damaged_storage(net["b"], cut=committed[-1].index + 1, voters=("a", "b"))
    net.nodes["b"] = Raft(GROUP, "b", storage, CFG, random.Random(9))
    net.heal()
    net.tick(ET)
    assert all(raft.role is not Role.LEADER for raft in net.nodes.values())  # stuck so far
    assert net["b"].repair_floor == floor
    net.tick(4 * ET)
    leaders = [raft for raft in net.nodes.values() if raft.role is Role.LEADER]
    assert len(leaders) == 1 and net["b"].repair_floor is None
    assert log_entries(leaders[0])[: len(committed)] == committed


def test_an_entry_after_a_configuration_change_commits_with_a_quorum_of_both() -> None:
    """c's removal and an entry after it, acknowledged by a and c only: the removal commits
    (a quorum of a, b, c), the entry waits for b (a quorum of a, b), so that no commit
    rests on the removed voter alone."""
    leader = new_raft(voters=ABC)
    make_leader(leader)
    removal = leader.propose_conf_change(ConfChange(ConfChangeKind.REMOVE, "c"))
    data = leader.propose(b"x", 1)
    persist(leader)
    leader.step(msg(MT.APPEND_RESP, "c", "a", leader.term, index=data))
    assert leader.log.committed == removal and leader.conf == ConfState(("a", "b"))
    leader.step(msg(MT.APPEND_RESP, "b", "a", leader.term, index=data))
    assert leader.log.committed == data


def test_a_leader_does_not_probe_again_at_once_a_follower_that_lacks_what_it_acknowledged() -> None:
    """b acknowledged 4, then lost 3..4 to damage. Its rejection of the leader's probe at 4
    cannot move the probe lower (the leader never sends below what b acknowledged): the leader
    waits for the next heartbeat to probe again, not at once (the two went back and forth as
    fast as the network carries them, for as long as b's repair took: the simulator hung)."""
    net = Network.build()
    net.elect("a")
    net.propose("a", 4)
    leader = net["a"]
    progress = leader.progress["b"]
    assert progress.match == 4
    progress.become_probe()
    assert progress.next == 5
    progress.probe_sent = True
    leader.step(msg(MT.APPEND_RESP, "b", "a", leader.term, index=4, reject=True, reject_hint=2))
    assert not of_type(persist(leader), MT.APPEND)
    assert progress.next == 5 and progress.probe_sent  # probed again after a heartbeat answer
    leader.step(msg(MT.HEARTBEAT_RESP, "b", "a", leader.term))
    assert not progress.probe_sent
