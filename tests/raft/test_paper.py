"""The Raft paper's rules (§5, plus pre-vote, check-quorum, transfer, membership, reads and
snapshots), one test per rule, in the style of etcd-io/raft's raft_paper_test.go.

Each test builds nodes over `MemoryRaftStorage`, steps messages in and asserts on the
messages out and the state. No sockets, no clocks: randomness is a seeded `random.Random`.

Conventions of this core (unlike etcd): indexes start at 0 and -1 stands before the log
(term 0); every entry here covers one index (count=1), so an entry's index is its Raft index;
a new leader appends a no-op of its term; the leader counts its own log toward a commit only
once the Ready holding it was persisted and `advance()` was called.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence

import pytest

from laminar.partition.reconcile import Step, StepKind, leader_step
from laminar.raft import (
    ConfChange,
    ConfChangeKind,
    ConfState,
    Entry,
    EntryKind,
    HardState,
    MemoryRaftStorage,
    Message,
    MessageType,
    ProposalDropped,
    Raft,
    RaftConfig,
    Ready,
    Role,
    Snapshot,
)
from laminar.raft.raft import encode_control

MT = MessageType
GROUP = "g"
ABC = ("a", "b", "c")
ET = 10  # election ticks
#: The pure §5 algorithm: no pre-vote, no check-quorum.
CFG = RaftConfig(election_ticks=ET, heartbeat_ticks=1, pre_vote=False, check_quorum=False)
PRE_VOTE = RaftConfig(election_ticks=ET, heartbeat_ticks=1, pre_vote=True, check_quorum=False)
CHECK_QUORUM = RaftConfig(election_ticks=ET, heartbeat_ticks=1, pre_vote=False, check_quorum=True)
MAX_ROUNDS = 10_000
ALL = 1 << 40  # max_bytes that reads every entry


# ---- building nodes --------------------------------------------------------------------------


def data_of(index: int, term: int) -> bytes:
    """Entry payloads name their (index, term), so equal entries are equal byte for byte."""
    return f"{index}@{term}".encode()


def entry(index: int, term: int) -> Entry:
    return Entry(index, 1, term, data_of(index, term))


def entries_with_terms(terms: Sequence[int], start: int = 0) -> list[Entry]:
    return [entry(start + offset, term) for offset, term in enumerate(terms)]


def new_storage(
    voters: Sequence[str] = ABC,
    *,
    terms: Sequence[int] = (),
    term: int = 0,
    vote: str | None = None,
    commit: int = -1,
    learners: Sequence[str] = (),
) -> MemoryRaftStorage:
    """A bootstrapped group whose log holds one entry per term in `terms`."""
    conf = ConfState(tuple(sorted(voters)), tuple(sorted(learners)))
    storage = MemoryRaftStorage(conf)
    storage.append(entries_with_terms(terms))
    storage.set_hard_state(HardState(term, vote, commit, conf))
    return storage


def new_raft(
    node: str = "a",
    voters: Sequence[str] = ABC,
    *,
    storage: MemoryRaftStorage | None = None,
    config: RaftConfig = CFG,
    seed: int = 1,
) -> Raft:
    storage = storage if storage is not None else new_storage(voters)
    return Raft(GROUP, node, storage, config, random.Random(seed))


def msg(type_: MessageType, src: str, dst: str, term: int, **fields: object) -> Message:
    return Message(type_, GROUP, src, dst, term, **fields)  # type: ignore[arg-type]


def memory_storage(raft: Raft) -> MemoryRaftStorage:
    storage = raft.log.storage
    assert isinstance(storage, MemoryRaftStorage)
    return storage


def persist_ready(raft: Raft) -> Ready:
    """Drain one Ready the way a caller must: persist it into the node's storage (snapshot,
    then entries, then hard state), then `advance`. Returns the Ready (messages to send)."""
    ready = raft.ready()
    storage = memory_storage(raft)
    if ready.snapshot is not None:
        storage.apply_snapshot(ready.snapshot)
    storage.append(ready.entries)
    if ready.hard_state is not None:
        storage.set_hard_state(ready.hard_state)
    raft.advance(ready)
    return ready


def persist(raft: Raft) -> list[Message]:
    """Persist and advance; the messages to send."""
    return persist_ready(raft).messages


def of_type(messages: Iterable[Message], type_: MessageType) -> list[Message]:
    return [m for m in messages if m.type is type_]


def by_dst(messages: Iterable[Message]) -> dict[str, Message]:
    out: dict[str, Message] = {}
    for m in messages:
        assert m.dst not in out, f"two messages to {m.dst}"
        out[m.dst] = m
    return out


def log_entries(raft: Raft) -> list[Entry]:
    """Every entry in the node's log (stable and unstable) after its snapshot point."""
    log = raft.log
    if log.last_index() < log.first_index():
        return []
    return log.entries(log.first_index(), ALL)


def log_terms(raft: Raft) -> list[int]:
    return [e.term for e in log_entries(raft)]


def fire_election_timeout(raft: Raft) -> None:
    """Tick a non-leader exactly up to its randomized election timeout."""
    assert raft.role is not Role.LEADER
    for _ in range(raft.randomized_election_ticks - raft.election_elapsed):
        raft.tick()


def make_leader(raft: Raft, *, commit_noop: bool = True) -> None:
    """Elect `raft` by hand (every other voter grants its vote, no pre-vote) and persist its
    no-op; with `commit_noop`, every follower acknowledges the no-op, which commits. Drains
    the messages."""
    fire_election_timeout(raft)
    assert raft.role is Role.CANDIDATE or len(raft.conf.voters) == 1
    persist(raft)
    for peer in raft.conf.voters:
        if peer != raft.id and raft.role is Role.CANDIDATE:
            raft.step(msg(MT.VOTE_RESP, peer, raft.id, raft.term))
    assert raft.role is Role.LEADER
    persist(raft)
    if commit_noop:
        noop = raft.log.last_index()
        for peer in raft.conf.members():
            if peer != raft.id:
                raft.step(msg(MT.APPEND_RESP, peer, raft.id, raft.term, index=noop))
        persist(raft)
        assert raft.log.committed == noop


class Network:
    """Nodes run to quiescence. A message on a cut link (src, dst), or to a node that is not
    in the network, is dropped."""

    def __init__(self, rafts: Iterable[Raft]) -> None:
        self.nodes = {raft.id: raft for raft in rafts}
        self.cut: set[tuple[str, str]] = set()
        self.delivered: list[Message] = []
        self.read_states: dict[str, list[tuple[bytes, int]]] = {node: [] for node in self.nodes}

    @classmethod
    def build(
        cls,
        voters: Sequence[str] = ABC,
        *,
        config: RaftConfig = CFG,
        others: Sequence[str] = (),
        storages: Mapping[str, MemoryRaftStorage] | None = None,
    ) -> Network:
        """Voters bootstrap with `voters`; `others` (future members) bootstrap with the same
        configuration, in which they are not voters, so they never campaign."""
        rafts = []
        for number, node in enumerate((*voters, *others)):
            storage = (storages or {}).get(node) or new_storage(voters)
            rafts.append(Raft(GROUP, node, storage, config, random.Random(number + 1)))
        return cls(rafts)

    def __getitem__(self, node: str) -> Raft:
        return self.nodes[node]

    def isolate(self, node: str) -> None:
        for other in self.nodes:
            if other != node:
                self.cut |= {(node, other), (other, node)}

    def heal(self) -> None:
        self.cut.clear()

    def run(self) -> None:
        """Persist every Ready, then deliver its messages, until no node has anything to do."""
        for _ in range(MAX_ROUNDS):
            busy = [node for node in sorted(self.nodes) if self.nodes[node].has_ready()]
            if not busy:
                return
            outbox: list[Message] = []
            for node in busy:
                ready = persist_ready(self.nodes[node])
                self.read_states[node].extend(ready.read_states)
                outbox.extend(ready.messages)
            self.deliver(outbox)
        raise AssertionError("the cluster did not quiesce")

    def deliver(self, messages: Iterable[Message]) -> None:
        for m in messages:
            if (m.src, m.dst) in self.cut or m.dst not in self.nodes:
                continue
            self.delivered.append(m)
            self.nodes[m.dst].step(m)

    def tick(self, rounds: int = 1, nodes: Iterable[str] | None = None) -> None:
        """Tick the nodes (all by default) in lockstep, running to quiescence after each."""
        chosen = sorted(nodes) if nodes is not None else sorted(self.nodes)
        for _ in range(rounds):
            for node in chosen:
                self.nodes[node].tick()
            self.run()

    def heartbeat(self, leader: str) -> None:
        """One heartbeat round of `leader` (which also repairs lagging followers)."""
        raft = self.nodes[leader]
        for _ in range(raft.config.heartbeat_ticks):
            raft.tick()
        self.run()

    def elect(self, node: str) -> Raft:
        """Time `node` out, run the election, and replicate the new leader's no-op."""
        raft = self.nodes[node]
        fire_election_timeout(raft)
        self.run()
        assert raft.role is Role.LEADER, raft.role
        self.heartbeat(node)
        return raft

    def propose(self, leader: str, count: int) -> list[int]:
        raft = self.nodes[leader]
        indexes = [raft.propose(f"p{raft.log.last_index() + 1}".encode(), 1) for _ in range(count)]
        self.run()
        return indexes

    def leaders(self) -> list[Raft]:
        return [raft for raft in self.nodes.values() if raft.role is Role.LEADER]


# ---- §5.1 ------------------------------------------------------------------------------------


def become(raft: Raft, role: Role) -> None:
    """Bring a fresh node of a 3-node group to `role` at term 1."""
    if role is Role.FOLLOWER:
        raft.become_follower(1, "b")
    elif role is Role.CANDIDATE:
        fire_election_timeout(raft)
    else:
        make_leader(raft)
    persist(raft)
    assert (raft.role, raft.term) == (role, 1)


@pytest.mark.parametrize("role", [Role.FOLLOWER, Role.CANDIDATE, Role.LEADER])
@pytest.mark.parametrize("type_", [MT.APPEND, MT.HEARTBEAT, MT.VOTE, MT.APPEND_RESP])
def test_update_term_from_message(role: Role, type_: MessageType) -> None:
    """§5.1: a server that sees a larger term updates its own and reverts to follower; the
    sender of an APPEND or HEARTBEAT of that term is the leader."""
    raft = new_raft()
    become(raft, role)
    raft.step(msg(type_, "b", "a", 2, index=-1))
    assert (raft.role, raft.term) == (Role.FOLLOWER, 2)
    assert raft.lead == ("b" if type_ in (MT.APPEND, MT.HEARTBEAT) else None)
    if type_ is not MT.VOTE:  # (a vote request of the new term may be granted)
        assert raft.vote is None


@pytest.mark.parametrize("type_", [MT.APPEND, MT.HEARTBEAT, MT.VOTE, MT.APPEND_RESP])
def test_reject_stale_term_message(type_: MessageType) -> None:
    """§5.1: a request with a stale term is rejected: nothing changes (without pre-vote and
    check-quorum, not even an answer is sent)."""
    raft = new_raft(storage=new_storage(terms=(1,), term=2))
    raft.step(msg(type_, "b", "a", 1, index=0, log_term=1, entries=(entry(1, 1),), commit=1))
    assert (raft.role, raft.term, raft.vote, raft.lead) == (Role.FOLLOWER, 2, None, None)
    assert (raft.log.last_index(), raft.log.committed) == (0, -1)
    assert not raft.has_ready()


@pytest.mark.parametrize("config", [PRE_VOTE, CHECK_QUORUM])
def test_stale_leader_is_told_the_current_term(config: RaftConfig) -> None:
    """With pre-vote or check-quorum, an APPEND from a stale leader draws an answer of the
    current term, so that leader steps down (it may have been cut off while we moved on)."""
    raft = new_raft(storage=new_storage(terms=(1,), term=2), config=config)
    raft.step(msg(MT.APPEND, "b", "a", 1, index=0, log_term=1, entries=(entry(1, 1),)))
    (reply,) = persist(raft)
    assert (reply.type, reply.dst, reply.term, reply.reject) == (MT.APPEND_RESP, "b", 2, False)
    assert raft.log.last_index() == 0

    stale_leader = new_raft("b")
    make_leader(stale_leader, commit_noop=False)
    assert stale_leader.term == 1
    stale_leader.step(reply)
    assert (stale_leader.role, stale_leader.term) == (Role.FOLLOWER, 2)


# ---- §5.2 leader election --------------------------------------------------------------------


def test_start_as_follower() -> None:
    """§5.2: servers start up as followers, knowing no leader."""
    raft = new_raft()
    assert (raft.role, raft.term, raft.lead, raft.vote) == (Role.FOLLOWER, 0, None, None)


def test_leader_bcast_beat() -> None:
    """§5.2: the leader sends heartbeats (without entries) to every follower each
    heartbeat interval, carrying the commit index each follower can apply."""
    config = RaftConfig(election_ticks=ET, heartbeat_ticks=3, pre_vote=False, check_quorum=False)
    raft = new_raft(config=config)
    make_leader(raft)
    for _ in range(2):
        for _ in range(config.heartbeat_ticks - 1):
            raft.tick()
            assert persist(raft) == []
        raft.tick()
        beats = by_dst(persist(raft))
        assert sorted(beats) == ["b", "c"]
        for beat in beats.values():
            assert (beat.type, beat.src, beat.term, beat.entries) == (MT.HEARTBEAT, "a", 1, ())
            assert beat.commit == 0  # both followers acknowledged the committed no-op


def test_heartbeat_commit_is_capped_at_follower_match() -> None:
    """A heartbeat never tells a follower to commit past what it is known to hold."""
    raft = new_raft()
    make_leader(raft, commit_noop=False)
    raft.step(msg(MT.APPEND_RESP, "b", "a", 1, index=0))  # b has the no-op: it commits
    persist(raft)
    assert raft.log.committed == 0
    raft.tick()
    beats = by_dst(of_type(persist(raft), MT.HEARTBEAT))
    assert (beats["b"].commit, beats["c"].commit) == (0, -1)


def test_leader_announces_itself_upon_election() -> None:
    """Figure 2: upon election, the leader immediately sends AppendEntries to each server."""
    raft = new_raft()
    fire_election_timeout(raft)
    persist(raft)
    raft.step(msg(MT.VOTE_RESP, "b", "a", 1))
    assert raft.role is Role.LEADER
    sent = by_dst(m for m in persist(raft) if m.type in (MT.APPEND, MT.HEARTBEAT))
    assert sorted(sent) == ["b", "c"]
    assert all(m.term == 1 for m in sent.values())


@pytest.mark.parametrize("role", [Role.FOLLOWER, Role.CANDIDATE])
def test_nonleader_start_election(role: Role) -> None:
    """§5.2: a follower (or candidate) that hears from no leader for an election timeout
    increments its term, votes for itself and asks every other server for its vote."""
    raft = new_raft()
    become(raft, role)
    for _ in range(raft.randomized_election_ticks - raft.election_elapsed - 1):
        raft.tick()
    assert (raft.role, raft.term) == (role, 1)
    raft.tick()
    assert (raft.role, raft.term, raft.vote) == (Role.CANDIDATE, 2, "a")
    assert raft.votes == {"a": True}
    requests = by_dst(persist(raft))
    assert sorted(requests) == ["b", "c"]
    for request in requests.values():
        assert (request.type, request.term, request.index, request.log_term) == (
            MT.VOTE,
            2,
            -1,
            0,
        )
    assert memory_storage(raft).hard_state.vote == "a"  # the vote is durable before sending


@pytest.mark.parametrize(
    ("size", "votes", "want"),
    [
        (1, {}, Role.LEADER),
        (3, {"b": True, "c": True}, Role.LEADER),
        (3, {"b": True}, Role.LEADER),
        (5, {"b": True, "c": True, "d": True, "e": True}, Role.LEADER),
        (5, {"b": True, "c": True, "d": True}, Role.LEADER),
        (5, {"b": True, "c": True}, Role.LEADER),
        (5, {"b": False, "c": True, "d": False, "e": True}, Role.LEADER),
        # a majority rejects: back to follower
        (3, {"b": False, "c": False}, Role.FOLLOWER),
        (5, {"b": False, "c": False, "d": False, "e": False}, Role.FOLLOWER),
        (5, {"b": True, "c": False, "d": False, "e": False}, Role.FOLLOWER),
        # no quorum either way yet: still a candidate
        (3, {}, Role.CANDIDATE),
        (3, {"b": False}, Role.CANDIDATE),
        (5, {"b": True}, Role.CANDIDATE),
        (5, {"b": False, "c": False}, Role.CANDIDATE),
        (5, {}, Role.CANDIDATE),
    ],
)
def test_leader_election_in_one_round_rpc(size: int, votes: dict[str, bool], want: Role) -> None:
    """§5.2: a candidate wins with votes from a majority, loses to a majority of
    rejections, and otherwise stays a candidate."""
    voters = tuple("abcde"[:size])
    raft = new_raft(voters=voters)
    fire_election_timeout(raft)
    for voter, granted in votes.items():
        raft.step(msg(MT.VOTE_RESP, voter, "a", 1, reject=not granted))
    assert (raft.role, raft.term) == (want, 1)


@pytest.mark.parametrize(
    ("vote", "candidate", "reject"),
    [
        (None, "b", False),
        (None, "c", False),
        ("b", "b", False),
        ("c", "c", False),
        ("b", "c", True),
        ("c", "b", True),
    ],
)
def test_follower_vote(vote: str | None, candidate: str, reject: bool) -> None:
    """§5.2: a server votes for at most one candidate in a term (a repeated request from the
    candidate it voted for is granted again)."""
    raft = new_raft(storage=new_storage(term=1, vote=vote))
    raft.step(msg(MT.VOTE, candidate, "a", 1, index=-1, log_term=0))
    (reply,) = persist(raft)
    assert (reply.type, reply.dst, reply.term, reply.reject) == (MT.VOTE_RESP, candidate, 1, reject)
    assert raft.vote == (candidate if not reject else vote)


def test_follower_vote_first_come_first_served() -> None:
    """§5.2: the vote goes to the first candidate that asks in the term."""
    raft = new_raft()
    for candidate in ("b", "c"):
        raft.step(msg(MT.VOTE, candidate, "a", 1, index=-1, log_term=0))
    replies = by_dst(persist(raft))
    assert (replies["b"].reject, replies["c"].reject) == (False, True)
    assert memory_storage(raft).hard_state == HardState(1, "b", -1, ConfState(ABC))


@pytest.mark.parametrize("term", [1, 2])
def test_candidate_fallback(term: int) -> None:
    """§5.2: a candidate that receives an APPEND from a leader whose term is at least its
    own recognizes the leader and returns to follower."""
    raft = new_raft()
    fire_election_timeout(raft)
    assert (raft.role, raft.term) == (Role.CANDIDATE, 1)
    raft.step(msg(MT.APPEND, "b", "a", term, index=-1, log_term=0))
    assert (raft.role, raft.term, raft.lead) == (Role.FOLLOWER, term, "b")
    (reply,) = of_type(persist(raft), MT.APPEND_RESP)
    assert (reply.dst, reply.reject, reply.index) == ("b", False, -1)


def test_candidate_ignores_stale_leader() -> None:
    """§5.2: an APPEND of a smaller term than the candidate's is rejected: it stays candidate."""
    raft = new_raft(storage=new_storage(term=1))
    fire_election_timeout(raft)
    raft.step(msg(MT.APPEND, "b", "a", 1, index=-1, log_term=0))
    assert (raft.role, raft.term) == (Role.CANDIDATE, 2)


def election_timeouts(raft: Raft, role: Role, rounds: int) -> list[int]:
    """Ticks between becoming `role` (follower, or candidate after a first timeout) and the
    next election, over many rounds."""
    timeouts = []
    for _ in range(rounds):
        raft.become_follower(raft.term + 1, "b")
        if role is Role.CANDIDATE:
            fire_election_timeout(raft)
            assert raft.role is Role.CANDIDATE
        term = raft.term
        ticks = 0
        while raft.term == term:
            raft.tick()
            ticks += 1
            assert ticks < 3 * ET
        timeouts.append(ticks)
        raft.msgs.clear()
    return timeouts


def test_follower_election_timeout_randomized() -> None:
    """§5.2: a follower's election timeout is chosen randomly from [et, 2 * et): over many
    elections every value turns up, and no other."""
    timeouts = election_timeouts(new_raft(seed=3), Role.FOLLOWER, 50 * ET)
    assert set(timeouts) == set(range(ET, 2 * ET))


def test_candidate_election_timeout_randomized() -> None:
    """§5.2: a candidate whose election neither wins nor loses starts a new one after a
    fresh random timeout in [et, 2 * et)."""
    timeouts = election_timeouts(new_raft(seed=4), Role.CANDIDATE, 50 * ET)
    assert set(timeouts) == set(range(ET, 2 * ET))


def simultaneous_timeout_rate(role: Role, rounds: int = 1000) -> float:
    """Five servers start each round together as `role`; the share of rounds in which more
    than one of them times out first, on the same tick."""
    voters = tuple("abcde")
    rafts = [new_raft(node, voters, seed=number + 1) for number, node in enumerate(voters)]
    conflicts = 0
    for _ in range(rounds):
        for raft in rafts:
            raft.become_follower(raft.term + 1, None)
            if role is Role.CANDIDATE:
                fire_election_timeout(raft)
            raft.msgs.clear()
        terms = [raft.term for raft in rafts]
        timed_out = 0
        while not timed_out:
            for raft in rafts:
                raft.tick()
            timed_out = sum(raft.term != term for raft, term in zip(rafts, terms, strict=True))
        conflicts += timed_out > 1
    return conflicts / rounds


def test_followers_election_timeout_nonconflict() -> None:
    """§5.2: randomized timeouts spread the servers out, so in most rounds a single follower
    times out first (5 servers, 10 distinct timeouts: about 23% of rounds collide)."""
    assert simultaneous_timeout_rate(Role.FOLLOWER) <= 0.3


def test_candidates_election_timeout_nonconflict() -> None:
    """§5.2: the same for candidates of a split vote."""
    assert simultaneous_timeout_rate(Role.CANDIDATE) <= 0.3


# ---- §5.3 log replication --------------------------------------------------------------------


def test_leader_start_replication() -> None:
    """§5.3: the leader appends a proposal to its log, then sends it in APPEND to every
    follower, with the index and term of the entry before it and its commit index."""
    raft = new_raft()
    make_leader(raft)
    assert raft.propose(b"some data", 1) == 1
    want = Entry(1, 1, 1, b"some data", EntryKind.NORMAL)
    assert raft.log.unstable == [want]
    ready = persist_ready(raft)
    assert ready.entries == [want]
    appends = by_dst(ready.messages)
    assert sorted(appends) == ["b", "c"]
    for append in appends.values():
        assert (append.type, append.term, append.index, append.log_term) == (MT.APPEND, 1, 0, 1)
        assert (append.entries, append.commit) == ((want,), 0)


def test_leader_commit_entry() -> None:
    """§5.3: an entry replicated on a majority is committed; the leader applies it and tells
    the followers the new commit index in the following APPENDs."""
    raft = new_raft()
    make_leader(raft)
    index = raft.propose(b"some data", 1)
    persist(raft)
    raft.step(msg(MT.APPEND_RESP, "b", "a", 1, index=index))
    ready = persist_ready(raft)
    assert raft.log.committed == index
    assert ready.committed == (index, index)
    assert ready.hard_state is not None and ready.hard_state.commit == index
    appends = by_dst(of_type(ready.messages, MT.APPEND))
    assert sorted(appends) == ["b", "c"]
    assert all(append.commit == index for append in appends.values())


@pytest.mark.parametrize(
    ("size", "acks", "committed"),
    [
        (1, (), True),
        (3, (), False),
        (3, ("b",), True),
        (3, ("b", "c"), True),
        (5, (), False),
        (5, ("b",), False),
        (5, ("b", "c"), True),
        (5, ("b", "c", "d"), True),
        (5, ("b", "c", "d", "e"), True),
    ],
)
def test_leader_acknowledge_commit(size: int, acks: tuple[str, ...], committed: bool) -> None:
    """§5.3: an entry commits once the leader (counting itself) has it on a majority."""
    raft = new_raft(voters=tuple("abcde"[:size]))
    make_leader(raft)
    index = raft.propose(b"some data", 1)
    persist(raft)
    for node in acks:
        raft.step(msg(MT.APPEND_RESP, node, "a", 1, index=index))
    assert (raft.log.committed == index) is committed


def test_leader_counts_itself_only_once_persisted() -> None:
    """The leader's own copy counts toward a commit only after the Ready holding it was
    persisted (advance)."""
    raft = new_raft()
    make_leader(raft)
    index = raft.propose(b"some data", 1)
    raft.step(msg(MT.APPEND_RESP, "b", "a", 1, index=index))
    assert raft.log.committed == index - 1  # b has it, a has not persisted it
    ready = persist_ready(raft)
    assert ready.entries[-1].index == index
    assert raft.log.committed == index


@pytest.mark.parametrize("terms", [(), (2,), (1, 1), (1, 2)])
def test_leader_commit_preceding_entries(terms: tuple[int, ...]) -> None:
    """§5.3: committing an entry commits all preceding entries, including those of earlier
    leaders."""
    raft = new_raft(storage=new_storage(terms=terms, term=2))
    make_leader(raft, commit_noop=False)
    assert raft.term == 3
    index = raft.propose(b"some data", 1)
    persist(raft)
    for node in ("b", "c"):
        raft.step(msg(MT.APPEND_RESP, node, "a", 3, index=index))
    ready = persist_ready(raft)
    assert ready.committed == (0, index)
    committed = log_entries(raft)
    assert [e.term for e in committed] == [*terms, 3, 3]
    assert [e.kind for e in committed[-2:]] == [EntryKind.NOOP, EntryKind.NORMAL]


@pytest.mark.parametrize(
    ("terms", "commit"),
    [
        ((1,), 0),
        ((1, 1), 0),
        ((1, 1), 1),
        ((1, 1, 1), 1),
        ((1, 1), 5),  # the leader's commit may exceed the entries sent: capped at the last new
    ],
)
def test_follower_commit_entry(terms: tuple[int, ...], commit: int) -> None:
    """§5.3: once a follower learns an entry is committed (the leader's commit index), it
    applies it, up to the last entry it received in that APPEND."""
    raft = new_raft(storage=new_storage(term=1))
    entries = tuple(entries_with_terms(terms))
    raft.step(msg(MT.APPEND, "b", "a", 1, index=-1, log_term=0, entries=entries, commit=commit))
    want = min(commit, len(terms) - 1)
    assert raft.log.committed == want
    ready = persist_ready(raft)
    assert ready.committed == (0, want)
    assert ready.entries == list(entries)


@pytest.mark.parametrize(
    ("prev_index", "prev_term", "reject", "index", "hint", "hint_term"),
    [
        (-1, 0, False, -1, 0, 0),  # before the log: always matches
        (0, 1, False, 0, 0, 0),  # matches the first entry
        (1, 2, False, 1, 0, 0),  # matches the last entry
        (1, 1, True, 1, 0, 1),  # term mismatch: hint skips the whole term-2 suffix
        (2, 2, True, 2, 1, 2),  # beyond the log: hint is our last index
        (0, 3, True, 0, 0, 1),  # mismatch at the first entry, ours is older
    ],
)
def test_follower_check_append(
    prev_index: int, prev_term: int, reject: bool, index: int, hint: int, hint_term: int
) -> None:
    """§5.3: the follower refuses entries unless its log holds an entry at the previous index
    with the previous term; the refusal carries a hint of where the logs may agree (the
    largest index at or below the probe whose term is not above the leader's) and its term."""
    raft = new_raft(storage=new_storage(terms=(1, 2), term=2))
    raft.step(msg(MT.APPEND, "b", "a", 2, index=prev_index, log_term=prev_term))
    (reply,) = persist(raft)
    assert (reply.type, reply.dst, reply.term) == (MT.APPEND_RESP, "b", 2)
    assert (reply.reject, reply.index) == (reject, index)
    if reject:
        assert (reply.reject_hint, reply.log_term) == (hint, hint_term)
    assert log_terms(raft) == [1, 2]


@pytest.mark.parametrize(
    ("prev_index", "prev_term", "terms", "want_terms", "want_unstable"),
    [
        (1, 2, (3,), [1, 2, 3], [(2, 3)]),  # appends after a match
        (0, 1, (3, 4), [1, 3, 4], [(1, 3), (2, 4)]),  # replaces a conflicting suffix
        (-1, 0, (1,), [1, 2], []),  # already present: nothing to write
        (-1, 0, (1, 2), [1, 2], []),
        (-1, 0, (3,), [3], [(0, 3)]),  # conflicts at the first entry: truncates all
    ],
)
def test_follower_append_entries(
    prev_index: int,
    prev_term: int,
    terms: tuple[int, ...],
    want_terms: list[int],
    want_unstable: list[tuple[int, int]],
) -> None:
    """§5.3: an entry that conflicts with a new one (same index, other term) is deleted with
    all that follow it; entries not yet in the log are appended; matching ones are kept."""
    raft = new_raft(storage=new_storage(terms=(1, 2), term=2))
    entries = tuple(entries_with_terms(terms, start=prev_index + 1))
    raft.step(msg(MT.APPEND, "b", "a", 4, index=prev_index, log_term=prev_term, entries=entries))
    assert log_terms(raft) == want_terms
    ready = persist_ready(raft)
    assert [(e.index, e.term) for e in ready.entries] == want_unstable
    (reply,) = ready.messages
    assert (reply.reject, reply.index) == (False, prev_index + len(terms))
    assert memory_storage(raft).log == entries_with_terms(want_terms)


def test_follower_never_replaces_committed_entries() -> None:
    """§5.3/§5.4: an APPEND behind the follower's commit index only draws that index; the
    committed prefix is never touched."""
    raft = new_raft(storage=new_storage(terms=(1, 1), term=1, commit=0))
    entries = (entry(0, 1), entry(1, 5))
    raft.step(msg(MT.APPEND, "b", "a", 5, index=-1, log_term=0, entries=entries, commit=1))
    (reply,) = persist(raft)
    assert (reply.reject, reply.index) == (False, 0)
    assert log_terms(raft) == [1, 1]
    assert raft.log.committed == 0


FIGURE_7_LEADER = (1, 1, 1, 4, 4, 5, 5, 6, 6, 6)
FIGURE_7_FOLLOWERS = {
    "a": (1, 1, 1, 4, 4, 5, 5, 6, 6),
    "b": (1, 1, 1, 4),
    "c": (1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 6),
    "d": (1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 7, 7),
    "e": (1, 1, 1, 4, 4, 4, 4),
    "f": (1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3),
}


@pytest.mark.parametrize("case", sorted(FIGURE_7_FOLLOWERS))
def test_leader_sync_follower_log(case: str) -> None:
    """§5.3, Figure 7: when the leader with the top log comes to power in term 8, it makes
    each of the follower logs (a)-(f) identical to its own: it finds the latest entry where
    they agree, deletes the follower's entries after it and sends its own."""
    storages = {
        "l": new_storage(("l", "x", "y"), terms=FIGURE_7_LEADER, term=7),
        "x": new_storage(("l", "x", "y"), terms=FIGURE_7_FOLLOWERS[case], term=7),
        # a third voter with the leader's log, to elect it
        "y": new_storage(("l", "x", "y"), terms=FIGURE_7_LEADER, term=7),
    }
    net = Network.build(("l", "x", "y"), storages=storages)
    leader = net.elect("l")
    assert leader.term == 8
    net.heartbeat("l")
    want = [*entries_with_terms(FIGURE_7_LEADER), log_entries(leader)[-1]]
    assert [e.term for e in want] == [*FIGURE_7_LEADER, 8]
    assert log_entries(leader) == want
    assert log_entries(net["x"]) == want
    assert memory_storage(net["x"]).log == want
    assert net["x"].log.committed == leader.log.committed == len(FIGURE_7_LEADER)


@pytest.mark.parametrize("terms", [(1,), (1, 2)])
def test_vote_request(terms: tuple[int, ...]) -> None:
    """§5.2/§5.4.1: a follower that times out asks for votes with the index and term of its
    last log entry, at its term plus one."""
    raft = new_raft()
    term = terms[-1]
    entries = tuple(entries_with_terms(terms))
    raft.step(msg(MT.APPEND, "b", "a", term, index=-1, log_term=0, entries=entries))
    persist(raft)
    fire_election_timeout(raft)
    requests = by_dst(persist(raft))
    assert sorted(requests) == ["b", "c"]
    for request in requests.values():
        assert (request.type, request.term) == (MT.VOTE, term + 1)
        assert (request.index, request.log_term) == (len(terms) - 1, terms[-1])


@pytest.mark.parametrize(
    ("terms", "log_term", "index", "reject"),
    [
        # same last term: the longer (or equal) log is up to date
        ((1,), 1, 0, False),
        ((1,), 1, 1, False),
        ((1, 1), 1, 0, True),
        # the candidate's last term is higher: up to date whatever the length
        ((1,), 2, 0, False),
        ((1,), 2, 1, False),
        ((1, 1), 2, 0, False),
        # the candidate's last term is lower: not up to date whatever the length
        ((2,), 1, 0, True),
        ((2,), 1, 1, True),
        ((2, 1), 1, 0, True),
    ],
)
def test_voter(terms: tuple[int, ...], log_term: int, index: int, reject: bool) -> None:
    """§5.4.1: a voter denies its vote if its own log is more up to date than the
    candidate's (compare last terms; if equal, the longer log)."""
    raft = new_raft(storage=new_storage(terms=terms, term=max(terms)))
    raft.step(msg(MT.VOTE, "b", "a", 3, index=index, log_term=log_term))
    (reply,) = persist(raft)
    assert (reply.type, reply.term, reply.reject) == (MT.VOTE_RESP, 3, reject)


@pytest.mark.parametrize(("ack", "committed"), [(0, -1), (1, -1), (2, 2)])
def test_leader_only_commits_log_from_current_term(ack: int, committed: int) -> None:
    """§5.4.2: the leader commits entries of earlier terms only by committing an entry of
    its own term (replicas of older entries on a majority are not enough)."""
    raft = new_raft(storage=new_storage(terms=(1, 2), term=2))
    make_leader(raft, commit_noop=False)
    assert (raft.term, raft.log.last_index(), raft.log.last_term()) == (3, 2, 3)
    raft.step(msg(MT.APPEND_RESP, "b", "a", 3, index=ack))
    assert raft.log.committed == committed


def test_figure_8_older_term_commits_only_with_current_term() -> None:
    """§5.4.2, Figure 8: S1, leader of term 4, gets its term-2 entry onto a majority; that
    does not commit it, rightly, since S5 (last entry of term 3) could still be elected and
    overwrite it. Once an entry of term 4 is on a majority, both commit, and S5 cannot win."""
    voters = ("s1", "s2", "s3", "s4", "s5")
    s1 = new_raft("s1", voters, storage=new_storage(voters, terms=(1, 2), term=3))
    make_leader(s1, commit_noop=False)
    assert (s1.term, log_terms(s1)) == (4, [1, 2, 4])
    for node in ("s2", "s3"):  # (c): the term-2 entry is on s1, s2, s3
        s1.step(msg(MT.APPEND_RESP, node, "s1", 4, index=1))
    assert s1.log.committed == -1
    s2 = new_raft("s2", voters, storage=new_storage(voters, terms=(1, 2), term=4))
    s2.step(msg(MT.VOTE, "s5", "s2", 5, index=1, log_term=3))  # (d): s5 may win
    assert [m.reject for m in persist(s2)] == [False]

    for node in ("s2", "s3"):  # (e): the term-4 entry is on a majority
        s1.step(msg(MT.APPEND_RESP, node, "s1", 4, index=2))
    assert s1.log.committed == 2
    s2 = new_raft("s2", voters, storage=new_storage(voters, terms=(1, 2, 4), term=4))
    s2.step(msg(MT.VOTE, "s5", "s2", 5, index=1, log_term=3))
    assert [m.reject for m in persist(s2)] == [True]


# ---- pre-vote and check-quorum (§9.6 of the dissertation) ------------------------------------


def test_pre_vote_does_not_raise_term() -> None:
    """Pre-vote: a partitioned node keeps its term while it cannot win, and when it rejoins
    with a stale log it cannot depose the leader."""
    net = Network.build(config=PRE_VOTE)
    leader = net.elect("a")
    net.isolate("c")
    net.propose("a", 3)
    net.tick(5 * ET)
    assert (net["c"].term, net["c"].role) == (1, Role.PRE_CANDIDATE)
    net.heal()
    net.tick(3 * ET)
    assert (leader.role, leader.term) == (Role.LEADER, 1)
    assert (net["c"].role, net["c"].term, net["c"].lead) == (Role.FOLLOWER, 1, "a")
    assert log_entries(net["c"]) == log_entries(leader)
    assert all(m.term <= 1 for m in net.delivered if m.type is not MT.PRE_VOTE)
    assert {m.term for m in of_type(net.delivered, MT.VOTE)} == {1}  # a's own election


def test_without_pre_vote_rejoining_node_disrupts() -> None:
    """The contrast: without pre-vote, the partitioned node raises its term in vain, and on
    rejoining forces the leader to step down."""
    net = Network.build()
    net.elect("a")
    net.isolate("c")
    net.propose("a", 3)
    net.tick(5 * ET)
    assert net["c"].term > 2
    disrupted_term = net["c"].term
    net.heal()
    for _ in range(20 * ET):
        net.tick()
        if [r for r in net.leaders() if r.term >= disrupted_term]:
            break
    (leader,) = net.leaders()
    assert leader.id != "c"  # c's log is behind: it cannot win, it can only disrupt
    assert leader.term >= disrupted_term > 2


def test_pre_vote_granted_leads_to_election() -> None:
    """Pre-vote: a timed-out node first asks for pre-votes at its term plus one without
    changing its term or vote; a majority of grants starts the real election."""
    raft = new_raft("c", config=PRE_VOTE)
    fire_election_timeout(raft)
    assert (raft.role, raft.term, raft.vote) == (Role.PRE_CANDIDATE, 0, None)
    requests = by_dst(persist(raft))
    assert sorted(requests) == ["a", "b"]
    for request in requests.values():
        assert (request.type, request.term, request.index, request.log_term) == (
            MT.PRE_VOTE,
            1,
            -1,
            0,
        )
    assert memory_storage(raft).hard_state.term == 0
    raft.step(msg(MT.PRE_VOTE_RESP, "a", "c", 1))
    assert (raft.role, raft.term, raft.vote) == (Role.CANDIDATE, 1, "c")
    requests = by_dst(persist(raft))
    assert {m.type for m in requests.values()} == {MT.VOTE}
    raft.step(msg(MT.VOTE_RESP, "b", "c", 1))
    assert (raft.role, raft.term) == (Role.LEADER, 1)


def test_pre_vote_rejected_by_majority() -> None:
    """Pre-vote: a majority of rejections sends the pre-candidate back to follower at the
    same term."""
    raft = new_raft("c", storage=new_storage(term=3), config=PRE_VOTE)
    fire_election_timeout(raft)
    raft.step(msg(MT.PRE_VOTE_RESP, "a", "c", 3, reject=True))
    raft.step(msg(MT.PRE_VOTE_RESP, "b", "c", 3, reject=True))
    assert (raft.role, raft.term, raft.vote) == (Role.FOLLOWER, 3, None)


def test_pre_vote_voter_keeps_term_and_vote() -> None:
    """Pre-vote: granting a pre-vote changes neither the voter's term nor its vote."""
    raft = new_raft(storage=new_storage(term=1, vote="b"), config=PRE_VOTE)
    raft.step(msg(MT.PRE_VOTE, "c", "a", 2, index=-1, log_term=0))
    (reply,) = persist(raft)
    assert (reply.type, reply.term, reply.reject) == (MT.PRE_VOTE_RESP, 2, False)
    assert (raft.term, raft.vote) == (1, "b")


def test_check_quorum_leader_steps_down() -> None:
    """Check-quorum: a leader that has not heard from a majority within an election timeout
    steps down; one that has, stays."""
    net = Network.build(config=CHECK_QUORUM)
    leader = net.elect("a")
    net.tick(5 * ET)
    assert (leader.role, leader.term) == (Role.LEADER, 1)
    net.isolate("a")
    for _ in range(2 * ET):
        leader.tick()
        net.run()
    assert (leader.role, leader.term, leader.lead) == (Role.FOLLOWER, 1, None)


def test_check_quorum_one_follower_is_enough() -> None:
    """Check-quorum counts the leader itself: with one of two followers it stays leader."""
    net = Network.build(config=CHECK_QUORUM)
    leader = net.elect("a")
    net.isolate("c")
    for _ in range(3 * ET):
        leader.tick()
        net["b"].tick()
        net.run()
    assert (leader.role, leader.term) == (Role.LEADER, 1)


def test_vote_stickiness() -> None:
    """Check-quorum: a follower (or leader) that heard from the leader within the election
    timeout ignores vote requests of higher terms, unless they come from a leadership
    transfer; once the timeout passed, it votes again."""
    net = Network.build(config=CHECK_QUORUM)
    leader = net.elect("a")
    follower = net["b"]
    last = leader.log.last_index()
    follower.step(msg(MT.VOTE, "c", "b", 2, index=last, log_term=1))
    leader.step(msg(MT.VOTE, "c", "a", 2, index=last, log_term=1))
    assert (follower.term, follower.vote, leader.term, leader.role) == (1, "a", 1, Role.LEADER)
    assert not follower.has_ready() and not leader.has_ready()

    follower.step(msg(MT.PRE_VOTE, "c", "b", 2, index=last, log_term=1))
    assert not follower.has_ready()

    transfer = msg(MT.VOTE, "c", "b", 2, index=last, log_term=1, context=b"transfer")
    follower.step(transfer)
    assert (follower.term, follower.vote) == (2, "c")
    (reply,) = persist(follower)
    assert (reply.type, reply.term, reply.reject) == (MT.VOTE_RESP, 2, False)


def test_vote_stickiness_ends_with_the_lease() -> None:
    """Check-quorum: a follower that has not heard from the leader for an election timeout
    grants votes of a higher term again."""
    net = Network.build(config=CHECK_QUORUM)
    net.elect("a")
    follower = net["b"]
    assert follower.randomized_election_ticks > ET  # so it does not campaign itself
    last = follower.log.last_index()
    for _ in range(ET - 1):
        follower.tick()
    follower.step(msg(MT.VOTE, "c", "b", 2, index=last, log_term=1))
    assert follower.term == 1  # still within the lease
    follower.tick()
    follower.step(msg(MT.VOTE, "c", "b", 2, index=last, log_term=1))
    assert (follower.term, follower.vote, follower.lead) == (2, "c", None)
    (reply,) = persist(follower)
    assert (reply.type, reply.reject) == (MT.VOTE_RESP, False)


# ---- leadership transfer (§3.10 of the dissertation) ----------------------------------------


def test_leadership_transfer_to_up_to_date_follower() -> None:
    """Transfer: the leader sends TIMEOUT_NOW to an up-to-date transferee, which campaigns
    at once (its vote requests pass vote stickiness) and wins at a higher term."""
    net = Network.build(config=CHECK_QUORUM)
    leader = net.elect("a")
    leader.transfer_leadership("b")
    (timeout_now,) = leader.msgs
    assert (timeout_now.type, timeout_now.dst, timeout_now.term) == (MT.TIMEOUT_NOW, "b", 1)
    net.run()
    assert (net["b"].role, net["b"].term) == (Role.LEADER, 2)
    net.heartbeat("b")
    assert (leader.role, leader.term, leader.lead) == (Role.FOLLOWER, 2, "b")
    assert {m.context for m in of_type(net.delivered, MT.VOTE) if m.term == 2} == {b"transfer"}


def make_lagging(net: Network, node: str, leader: str, entries: int = 3) -> None:
    net.isolate(node)
    net.propose(leader, entries)
    net.heal()


def test_leadership_transfer_to_lagging_follower() -> None:
    """Transfer: a lagging transferee is first brought up to date, then sent TIMEOUT_NOW."""
    net = Network.build()
    leader = net.elect("a")
    make_lagging(net, "c", "a")
    assert net["c"].log.last_index() < leader.log.last_index()
    last = leader.log.last_index()
    leader.transfer_leadership("c")
    assert not of_type(leader.msgs, MT.TIMEOUT_NOW)
    net.run()
    (timeout_now,) = of_type(net.delivered, MT.TIMEOUT_NOW)
    assert timeout_now.dst == "c"
    # c campaigned with the leader's whole log: it was caught up first
    (request, _) = [m for m in of_type(net.delivered, MT.VOTE) if m.term == 2]
    assert (request.src, request.index, request.log_term) == ("c", last, 1)
    assert (net["c"].role, net["c"].term) == (Role.LEADER, 2)
    assert log_entries(net["c"])[: last + 1] == log_entries(leader)[: last + 1]


def test_proposals_dropped_during_transfer() -> None:
    """Transfer: while it is under way the leader refuses proposals."""
    net = Network.build()
    leader = net.elect("a")
    net.isolate("c")
    leader.transfer_leadership("c")
    with pytest.raises(ProposalDropped):
        leader.propose(b"x", 1)
    with pytest.raises(ProposalDropped):
        leader.propose_conf_change(ConfChange(ConfChangeKind.REMOVE, "b"))


def test_transfer_aborts_after_election_timeout() -> None:
    """Transfer: one that has not finished within an election timeout is abandoned and the
    leader takes proposals again."""
    net = Network.build()
    leader = net.elect("a")
    net.isolate("c")
    leader.transfer_leadership("c")
    for _ in range(ET - 1):
        leader.tick()
        net.run()
    with pytest.raises(ProposalDropped):
        leader.propose(b"x", 1)
    leader.tick()
    net.run()
    assert leader.transferee is None
    assert leader.propose(b"x", 1) == leader.log.last_index()
    assert (leader.role, leader.term) == (Role.LEADER, 1)


@pytest.mark.parametrize("to", ["a", "d"])
def test_transfer_needs_another_voter(to: str) -> None:
    raft = new_raft()
    make_leader(raft)
    with pytest.raises(ProposalDropped):
        raft.transfer_leadership(to)


# ---- membership (single-server changes, §4 of the dissertation) ------------------------------


def change(kind: ConfChangeKind, node: str) -> ConfChange:
    return ConfChange(kind, node)


def add_learner(net: Network, leader: str, node: str) -> None:
    index = net[leader].propose_conf_change(change(ConfChangeKind.ADD_LEARNER, node))
    net.run()
    assert net[leader].log.committed >= index
    net.heartbeat(leader)


def test_add_learner() -> None:
    """A learner receives the log but never campaigns and does not count toward commits."""
    net = Network.build(others=("d",))
    leader = net.elect("a")
    add_learner(net, "a", "d")
    learner = net["d"]
    for raft in net.nodes.values():
        assert raft.conf == ConfState(ABC, ("d",)), raft.id
    net.propose("a", 2)
    assert log_entries(learner) == log_entries(leader)
    assert learner.log.committed == leader.log.committed

    # does not count toward a commit: a and d alone commit nothing
    net.isolate("b")
    net.isolate("c")
    (index,) = net.propose("a", 1)
    assert learner.log.last_index() == index
    assert leader.progress["d"].match == index
    assert leader.log.committed == index - 1

    # never campaigns, and candidates do not ask it
    net.heal()
    for _ in range(5 * ET):
        learner.tick()
    assert learner.role is Role.FOLLOWER
    assert not learner.msgs
    fire_election_timeout(net["b"])
    assert sorted(m.dst for m in of_type(net["b"].msgs, MT.VOTE)) == ["a", "c"]


def test_candidate_counts_only_voters() -> None:
    """Votes of non-voters (learners, strangers) never count toward an election."""
    raft = new_raft(storage=new_storage(ABC, learners=("d",)))
    fire_election_timeout(raft)
    raft.step(msg(MT.VOTE_RESP, "d", "a", 1))
    raft.step(msg(MT.VOTE_RESP, "x", "a", 1))
    assert raft.role is Role.CANDIDATE


def test_promote_learner_only_after_catch_up() -> None:
    """A learner may be promoted only once it has caught up with the leader's log."""
    net = Network.build(others=("d",))
    leader = net.elect("a")
    net.isolate("d")
    add_learner(net, "a", "d")
    net.propose("a", 3)
    promote = change(ConfChangeKind.PROMOTE, "d")
    with pytest.raises(ProposalDropped):
        leader.propose_conf_change(promote)
    net.heal()
    net.heartbeat("a")
    assert net["d"].log.last_index() == leader.log.last_index()
    index = leader.propose_conf_change(promote)
    net.run()
    assert leader.log.committed >= index
    net.heartbeat("a")
    for raft in net.nodes.values():
        assert raft.conf == ConfState(("a", "b", "c", "d")), raft.id
    # d now counts: with b and c cut off, a and d are 2 of 4, not a majority
    net.isolate("b")
    net.isolate("c")
    (index,) = net.propose("a", 1)
    assert net["d"].log.last_index() == index
    assert leader.log.committed == index - 1


def test_a_learner_that_never_answered_is_not_caught_up_however_short_the_log() -> None:
    """Regression (the kind e2e, a scale from 3 to 5): a leader promoted two learners that had
    not yet even made the replica (within the lag of a short log, counted from a match of
    -1), then removed two old voters: the group's majority was members without a replica,
    and it never had a leader again."""
    config = RaftConfig(election_ticks=ET, heartbeat_ticks=1, promote_lag_indexes=256)
    net = Network.build(others=("d",), config=config)
    leader = net.elect("a")
    net.isolate("d")
    add_learner(net, "a", "d")
    promote = change(ConfChangeKind.PROMOTE, "d")
    assert not leader.caught_up("d", 256)
    with pytest.raises(ProposalDropped, match="has not caught up"):
        leader.propose_conf_change(promote)
    assert next_step_of(leader, ["a", "b", "d"]) is None  # nor would the reconciler try
    net.heal()
    net.heartbeat("a")
    assert leader.caught_up("d", 256)
    assert next_step_of(leader, ["a", "b", "d"]) == Step(StepKind.PROMOTE, "d")


def next_step_of(leader: Raft, target: list[str]) -> Step | None:
    return leader_step(leader, target, alive=set(leader.conf.members()), lag_indexes=256)


@pytest.mark.parametrize("node", ["b", "e"])
def test_promote_needs_a_learner(node: str) -> None:
    raft = new_raft()
    make_leader(raft)
    with pytest.raises(ProposalDropped):
        raft.propose_conf_change(change(ConfChangeKind.PROMOTE, node))


def test_remove_follower_shrinks_quorum() -> None:
    """Removing a voter shrinks the quorum as soon as the removal commits: entries waiting
    for the removed voter's acknowledgement commit at once."""
    raft = new_raft(voters=("a", "b"))
    make_leader(raft)
    removal = raft.propose_conf_change(change(ConfChangeKind.REMOVE, "b"))
    data = raft.propose(b"x", 1)
    persist(raft)
    raft.step(msg(MT.APPEND_RESP, "b", "a", 1, index=removal))  # b never acks `data`
    assert raft.conf == ConfState(("a",))
    assert "b" not in raft.progress
    assert raft.log.committed == data
    assert persist_ready(raft).committed == (removal, data)


def test_remove_follower_in_cluster() -> None:
    """The removed follower stops counting; the rest carry on with the smaller quorum."""
    net = Network.build()
    leader = net.elect("a")
    index = leader.propose_conf_change(change(ConfChangeKind.REMOVE, "c"))
    net.run()
    net.heartbeat("a")
    assert leader.log.committed >= index
    for node in ("a", "b"):
        assert net[node].conf == ConfState(("a", "b"))
    net.isolate("c")
    (data,) = net.propose("a", 1)
    assert leader.log.committed == data
    with pytest.raises(ProposalDropped):
        leader.propose_conf_change(change(ConfChangeKind.REMOVE, "c"))  # not a member


def test_leader_removing_itself_steps_down_after_commit() -> None:
    """A leader that removes itself leads until the removal commits, then steps down, never
    campaigns again, and the others elect a leader among themselves."""
    net = Network.build()
    leader = net.elect("a")
    index = leader.propose_conf_change(change(ConfChangeKind.REMOVE, "a"))
    net.cut |= {("b", "a"), ("c", "a")}  # the followers get it, their acks are lost
    net.run()
    assert net["b"].log.last_index() == index
    assert (leader.role, leader.log.committed, leader.conf) == (
        Role.LEADER,
        index - 1,
        net["b"].conf,
    )
    net.heal()
    net.heartbeat("a")
    assert leader.log.committed >= index
    assert (leader.role, leader.conf) == (Role.FOLLOWER, ConfState(("b", "c")))
    for _ in range(5 * ET):
        leader.tick()
    assert not of_type(leader.msgs, MT.VOTE)
    net.tick(3 * ET, nodes=("b", "c"))
    (new_leader,) = net.leaders()
    assert new_leader.id in ("b", "c") and new_leader.term == 2
    assert net["b"].conf == net["c"].conf == ConfState(("b", "c"))


def test_removed_leader_sends_nothing_after_stepping_down() -> None:
    """Only a leader sends APPEND: a leader that stepped down on committing its own removal
    sends one last heartbeat to each member, telling the commit as far as it holds the log,
    and nothing more."""
    raft = new_raft()
    make_leader(raft)
    index = raft.propose_conf_change(change(ConfChangeKind.REMOVE, "a"))
    persist(raft)
    raft.step(msg(MT.APPEND_RESP, "b", "a", 1, index=index))
    assert (raft.role, raft.log.committed) == (Role.FOLLOWER, index)
    messages = persist(raft)
    assert of_type(messages, MT.APPEND) == []
    beats = {m.dst: m.commit for m in of_type(messages, MT.HEARTBEAT)}
    assert beats == {"b": index, "c": index - 1}  # (c acknowledged the no-op only)
    for _ in range(3 * ET):
        raft.tick()
    assert persist(raft) == []


def test_only_one_pending_conf_change() -> None:
    """Configuration changes go one at a time: a second is refused until the first commits."""
    net = Network.build()
    leader = net.elect("a")
    leader.propose_conf_change(change(ConfChangeKind.ADD_LEARNER, "d"))
    with pytest.raises(ProposalDropped):
        leader.propose_conf_change(change(ConfChangeKind.ADD_LEARNER, "e"))
    net.run()
    leader.propose_conf_change(change(ConfChangeKind.ADD_LEARNER, "e"))
    net.run()
    assert leader.conf == ConfState(ABC, ("d", "e"))


def test_new_leader_cannot_change_conf_before_committing_in_its_term() -> None:
    """A new leader proposes no configuration change before an entry of its own term (its
    no-op) commits."""
    raft = new_raft()
    make_leader(raft, commit_noop=False)
    with pytest.raises(ProposalDropped):
        raft.propose_conf_change(change(ConfChangeKind.ADD_LEARNER, "d"))
    raft.step(msg(MT.APPEND_RESP, "b", "a", 1, index=raft.log.last_index()))
    persist(raft)
    assert raft.propose_conf_change(change(ConfChangeKind.ADD_LEARNER, "d")) == 1


def conf_entry(index: int, term: int, conf_change: ConfChange) -> Entry:
    return Entry(index, 1, term, encode_control(EntryKind.CONF, conf_change), EntryKind.CONF)


def test_conf_change_takes_effect_on_commit_only() -> None:
    """A configuration entry changes nothing until committed; an uncommitted one that a new
    leader overwrites is forgotten."""
    add_d = conf_entry(1, 1, change(ConfChangeKind.ADD_LEARNER, "d"))
    raft = new_raft(storage=new_storage(term=1))
    raft.step(msg(MT.APPEND, "b", "a", 1, index=-1, log_term=0, entries=(entry(0, 1), add_d)))
    assert raft.conf == ConfState(ABC)
    raft.step(msg(MT.APPEND, "b", "a", 1, index=1, log_term=1, commit=1))
    assert raft.conf == ConfState(ABC, ("d",))
    assert persist_ready(raft).hard_state == HardState(1, None, 1, ConfState(ABC, ("d",)))

    raft = new_raft(storage=new_storage(term=1))
    raft.step(msg(MT.APPEND, "b", "a", 1, index=-1, log_term=0, entries=(entry(0, 1), add_d)))
    raft.step(msg(MT.APPEND, "c", "a", 2, index=0, log_term=1, entries=(entry(1, 2),), commit=1))
    assert raft.log.committed == 1
    assert raft.conf == ConfState(ABC)


# ---- linearizable reads (§6.4 of the dissertation) -------------------------------------------


def test_read_index_on_leader() -> None:
    """ReadIndex: the leader records its commit index, confirms it still leads with a
    heartbeat round carrying the request's context, and answers once a quorum acknowledged."""
    raft = new_raft()
    make_leader(raft)
    raft.read_index(b"ctx")
    beats = by_dst(persist(raft))
    assert sorted(beats) == ["b", "c"]
    assert {(m.type, m.context) for m in beats.values()} == {(MT.HEARTBEAT, b"ctx")}
    assert not raft.read_states
    raft.step(msg(MT.HEARTBEAT_RESP, "b", "a", 1, context=b"ctx"))
    assert persist_ready(raft).read_states == [(b"ctx", 0)]


def test_read_index_single_voter_is_immediate() -> None:
    raft = new_raft(voters=("a",))
    make_leader(raft)
    raft.read_index(b"ctx")
    ready = persist_ready(raft)
    assert ready.read_states == [(b"ctx", 0)]
    assert not ready.messages


def test_read_index_waits_for_commit_in_term() -> None:
    """ReadIndex: a new leader that has not committed an entry of its term does not know
    the commit index yet; it refuses the read (the caller retries) and sends nothing for it.
    An empty context could never be matched to its heartbeat round: refused too."""
    raft = new_raft()
    make_leader(raft, commit_noop=False)
    with pytest.raises(ProposalDropped, match="committed an entry of its term"):
        raft.read_index(b"ctx")
    with pytest.raises(ValueError):
        raft.read_index(b"")
    ready = persist_ready(raft)
    assert not ready.read_states
    assert not [m for m in ready.messages if m.context]


def test_read_index_forwarded_by_follower() -> None:
    """ReadIndex on a follower: it forwards READ_INDEX to the leader, which confirms its
    leadership and answers READ_INDEX_RESP with its commit index."""
    net = Network.build()
    leader = net.elect("a")
    net["b"].read_index(b"r1")
    (forwarded,) = net["b"].msgs
    assert (forwarded.type, forwarded.dst, forwarded.context) == (MT.READ_INDEX, "a", b"r1")
    net.run()
    (response,) = of_type(net.delivered, MT.READ_INDEX_RESP)
    assert (response.dst, response.context, response.index) == ("b", b"r1", leader.log.committed)
    assert net.read_states["b"] == [(b"r1", leader.log.committed)]
    assert net.read_states["a"] == []


def test_read_index_without_leader() -> None:
    raft = new_raft()
    with pytest.raises(ProposalDropped):
        raft.read_index(b"ctx")


def test_stale_heartbeat_response_does_not_confirm_later_read() -> None:
    """ReadIndex: only acknowledgements of heartbeats sent after the read was registered
    confirm it."""
    raft = new_raft()
    make_leader(raft)
    raft.read_index(b"r1")
    persist(raft)
    raft.step(msg(MT.HEARTBEAT_RESP, "b", "a", 1, context=b"r1"))
    assert persist_ready(raft).read_states == [(b"r1", 0)]
    raft.read_index(b"r2")  # registered now; c's answer below was sent before this
    persist(raft)
    raft.step(msg(MT.HEARTBEAT_RESP, "c", "a", 1, context=b"r1"))  # late, for r1
    assert persist_ready(raft).read_states == []


def test_heartbeat_response_confirms_earlier_reads() -> None:
    """ReadIndex: an acknowledgement of a later read's heartbeat confirms earlier reads too."""
    raft = new_raft()
    make_leader(raft)
    raft.read_index(b"r1")
    raft.read_index(b"r2")
    persist(raft)
    raft.step(msg(MT.HEARTBEAT_RESP, "b", "a", 1, context=b"r2"))
    assert persist_ready(raft).read_states == [(b"r1", 0), (b"r2", 0)]


# ---- snapshots (§7) --------------------------------------------------------------------------


def test_snapshot_to_far_behind_follower() -> None:
    """§7: a follower that needs entries the leader has compacted away receives a snapshot;
    its log restarts right after the snapshot's index, then replication resumes."""
    net = Network.build()
    leader = net.elect("a")
    net.isolate("c")
    net.propose("a", 5)
    compact_at = leader.log.committed
    assert compact_at == 5
    memory_storage(leader).compact(compact_at)
    net.heal()
    net.heartbeat("a")
    (snapshot_message,) = of_type(net.delivered, MT.SNAPSHOT)
    assert snapshot_message.dst == "c"
    assert snapshot_message.snapshot == Snapshot(compact_at, 1, ConfState(ABC))
    follower = net["c"]
    assert memory_storage(follower).snap == Snapshot(compact_at, 1, ConfState(ABC))
    assert follower.log.first_index() == compact_at + 1
    net.propose("a", 1)
    net.heartbeat("a")
    assert log_entries(follower) == log_entries(leader)
    assert follower.log.committed == leader.log.committed == compact_at + 1


def test_snapshot_with_matching_last_entry_keeps_log() -> None:
    """§7: a follower that already holds the snapshot's last entry keeps its log (entries
    after it included) and only fast-forwards its commit index."""
    raft = new_raft(storage=new_storage(terms=(1, 1, 1, 1, 1, 1), term=1, commit=1))
    snapshot = Snapshot(3, 1, ConfState(ABC))
    raft.step(msg(MT.SNAPSHOT, "b", "a", 1, snapshot=snapshot))
    ready = persist_ready(raft)
    assert ready.snapshot is None
    (reply,) = ready.messages
    assert (reply.type, reply.reject, reply.index) == (MT.APPEND_RESP, False, 3)
    assert raft.log.committed == 3
    assert ready.committed == (2, 3)
    assert log_terms(raft) == [1, 1, 1, 1, 1, 1]


def test_snapshot_with_conflicting_log_restores() -> None:
    """§7: a follower whose log does not hold the snapshot's last entry discards its log and
    restarts it after the snapshot."""
    raft = new_raft(storage=new_storage(terms=(1, 1, 1, 1, 1, 1), term=1, commit=1))
    snapshot = Snapshot(3, 2, ConfState(ABC, ("d",)))
    raft.step(msg(MT.SNAPSHOT, "b", "a", 2, snapshot=snapshot))
    assert raft.log.last_index() == 3
    ready = persist_ready(raft)
    assert ready.snapshot == snapshot
    (reply,) = ready.messages
    assert (reply.type, reply.reject, reply.index) == (MT.APPEND_RESP, False, 3)
    assert raft.log.committed == 3
    assert raft.conf == ConfState(ABC, ("d",))
    assert log_entries(raft) == []
    assert raft.log.term(3) == 2


def test_snapshot_restore_empties_stored_log() -> None:
    raft = new_raft(storage=new_storage(terms=(1, 1, 1, 1, 1, 1), term=1, commit=1))
    raft.step(msg(MT.SNAPSHOT, "b", "a", 2, snapshot=Snapshot(3, 2, ConfState(ABC))))
    persist(raft)
    assert raft.log.last_index() == 3
    assert memory_storage(raft).last_index() == 3


def test_snapshot_behind_commit_is_ignored() -> None:
    raft = new_raft(storage=new_storage(terms=(1, 1, 1, 1), term=1, commit=3))
    raft.step(msg(MT.SNAPSHOT, "b", "a", 1, snapshot=Snapshot(2, 1, ConfState(ABC))))
    ready = persist_ready(raft)
    assert ready.snapshot is None
    (reply,) = ready.messages
    assert (reply.type, reply.index) == (MT.APPEND_RESP, 3)
    assert log_terms(raft) == [1, 1, 1, 1]
