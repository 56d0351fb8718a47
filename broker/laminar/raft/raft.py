"""One Raft group on one node, as a pure state machine (after etcd-io/raft).

Inputs: `tick()`, `step(message)`, `propose(data, count)`, `propose_conf_change(change)`,
`transfer_leadership(to)`, `read_index(context)`. Output: `ready()` returns what to persist
(entries, hard state, snapshot), then messages to send and what became committed; the caller
persists, sends, and calls `advance(ready)`. No sockets, clocks or threads; randomness comes
from the `random.Random` the caller passes in, so a seeded simulation replays exactly.

A group is bootstrapped by giving every initial member's storage the same initial voters;
a node added later starts with the group's current configuration as its bootstrap (the
initial configuration is not in the log) and then follows the leader's log. Such a node
starts `joining` (`HardState.joining`): until its log holds an entry a leader wrote it
neither campaigns nor votes, so a member created by a stale message after its removal can
never help elect anyone.

Safety-relevant choices: a leader counts its own log towards a commit only once persisted
(`advance`); configuration changes take effect when committed, one at a time, and only after
the leader has committed an entry of its own term.

Log repair. A node whose log lost entries it may have acknowledged (a damaged batch found on
disk and cut away, with everything after it) starts with `HardState.repair_floor` set: the
(index, term) its log ended at before. Raft's safety rests on every acknowledged entry
staying on the node that acknowledged it, so until its log is again at least as up to date
as the floor the node neither campaigns nor takes a leadership transfer, and it grants votes
only to candidates at least as up to date as the floor: exactly the votes it would have
granted with its old log. A log that reaches the floor again through Raft's log matching
holds every committed entry the old one held (same last term: the same prefix; a later
term: written by a leader elected without this node's vote, which holds them all). To get
there it sends REPAIR (where its log ends) to its leader, which stops counting what was lost
and sends it again, or, with no leader known, to every member, which answers REPAIR_RESP with
the entries its own log holds after that point (a leaderless group can so recover an entry
only a damaged node and one other held). Entries that only the damaged node held are in no
other log: with no leader heard for two election timeouts it probes the members in the next
term (REPAIR with context `probe`; each adopts the term, unless it hears a leader) for where
their logs end and which voters they know of. Once, in every voter set reported (committed,
or after a change pending in a log), more than N - Q of the others (N voters, quorum Q)
answer short of the floor, none of them repairing or joining, the floor comes down to the
furthest answer: nothing past it of an earlier term is committed, or ever will be
(`_lower_floor` argues it; `_maybe_commit` counts an entry after a configuration change with
a quorum of the voters on both sides of it, which the argument needs). A majority of voters
damaged at once still leaves the group without a leader rather than lose data.

Quiescence (after CockroachDB's). A group with nothing to do costs nothing: a leader whose
log is committed, persisted and held by every member the failure detector counts live, with
no transfer, configuration change or read in flight, sends each member one last heartbeat
marked `reject` (heartbeats never reject otherwise), with its last entry: a quiesce request.
Then it and every follower that holds that entry stop ticking: no heartbeats, no election
timers, until a message or an input (a proposal, a transfer, a read, `wake`) arrives; a
member that does not quiesce answers with a rejecting heartbeat response, which wakes the
leader (and has it send what the member lacks). The node
(`laminar.node.core`) wakes a quiesced follower whose leader the failure detector stops
counting alive (then the election timeout runs as if the leader had just been heard), and a
quiesced leader whose member comes back. Safety does not depend on it: a quiesced node only
sends less. Off unless the groups share `GroupHooks` with `quiesce` set (`MultiRaft`).

Quiet commit appends. A leader tells its followers of a commit with an empty append (etcd's
`bcastAppend`). To a follower known to hold its whole log such an append is marked `reject`
(appends never reject otherwise), and the follower does not answer it when it matches: the
answer would tell nothing new. (At RF 3 and one append per commit, answers to commit-only
appends were a quarter of the frames; this removes the half of them sent by the follower
that answered first: 12 % of the frames, bench/RESULTS.md.) An append that does not match is
answered (rejected) as any other. Safety does not depend on it: the leader neither waits for
nor counts such an answer.

Commit notices on demand. A follower tells its leader, in each answer to an append or a
heartbeat, whether it wants to be told of each commit at once (`commit_wanted`, given by the
node: a partition replica wants them while a reader waits on it for a commit, and for a while
after it served a read): its answer carries its commit index then, and `NO_COMMIT_NOTICES`
otherwise (a broker that predates this sends -1, and is treated as wanting them). When an
answer moves the commit index, the leader sends the commit-only append of "Quiet commit
appends" only to the followers that want one; the others learn the commit with their next
entries or the next heartbeat (every tick, or the one a quiescing leader sends last). A commit
that takes a configuration change is told to every follower at once, and a leader that
committed its own removal tells it with a last heartbeat before it steps down: which members
campaign, and whose votes count, follows from what each knows committed (a member told late
may count voters that cannot outvote it, and not count itself). A
follower whose last answer to its leader in this term said it did not want them, and that is
about to serve a read, asks first (`ask_for_commits`: a heartbeat answer with its commit index
and, in `index`, the ask's number, drawn afresh from the node's random source at its first ask
and counted up from there). The leader answers an ask at once with its commit index (a
READ_INDEX_RESP with context `COMMIT_TOLD` and the ask's number in `reject_hint`: no round of
heartbeats, it confirms nothing) and, if the follower lacks it, an append that carries it.
`commit_asked` holds until the answer to the last ask (`on_commit_heard` then, with
`commit_told` the index; a late answer to an earlier ask is ignored): the read waits until the
follower has committed that far, and so sees what it would on a follower told of each commit at
once. A leader also answers with an append a heartbeat answer whose commit index is behind its
own. At RF 3 nothing read from followers in the issue's benches, and each append cost each
follower a message and a round of its own for the commit (bench/RESULTS.md, issue 22,
twenty-third sitting). Safety does not depend on it: a follower's commit index only ever lags
the leader's.

Owed appends. What a leader's inputs ask to send a follower (a proposal's entries, a commit
an answer made, a refill of the window an answer freed, a probe) is owed, not sent at once,
and goes out at the next `ready()`: each follower gets its unsent entries in one append (more
only where `max_append_bytes` cuts them, up to the window), with the latest commit index. A
proposal per request, or answers stepped together, used to send an append each, each answered
in turn: a queue's record and the acquire that rides behind it went as two (bench/RESULTS.md,
issue 22). Safety does not depend on it: an append holds what the separate ones would have,
and a leader that steps down before its `ready()` sends none it owed.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum

from ..log.batch import Record, decode_batch, encode_batch
from .config import RaftConfig
from .messages import (
    ConfChange,
    ConfChangeKind,
    Entry,
    EntryKind,
    HardState,
    Message,
    MessageType,
    Snapshot,
    up_to_date_order,
)
from .progress import Progress, ProgressState
from .raft_log import RaftLog
from .storage import RaftStorage, StorageUnavailable, stored_entries

MT = MessageType
CAMPAIGN_TRANSFER = b"transfer"
#: the context of a REPAIR that asks the members where their logs end (`_probe_repair`); an
#: answer's is this, "=" and the voters it has committed, then those after each configuration
#: change its log holds uncommitted: ids comma-separated, configurations ";"-separated
REPAIR_PROBE = b"probe"
#: an `eager` node knowing no leader campaigns after this many ticks
EAGER_TICKS = 2


class Role(IntEnum):
    FOLLOWER = 0
    PRE_CANDIDATE = 1
    CANDIDATE = 2
    LEADER = 3


class ProposalDropped(Exception):
    """Not leader, a leadership transfer is under way, or a configuration change is pending."""


@dataclass(slots=True)
class Ready:
    hard_state: HardState | None = None  # persist if not None
    entries: list[Entry] = field(default_factory=list)  # persist (truncating any overlap)
    snapshot: Snapshot | None = None  # install before the entries
    messages: list[Message] = field(default_factory=list)  # send after persisting
    #: (first, last) indexes newly committed, to apply after persisting
    committed: tuple[int, int] | None = None
    #: (context, index) of reads confirmed safe once `index` is applied
    read_states: list[tuple[bytes, int]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(
            self.hard_state
            or self.entries
            or self.snapshot
            or self.messages
            or self.committed
            or self.read_states
        )


def _always_live(node: str) -> bool:
    return True


def _always() -> bool:
    return True


def _nothing() -> None:
    pass


def quorum(voters: int) -> int:
    """How many of `voters` voters make a majority."""
    return voters // 2 + 1


#: an answer's `commit` when its follower does not want each commit told at once
NO_COMMIT_NOTICES = -2
#: the context of the READ_INDEX_RESP that answers an ask with the leader's commit index
COMMIT_TOLD = b"commit"
#: the answers that say whether their follower wants commit notices
_ANSWERS = frozenset({MessageType.APPEND_RESP, MessageType.HEARTBEAT_RESP})


class GroupHooks:
    """What the groups of one node share (`laminar.raft.multi.MultiRaft`): the groups that
    took an input since their last Ready (only they can have a new one), the groups awake
    (not quiesced: only they are ticked), whether idle groups quiesce, and the failure
    detector's word on whether a node is live."""

    __slots__ = ("awake", "live", "quiesce", "touched")

    def __init__(self, *, quiesce: bool = False) -> None:
        self.touched: set[str] = set()
        self.awake: set[str] = set()
        self.quiesce = quiesce
        self.live: Callable[[str], bool] = _always_live


def encode_control(kind: EntryKind, change: ConfChange | None = None) -> bytes:
    """A control batch: one record whose key names the kind (value: the change, if any)."""
    if kind is EntryKind.NOOP:
        record = Record(key=b"noop", value=None, timestamp_ms=0)
    else:
        assert change is not None
        record = Record(
            key=b"conf", value=f"{change.kind.value} {change.node}".encode(), timestamp_ms=0
        )
    return encode_batch([record], now_ms=0, control=True)


def decode_conf_change(value: bytes) -> ConfChange:
    kind, node = value.decode().split(" ", 1)
    return ConfChange(ConfChangeKind(int(kind)), node)


class Raft:
    def __init__(
        self,
        group: str,
        node_id: str,
        storage: RaftStorage,
        config: RaftConfig,
        rng: random.Random,
        *,
        pending_confs: dict[int, ConfChange] | None = None,
    ) -> None:
        """`pending_confs`: configuration entries in the log after the last commit (the
        caller finds them when reopening storage; `scan_pending_confs` helps)."""
        hard_state, snapshot = storage.initial_state()
        self.group = group
        self.id = node_id
        self.config = config
        self.rng = rng
        self.log = RaftLog(storage, max(hard_state.commit, snapshot.index))
        self.term = hard_state.term
        self.vote = hard_state.vote
        self.conf = hard_state.conf
        self.pending_confs: dict[int, ConfChange] = dict(pending_confs or {})
        self.repair_floor = hard_state.repair_floor
        self.joining = hard_state.joining
        self.repair_elapsed = 0
        #: a stuck repair's probe: its term, and the answers (member -> where its log ends,
        #: and its voters: those committed, then those after each change pending in its log)
        self.probe_term = -1
        self.unled_ticks = 0  # ticks since a leader was last heard, while repairing
        self.probe_answers: dict[str, tuple[tuple[int, int], list[tuple[str, ...]]]] = {}
        #: whom a repairing node asks when it knows no leader: every member it knew (one
        #: removed since may be the only other holder of what it lost)
        self.repair_peers = set(hard_state.conf.members()) | set(snapshot.conf.members())
        self.role = Role.FOLLOWER
        self.lead: str | None = None
        self.progress: dict[str, Progress] = {}
        self.votes: dict[str, bool] = {}
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.randomized_election_ticks = config.election_ticks
        self.transferee: str | None = None
        self.transfer_elapsed = 0
        #: the index of the no-op this node appended when it last became leader
        self.term_start_index = 0
        self.pending_conf_index = -1
        self.pending_reads: list[tuple[bytes, int, set[str], str]] = []  # ctx, index, acks, from
        self.read_states: list[tuple[bytes, int]] = []
        self.msgs: list[Message] = []
        #: followers owed an append at the next `ready()` (`_append_later`), and whether an
        #: empty one is owed too (it carries the commit index, or probes)
        self._appends_due: dict[str, bool] = {}
        #: quiesced: idle, not ticked (see the module's docstring)
        self.quiesced = False
        #: the group's preferred leader: a follower knowing no leader campaigns after
        #: EAGER_TICKS rather than a randomized election timeout (the caller sets it)
        self.eager = False
        #: ticks left during which a follower knowing no leader starts no election
        self.defer_ticks = 0
        self.hooks: GroupHooks | None = None
        #: whether this node, following, wants each commit told at once ("Commit notices on
        #: demand"); what its last answer said, and to whom in which term
        self.commit_wanted: Callable[[], bool] = _always
        self._told_wanted = True
        self._told: tuple[str, int] | None = None
        #: an ask for the commit index awaits its answer; the index the last answer told (-1:
        #: none in this term); and what is called when it arrives (or the term or role ends)
        self.commit_asked = False
        self.commit_told = -1
        self._asks = 0  # the number of the last ask (`ask_for_commits`)
        self.on_commit_heard: Callable[[], None] = _nothing
        self._prev_hard = hard_state
        self._applied_commit = self.log.committed
        self._apply_committed_confs()
        self._maybe_repaired()
        self._reset_randomized_timeout()

    # ---- helpers ---------------------------------------------------------------------------

    def attach(self, hooks: GroupHooks) -> None:
        """Share `hooks` with the node's other groups (`MultiRaft.add`)."""
        self.hooks = hooks
        hooks.touched.add(self.group)
        if not self.quiesced:
            hooks.awake.add(self.group)

    def _touch(self) -> None:
        """An input arrived: this group may have a Ready."""
        hooks = self.hooks
        if hooks is not None:
            hooks.touched.add(self.group)

    def _set_quiesced(self, quiesced: bool) -> None:
        if quiesced is self.quiesced:
            return
        self.quiesced = quiesced
        hooks = self.hooks
        if hooks is not None:
            if quiesced:
                hooks.awake.discard(self.group)
            else:
                hooks.awake.add(self.group)

    def wake(self, *, ping: bool = True) -> None:
        """Leave quiescence, as if the leader (or, for the leader, a quorum) had just been
        heard: tick again from a fresh election timeout. A follower also wakes its leader
        (`ping`: a heartbeat response marked `reject`), so that it heartbeats again: a
        follower awake under a quiesced leader would time out and campaign."""
        self._touch()
        if self.quiesced:
            self._set_quiesced(False)
            self.election_elapsed = 0
            self.heartbeat_elapsed = 0
            lead = self.lead
            if ping and self.role is not Role.LEADER and lead is not None and lead != self.id:
                self._send(self._msg(MT.HEARTBEAT_RESP, lead, reject=True))

    @property
    def is_voter(self) -> bool:
        return self.id in self.conf.voters

    def _quorum(self) -> int:
        return quorum(len(self.conf.voters))

    def _send(self, message: Message) -> None:
        self.msgs.append(message)

    def _msg(self, type_: MessageType, to: str, **fields: object) -> Message:
        fields.setdefault("term", self.term)
        if type_ in _ANSWERS and "commit" not in fields:
            wanted = self._told_wanted = self.commit_wanted()
            self._told = (to, self.term)
            fields["commit"] = self.log.committed if wanted else NO_COMMIT_NOTICES
        return Message(type_, self.group, self.id, to, **fields)  # type: ignore[arg-type]

    def ask_for_commits(self) -> bool:
        """Before a follower serves a read: if its last answer to its leader in this term said
        it did not want commit notices, ask the leader for its commit index at once (which
        also says it wants them from now on), and hold `commit_asked` until the leader's
        answer ("Commit notices on demand"). Whether it queued an ask. A leader, a node
        knowing no leader, a quiesced follower (its leader had nothing more to commit) and a
        follower whose leader tells it each commit already need none."""
        lead = self.lead
        if self.role is Role.LEADER or lead is None or lead == self.id or self.quiesced:
            return False
        if self._told_wanted or self._told != (lead, self.term):
            return False  # (a leader tells a follower that has not answered it at once)
        self._told_wanted = True
        self.commit_asked = True
        self._asks = self._asks + 1 if self._asks else self.rng.randrange(1, 1 << 62)
        self._touch()
        self._send(self._msg(MT.HEARTBEAT_RESP, lead, commit=self.log.committed, index=self._asks))
        return True

    def _commit_heard(self) -> None:
        if self.commit_asked:
            self.commit_asked = False
            self.on_commit_heard()

    def _reset_randomized_timeout(self) -> None:
        ticks = self.config.election_ticks
        self.randomized_election_ticks = ticks + self.rng.randrange(ticks)

    def _reset(self, term: int) -> None:
        if term != self.term:
            self.term = term
            self.vote = None
        self.lead = None
        self.commit_told = -1
        self._commit_heard()  # a reader that asked goes on: no leader will answer it
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self._set_quiesced(False)  # a new role or term ticks
        self._reset_randomized_timeout()
        self.votes = {}
        self.transferee = None
        self.pending_reads = []
        self._appends_due = {}  # owed by the old role's progress
        last = self.log.last_index()
        self.progress = {}
        for node in self.conf.members():
            progress = Progress(last + 1, is_learner=node in self.conf.learners)
            if node == self.id:
                progress.match = self.log.offset - 1  # what this node has persisted
            self.progress[node] = progress

    # ---- role changes ----------------------------------------------------------------------

    def become_follower(self, term: int, lead: str | None) -> None:
        self._touch()
        self._reset(term)
        self.role = Role.FOLLOWER
        self.lead = lead

    def _become_pre_candidate(self) -> None:
        # A pre-candidate neither raises its term nor votes: a failed pre-vote changes nothing.
        self.role = Role.PRE_CANDIDATE
        self.votes = {}
        self.lead = None

    def _become_candidate(self) -> None:
        self._reset(self.term + 1)
        self.vote = self.id
        self.role = Role.CANDIDATE

    def _become_leader(self) -> None:
        self._reset(self.term)
        self.role = Role.LEADER
        self.lead = self.id
        for node, progress in self.progress.items():
            progress.recent_active = node == self.id
        # Uncommitted configuration changes in our log count as pending.
        self.pending_conf_index = max(self.pending_confs, default=-1)
        # A no-op of our term lets entries of earlier terms commit (§5.4.2).
        self.term_start_index = self._append_entries(
            [(encode_control(EntryKind.NOOP), 1, EntryKind.NOOP)]
        )

    # ---- inputs ----------------------------------------------------------------------------

    def tick(self) -> None:
        self._touch()
        if self.quiesced:
            return
        if self.role is Role.LEADER:
            self._tick_leader()
        else:
            self._tick_election()

    def _tick_election(self) -> None:
        if self.repair_floor is not None:
            self._tick_repair()
        waiting = self.role is Role.FOLLOWER and self.lead is None  # for a first campaign
        if waiting and self.defer_ticks > 0:
            self.defer_ticks -= 1
            return
        self.election_elapsed += 1
        timeout = self.randomized_election_ticks
        if waiting and self.eager:
            timeout = min(timeout, EAGER_TICKS)
        # (as etcd: only a node that may campaign starts over; one that may not, a learner or
        # a replica under repair, lets its lease on the last leader run out, or it would
        # ignore the votes of a group that lost its leader for good)
        if self.election_elapsed >= timeout and self._promotable():
            self.election_elapsed = 0
            self._hup(transfer=False)

    def _tick_leader(self) -> None:
        self.heartbeat_elapsed += 1
        self.election_elapsed += 1
        if self.election_elapsed >= self.config.election_ticks:
            self.election_elapsed = 0
            if self.config.check_quorum and not self._check_quorum_active():
                self.become_follower(self.term, None)
                return
            if self.transferee is not None:
                self.transferee = None  # the transfer did not finish within an election timeout
        if self.heartbeat_elapsed >= self.config.heartbeat_ticks:
            self.heartbeat_elapsed = 0
            if self._may_quiesce():
                self._quiesce()
                return
            self._broadcast_heartbeat(b"")
            for node, progress in self.progress.items():
                if progress.state is ProgressState.SNAPSHOT:
                    progress.snapshot_ticks += 1
                    if progress.snapshot_ticks >= self.config.election_ticks:
                        progress.become_probe()  # the snapshot was lost: start over
                        self._append_later(node)

    def _may_quiesce(self) -> bool:
        """Leader: is the group idle? Everything committed and persisted here, every member
        the failure detector counts live holds it all, nothing in flight."""
        hooks = self.hooks
        if hooks is None or not hooks.quiesce:
            return False
        if self.transferee is not None or self.pending_reads or self.read_states:
            return False
        if self._appends_due:
            return False
        last = self.log.last_index()
        if self.log.committed != last or self.pending_conf_index > self.log.committed:
            return False
        if self.repair_floor is not None or self.log.unstable_snapshot is not None:
            return False
        for node, progress in self.progress.items():
            caught_up = progress.match == last and progress.state is not ProgressState.SNAPSHOT
            if node == self.id:
                if not caught_up:
                    return False  # not yet persisted here
            elif not caught_up and hooks.live(node):
                return False
        return True

    def _quiesce(self) -> None:
        """Send every member the quiesce request (a heartbeat marked `reject`, carrying the
        commit index and the leader's last entry) and stop ticking."""
        last, last_term = self.log.last_index(), self.log.last_term()
        for node, progress in self.progress.items():
            if node != self.id:
                commit = min(progress.match, self.log.committed)
                self._send(
                    self._msg(
                        MT.HEARTBEAT,
                        node,
                        commit=commit,
                        reject=True,
                        index=last,
                        log_term=last_term,
                    )
                )
        self._set_quiesced(True)

    def _wakes(self, m: Message) -> bool:
        """Does `m` wake this quiesced node? Everything does, but its leader's heartbeats (a
        late one, or one for a read: the leader quiesces again) and commit-only appends (a
        late one: answered only if it does not match, which wakes the leader) and, for a
        leader, late answers to heartbeats and appends that tell it nothing new. (A follower
        woken by its quiesced leader's late message would campaign: the group would go
        through an election for nothing.)"""
        if m.term != self.term:
            return True
        if self.role is not Role.LEADER:
            commit_only = m.type is MT.APPEND and m.reject and not m.entries
            return not ((m.type is MT.HEARTBEAT or commit_only) and m.src == self.lead)
        if m.reject:
            return True
        if m.type is MT.HEARTBEAT_RESP:
            return bool(m.context) or m.index > 0 or 0 <= m.commit < self.log.committed
        if m.type is MT.APPEND_RESP:
            progress = self.progress.get(m.src)
            return progress is None or m.index > progress.match
        return True

    def _check_quorum_active(self) -> bool:
        active = 0
        for node in self.conf.voters:
            progress = self.progress.get(node)
            if node == self.id or (progress is not None and progress.recent_active):
                active += 1
        for node, progress in self.progress.items():
            if node != self.id:
                progress.recent_active = False
        return active >= self._quorum()

    def _tick_repair(self) -> None:
        """Ask for what the log lost, every half election timeout: the leader, or with none
        known every other member; with no leader heard for two election timeouts, probe
        the voters (`_probe_repair`)."""
        self.unled_ticks += 1
        if self.unled_ticks >= 2 * self.config.election_ticks:
            self.unled_ticks = 0
            self._probe_repair()
        self.repair_elapsed += 1
        if self.repair_elapsed < max(1, self.config.election_ticks // 2):
            return
        self.repair_elapsed = 0
        last_index, last_term = self.log.last_index(), self.log.last_term()
        self.repair_peers |= set(self.conf.members())
        for node in (self.lead,) if self.lead is not None else sorted(self.repair_peers):
            if node != self.id:
                self._send(self._msg(MT.REPAIR, node, index=last_index, log_term=last_term))

    def _probe_repair(self) -> None:
        """No leader heard for two election timeouts while repairing: perhaps no other voter
        holds what the floor asks for. Ask every member we knew where its log ends, in the
        next term (which each adopts unless it hears a leader, as for a vote; ours follows
        with the answers): see `_lower_floor`."""
        if self.id not in self.conf.voters or len(self.conf.voters) == 1:
            return
        self.probe_term = self.term + 1
        self.probe_answers = {}
        last_index, last_term = self.log.last_index(), self.log.last_term()
        self.repair_peers |= set(self.conf.members())
        for node in sorted(self.repair_peers):
            if node != self.id:
                self._send(
                    self._msg(
                        MT.REPAIR,
                        node,
                        term=self.probe_term,
                        index=last_index,
                        log_term=last_term,
                        context=REPAIR_PROBE,
                    )
                )

    def _answer_probe(self, m: Message) -> None:
        """Where our log ends, in the probe's term (adopted in `step`), our voters committed
        and those after each change pending in our log; `reject` when we cannot vouch for
        our log: we are repairing too, or joining (perhaps created anew after a removal, by
        a stale message, with nothing of what the old replica acknowledged)."""
        log = self.log
        conf, chain = self.conf, [self.conf.voters]
        for index in sorted(self.pending_confs):
            conf = conf.apply(self.pending_confs[index])
            chain.append(conf.voters)
        self._send(
            self._msg(
                MT.REPAIR_RESP,
                m.src,
                index=log.last_index(),
                log_term=log.last_term(),
                reject=self.repair_floor is not None or self.joining,
                context=REPAIR_PROBE + b"=" + ";".join(",".join(v) for v in chain).encode(),
            )
        )

    def _lower_floor(self, m: Message) -> None:
        """An answer to our probe. Let the voter sets be ours, those each answerer has
        committed, and those after each configuration change pending in its log. Once, in
        each voter set of N voters and quorum Q, more than N - Q members other than us
        answered in the probe's term, none repairing or joining, each short of the floor,
        the floor comes down to the furthest answer: no entry past it of a term before the
        probe's is committed, or ever will be.

        Why. An entry e is committed only once a quorum of the voters in force at it (those
        the changes before it in the log make) acknowledged it in its own term
        (`_maybe_commit` counts an entry after a change with the voters on both sides of it).
        Those voters are among the sets: an entry before the furthest change an answerer has
        committed is no further than that answerer's answer; and each later change, committed
        by a quorum of the voters before it, is held by an answerer (below), which reports it
        pending. A quorum holds, besides us, at least Q - 1 others; with more than N - Q
        answerers among the N - 1 others, one answerer A acknowledged e. A did so before
        answering (from then on its term is past e's). A committed entry is never cut by a
        later leader (each holds it, by Raft's election rule and, for us, our floor, in force
        until now), and A is not repairing: so A still held e when it answered, and answered
        at least e. So e is no further than the furthest answer. Entries of the probe's term
        or later are acknowledged only by holders, as Raft's are: the floor has nothing to
        keep for them."""
        floor = self.repair_floor
        if floor is None or m.term != self.probe_term or m.reject:
            return
        position = (m.index, m.log_term)
        if up_to_date_order(position) >= up_to_date_order(floor):
            return  # it may lead, and repair us as Raft does
        answered = m.context[len(REPAIR_PROBE) + 1 :].decode(errors="replace")
        chain = [tuple(voters.split(",")) for voters in answered.split(";") if voters]
        self.probe_answers[m.src] = (position, chain)
        voter_sets = {self.conf.voters}
        for _, answered_chain in self.probe_answers.values():
            voter_sets.update(answered_chain)
        for voters in voter_sets:
            others = sum(1 for node in voters if node != self.id and node in self.probe_answers)
            if others <= len(voters) - quorum(len(voters)):
                return
        self.repair_floor = max(
            (answer for answer, _ in self.probe_answers.values()), key=up_to_date_order
        )
        self._maybe_repaired()

    def _promotable(self) -> bool:
        # a repairing node may not lead, unless it is the only voter (nobody to repair from)
        repaired = self.repair_floor is None or self.conf.voters == (self.id,)
        joined = not self.joining
        return self.is_voter and self.log.unstable_snapshot is None and repaired and joined

    def _hup(self, *, transfer: bool) -> None:
        if self.role is Role.LEADER:
            return
        if self.config.pre_vote and not transfer:
            self._campaign(MT.PRE_VOTE)
        else:
            self._campaign(MT.VOTE, transfer=transfer)

    def _campaign(self, kind: MessageType, *, transfer: bool = False) -> None:
        if kind is MT.PRE_VOTE:
            self._become_pre_candidate()
            term = self.term + 1
        else:
            self._become_candidate()
            term = self.term
        if self._poll(self.id, granted=True) >= self._quorum():
            self._won(kind)
            return
        last_index, last_term = self.log.last_index(), self.log.last_term()
        context = CAMPAIGN_TRANSFER if transfer else b""
        for node in self.conf.voters:
            if node != self.id:
                self._send(
                    self._msg(
                        kind, node, term=term, index=last_index, log_term=last_term, context=context
                    )
                )

    def _poll(self, node: str, *, granted: bool) -> int:
        if node in self.conf.voters:  # learners and strangers have no vote
            self.votes.setdefault(node, granted)
        return sum(1 for v in self.votes.values() if v)

    def _won(self, kind: MessageType) -> None:
        if kind is MT.PRE_VOTE:
            self._campaign(MT.VOTE)
        else:
            self._become_leader()
            self._broadcast_append()  # announce ourselves with the no-op at once

    def step(self, m: Message) -> None:
        self._touch()
        if self.quiesced and self._wakes(m):
            self.wake(ping=m.src != self.lead)
        probe = m.type is MT.REPAIR and m.context == REPAIR_PROBE
        if m.term > self.term:
            if m.type in (MT.VOTE, MT.PRE_VOTE) or probe:
                in_lease = (
                    self.config.check_quorum
                    and self.lead is not None
                    and self.election_elapsed < self.config.election_ticks
                )
                if in_lease and m.context != CAMPAIGN_TRANSFER:
                    return  # vote stickiness: a leader is heard; ignore the disruption
            if m.type is MT.PRE_VOTE:
                pass  # a pre-vote never changes our term
            elif m.type is MT.PRE_VOTE_RESP and not m.reject:
                pass  # granted pre-votes carry the future term; ours stays until we campaign
            elif m.type in (MT.APPEND, MT.HEARTBEAT, MT.SNAPSHOT):
                self.become_follower(m.term, m.src)
            else:
                self.become_follower(m.term, None)
        elif m.term < self.term:
            if m.type in (MT.APPEND, MT.HEARTBEAT) and (
                self.config.check_quorum or self.config.pre_vote
            ):
                # A stale leader, perhaps cut off while we moved on: tell it our term.
                self._send(self._msg(MT.APPEND_RESP, m.src))
            elif m.type is MT.PRE_VOTE:
                self._send(self._msg(MT.PRE_VOTE_RESP, m.src, reject=True))
            elif probe:
                self._send(self._msg(MT.REPAIR_RESP, m.src))  # our term, for its next probe
            return

        if m.type in (MT.VOTE, MT.PRE_VOTE):
            self._handle_vote_request(m)
            return
        if m.type is MT.REPAIR:
            self._handle_repair(m)
            return
        if m.type is MT.REPAIR_RESP:
            self._handle_repair_response(m)
            return
        if self.role is Role.LEADER:
            self._step_leader(m)
        elif self.role in (Role.CANDIDATE, Role.PRE_CANDIDATE):
            self._step_candidate(m)
        else:
            self._step_follower(m)

    def _handle_vote_request(self, m: Message) -> None:
        can_vote = (
            self.vote == m.src
            or (self.vote is None and self.lead is None)
            or (m.type is MT.PRE_VOTE and m.term > self.term)
        )
        response = MT.VOTE_RESP if m.type is MT.VOTE else MT.PRE_VOTE_RESP
        if can_vote and not self.joining and self._up_to_date(m.index, m.log_term):
            # Granted responses carry the request's term (for pre-votes, the future term).
            self._send(self._msg(response, m.src, term=m.term))
            if m.type is MT.VOTE:
                self.election_elapsed = 0
                self.vote = m.src
        else:
            self._send(self._msg(response, m.src, reject=True))

    def _up_to_date(self, last_index: int, last_term: int) -> bool:
        """Is a candidate whose log ends at (last_index, last_term) at least as up to date as
        our log, and as the log we had before a repair cut it (§5.4.1)?"""
        if not self.log.is_up_to_date(last_index, last_term):
            return False
        floor = self.repair_floor
        if floor is None:
            return True
        floor_index, floor_term = floor
        return last_term > floor_term or (last_term == floor_term and last_index >= floor_index)

    def _maybe_repaired(self) -> None:
        """Leave the repair once the log is at least as up to date as the floor again, and
        stop joining once it holds an entry some leader wrote (every leader's first entry is
        a no-op of its term, >= 1)."""
        if self.joining and self.log.last_term() > 0:
            self.joining = False
        floor = self.repair_floor
        if floor is None:
            return
        last_term = self.log.last_term()
        if last_term > floor[1] or (last_term == floor[1] and self.log.last_index() >= floor[0]):
            self.repair_floor = None

    def _handle_repair(self, m: Message) -> None:
        """A member repairing its log says where it ends. The leader sends the rest again
        (no longer counting what was lost); another member sends what its own log holds
        after that point, if it holds the same entry there."""
        log = self.log
        if self.role is Role.LEADER:
            progress = self.progress.get(m.src)
            if progress is not None and progress.match > m.index:
                progress.match = m.index
                progress.become_probe()
            if progress is not None:
                self._append_later(m.src)
            return
        if m.context == REPAIR_PROBE:
            self._answer_probe(m)
            return
        if m.index >= log.last_index():
            return
        if m.index < log.first_index() - 1:
            # what it lacks is compacted here: our snapshot (committed state) instead
            snapshot = log.storage.snapshot()
            self._send(self._msg(MT.REPAIR_RESP, m.src, index=m.index, snapshot=snapshot))
            return
        if not log.match_term(m.index, m.log_term):
            return
        try:
            entries = log.entries(m.index + 1, self.config.max_append_bytes)
        except StorageUnavailable:
            return
        self._send(
            self._msg(
                MT.REPAIR_RESP,
                m.src,
                index=m.index,
                log_term=m.log_term,
                entries=tuple(entries),
                commit=log.committed,
            )
        )

    def _handle_repair_response(self, m: Message) -> None:
        """Entries another member holds after the end of our repairing log: appended where
        they match it, as a leader's would be, and committed as far as that member knows
        them committed (so that configuration changes among them take effect: a node that
        was removed meanwhile learns it and does not campaign)."""
        log = self.log
        if m.context.startswith(REPAIR_PROBE):
            self._lower_floor(m)
            return
        if self.repair_floor is None:
            return
        if m.snapshot is not None:
            if m.snapshot.index > log.committed and not log.match_term(
                m.snapshot.index, m.snapshot.term
            ):
                self._restore(m.snapshot)
            return
        if not m.entries or not log.match_term(m.index, m.log_term):
            return
        position = log.find_conflict(m.entries)
        if position is not None:
            first_new = m.entries[position].index
            if first_new <= log.committed:
                return
            for index in [i for i in self.pending_confs if i >= first_new]:
                del self.pending_confs[index]
            log.append(m.entries[position:])
            self._note_confs(m.entries[position:])
        self._commit_to(min(m.commit, m.entries[-1].last_index))
        self._maybe_repaired()

    def _step_candidate(self, m: Message) -> None:
        expected = MT.PRE_VOTE_RESP if self.role is Role.PRE_CANDIDATE else MT.VOTE_RESP
        if m.type in (MT.APPEND, MT.HEARTBEAT, MT.SNAPSHOT):
            # A leader of our term exists (§5.2): follow it.
            self.become_follower(m.term, m.src)
            self._step_follower(m)
        elif m.type is expected:
            granted = self._poll(m.src, granted=not m.reject)
            rejected = len(self.votes) - granted
            if granted >= self._quorum():
                self._won(MT.PRE_VOTE if self.role is Role.PRE_CANDIDATE else MT.VOTE)
            elif rejected >= self._quorum():
                self.become_follower(self.term, None)

    def _step_follower(self, m: Message) -> None:
        if m.type in (MT.APPEND, MT.HEARTBEAT, MT.SNAPSHOT):
            self.defer_ticks = self.unled_ticks = 0  # a leader is heard
        if m.type is MT.APPEND:
            self.election_elapsed = 0
            self.lead = m.src
            self._handle_append(m)
        elif m.type is MT.HEARTBEAT:
            self.election_elapsed = 0
            self.lead = m.src
            self._commit_to(min(m.commit, self.log.last_index()))
            if m.reject:  # the leader quiesces: follow it if we hold its log, or say we do not
                hooks = self.hooks
                quiet = hooks is not None and hooks.quiesce and self.repair_floor is None
                if quiet and self.log.match_term(m.index, m.log_term):
                    self._set_quiesced(True)
                    return
            self._send(self._msg(MT.HEARTBEAT_RESP, m.src, context=m.context, reject=m.reject))
        elif m.type is MT.SNAPSHOT:
            self.election_elapsed = 0
            self.lead = m.src
            self._handle_snapshot(m)
        elif m.type is MT.TIMEOUT_NOW:
            if self._promotable():
                self._hup(transfer=True)
        elif m.type is MT.READ_INDEX_RESP:
            if m.context == COMMIT_TOLD:
                if self.commit_asked and m.reject_hint == self._asks:
                    self.commit_told = max(self.commit_told, m.index)
                    self._commit_heard()
            else:
                self.read_states.append((m.context, m.index))

    def _handle_append(self, m: Message) -> None:
        log = self.log
        if m.index < log.committed:
            self._send(self._msg(MT.APPEND_RESP, m.src, index=log.committed))
            return
        if not log.match_term(m.index, m.log_term):
            hint = log.conflict_hint(m.index, m.log_term)
            hint_term = log.term(hint) or 0
            self._send(
                self._msg(
                    MT.APPEND_RESP,
                    m.src,
                    index=m.index,
                    reject=True,
                    reject_hint=hint,
                    log_term=hint_term,
                )
            )
            return
        last_new = m.entries[-1].last_index if m.entries else m.index
        position = log.find_conflict(m.entries)
        if position is not None:
            first_new = m.entries[position].index
            assert first_new > log.committed, "an append conflicts with a committed entry"
            for index in [i for i in self.pending_confs if i >= first_new]:
                del self.pending_confs[index]
            log.append(m.entries[position:])
            self._note_confs(m.entries[position:])
        self._commit_to(min(m.commit, last_new))
        self._maybe_repaired()
        if m.reject and not m.entries:
            return  # a commit-only append that asks for no answer (`_send_append`)
        self._send(self._msg(MT.APPEND_RESP, m.src, index=last_new))

    def _handle_snapshot(self, m: Message) -> None:
        snapshot = m.snapshot
        assert snapshot is not None
        if snapshot.index <= self.log.committed:
            self._send(self._msg(MT.APPEND_RESP, m.src, index=self.log.committed))
            return
        if self.log.match_term(snapshot.index, snapshot.term):
            # We hold the snapshot's last entry, so its whole prefix (log matching): keep the
            # log, entries after it included, which we may already have acknowledged (§7).
            self._commit_to(snapshot.index)
            self._send(self._msg(MT.APPEND_RESP, m.src, index=self.log.committed))
            return
        self._restore(snapshot)
        self._send(self._msg(MT.APPEND_RESP, m.src, index=snapshot.index))

    def _restore(self, snapshot: Snapshot) -> None:
        """Start the log over at a snapshot (committed state, from the leader or, repairing,
        from any member)."""
        self.log.restore(snapshot)
        self.conf = snapshot.conf
        self.pending_confs = {}
        self._applied_commit = snapshot.index
        self._reset_progress_after_conf()
        self._maybe_repaired()

    # ---- leader ----------------------------------------------------------------------------

    def _step_leader(self, m: Message) -> None:
        progress = self.progress.get(m.src)
        if m.type is MT.READ_INDEX:
            self._start_read(m.context, m.src)
            return
        if progress is None:
            return
        if m.type is MT.APPEND_RESP:
            progress.recent_active = True
            progress.commit_notices = m.commit != NO_COMMIT_NOTICES
            if m.reject:
                hint = m.reject_hint
                if m.log_term > 0:
                    hint = self.log.conflict_hint(hint, m.log_term)
                # Retry from the start of our entry holding the hint: always a boundary.
                first = self.log.first_index()
                hint_next = self.log.batch_start(hint) if hint >= first else first
                if progress.maybe_decrease_to(m.index, hint_next):
                    if progress.state is ProgressState.REPLICATE:
                        progress.become_probe()
                    self._append_later(m.src)
                return
            if progress.maybe_update(m.index):
                if progress.state is ProgressState.PROBE:
                    progress.become_replicate()
                elif (
                    progress.state is ProgressState.SNAPSHOT
                    and progress.match >= progress.pending_snapshot
                ):
                    progress.become_probe()
                    progress.become_replicate()
                conf = self.conf
                if self._maybe_commit():
                    self._announce_commit(everyone=self.conf is not conf)
                elif progress.match < self.log.last_index():
                    self._append_later(m.src)
                if m.src == self.transferee and progress.match == self.log.last_index():
                    self._send(self._msg(MT.TIMEOUT_NOW, m.src))
            elif progress.state is ProgressState.REPLICATE:
                # the window moved: keep the pipeline full
                self._append_later(m.src, if_empty=False)
        elif m.type is MT.HEARTBEAT_RESP:
            progress.recent_active = True
            progress.commit_notices = m.commit != NO_COMMIT_NOTICES
            progress.probe_sent = False
            if (
                progress.state is ProgressState.REPLICATE
                and len(progress.inflight) >= self.config.max_inflight_appends
            ):
                progress.inflight.popleft()  # an append may be lost: let one more through
            if progress.match < self.log.last_index() or 0 <= m.commit < self.log.committed:
                self._append_later(m.src)
            if m.index > 0:  # an ask: tell the commit index at once
                told = self._msg(
                    MT.READ_INDEX_RESP,
                    m.src,
                    index=self.log.committed,
                    reject_hint=m.index,
                    context=COMMIT_TOLD,
                )
                self._send(told)
            if m.context:
                self._ack_read(m.context, m.src)

    def _append_entries(self, items: list[tuple[bytes, int, EntryKind]]) -> int:
        """Append (data, count, kind) entries to our log; returns the first new index."""
        first = self.log.last_index() + 1
        index = first
        entries = []
        for data, count, kind in items:
            entries.append(Entry(index, count, self.term, data, kind))
            index += count
        self.log.append(entries)
        self._note_confs(entries)
        return first

    def _note_confs(self, entries: list[Entry] | tuple[Entry, ...]) -> None:
        for entry in entries:
            if entry.kind is EntryKind.CONF:
                self.pending_confs[entry.index] = _conf_of(entry)

    def propose(self, data: bytes, count: int) -> int:
        """Propose one batch of `count` records; returns its base index (leader only)."""
        self.wake()
        if self.role is not Role.LEADER:
            raise ProposalDropped(f"not the leader (leader: {self.lead})")
        if self.transferee is not None:
            raise ProposalDropped(f"leadership is moving to {self.transferee}")
        index = self._append_entries([(data, count, EntryKind.NORMAL)])
        self._broadcast_append()
        return index

    def caught_up(self, node: str, lag_indexes: int) -> bool:
        """Leader only: has `node` acknowledged this leader's own entries (at least its term's
        no-op), and is it within `lag_indexes` of our log? A member that never answered has
        not, however short the log: promoting it (or counting it in sync) would count a
        member that may not even host the group yet, and a group whose majority is such
        members has no leader again."""
        if node == self.id:
            return True
        progress = self.progress.get(node)
        if progress is None:
            return False
        floor = max(self.term_start_index, self.log.last_index() - lag_indexes)
        return progress.match >= floor

    def propose_conf_change(self, change: ConfChange) -> int:
        self.wake()
        if self.role is not Role.LEADER:
            raise ProposalDropped(f"not the leader (leader: {self.lead})")
        if self.transferee is not None:
            raise ProposalDropped(f"leadership is moving to {self.transferee}")
        if self.pending_conf_index > self.log.committed:
            raise ProposalDropped("a configuration change is already pending")
        if self.log.term(self.log.committed) != self.term:
            raise ProposalDropped("the leader has not yet committed an entry of its term")
        if change.kind is ConfChangeKind.PROMOTE:
            progress = self.progress.get(change.node)
            if change.node not in self.conf.learners or progress is None:
                raise ProposalDropped(f"{change.node} is not a learner")
            if not self.caught_up(change.node, self.config.promote_lag_indexes):
                raise ProposalDropped(f"learner {change.node} has not caught up")
        if change.kind is ConfChangeKind.REMOVE and change.node not in self.conf.members():
            raise ProposalDropped(f"{change.node} is not a member")
        if change.kind is ConfChangeKind.REMOVE and self.conf.voters == (change.node,):
            raise ProposalDropped("cannot remove the last voter")
        index = self._append_entries([(encode_control(EntryKind.CONF, change), 1, EntryKind.CONF)])
        self.pending_conf_index = index
        self._broadcast_append()
        return index

    def transfer_leadership(self, to: str) -> None:
        self.wake()
        if self.role is not Role.LEADER:
            raise ProposalDropped(f"not the leader (leader: {self.lead})")
        if to == self.id or to not in self.conf.voters:
            raise ProposalDropped(f"{to} is not another voter")
        self.transferee = to
        self.election_elapsed = 0
        if self.progress[to].match == self.log.last_index():
            self._send(self._msg(MT.TIMEOUT_NOW, to))
        else:
            self._append_later(to)

    def defer_election(self, ticks: int) -> None:
        """While it knows no leader, start no election for `ticks` ticks (another member,
        `eager`, should win first). Only a delay: safe at any time."""
        self.defer_ticks = max(self.defer_ticks, ticks)

    def campaign(self) -> None:
        """Start an election now (with a pre-vote first if configured), as a timeout would."""
        self.wake()
        if self._promotable():
            self._hup(transfer=False)

    def read_index(self, context: bytes) -> None:
        """Ask for a linearizable read point; it arrives in Ready.read_states as
        (context, index): serve the read once `index` is applied. `context` must be unique
        among reads in flight and not empty. A forwarded request may be lost like any
        message: the caller retries after a timeout."""
        if not context:
            raise ValueError("read_index needs a non-empty context")
        self.wake()
        if self.role is Role.LEADER:
            if self.log.term(self.log.committed) != self.term:
                raise ProposalDropped("the leader has not yet committed an entry of its term")
            self._start_read(context, self.id)
        elif self.lead is not None:
            self._send(self._msg(MT.READ_INDEX, self.lead, context=context))
        else:
            raise ProposalDropped("no leader known")

    def _start_read(self, context: bytes, requester: str) -> None:
        if self.log.term(self.log.committed) != self.term:
            return  # not yet sure of the commit index: the requester retries
        if self._quorum() == 1:
            self._read_ready(context, self.log.committed, requester)
            return
        self.pending_reads.append((context, self.log.committed, {self.id}, requester))
        self._broadcast_heartbeat(context)

    def _ack_read(self, context: bytes, node: str) -> None:
        """A heartbeat round sent for `context` reached `node`: that confirms our leadership
        at the time of that read and of every read queued before it, never of later ones."""
        contexts = [ctx for ctx, _, _, _ in self.pending_reads]
        if context not in contexts or node not in self.conf.voters:
            return  # a late response for a read already served, or from a non-voter
        upto = contexts.index(context)
        _, _, acks, _ = self.pending_reads[upto]
        acks.add(node)
        if len(acks) < self._quorum():
            return
        served, self.pending_reads = self.pending_reads[: upto + 1], self.pending_reads[upto + 1 :]
        for ctx, index, _, requester in served:
            self._read_ready(ctx, index, requester)

    def _read_ready(self, context: bytes, index: int, requester: str) -> None:
        if requester == self.id:
            self.read_states.append((context, index))
        else:
            self._send(self._msg(MT.READ_INDEX_RESP, requester, index=index, context=context))

    def _maybe_commit(self) -> bool:
        # An entry after a configuration change in the log commits once a quorum of the
        # voters before it and of those after it hold it (so a commit that crosses a change
        # never rests on voters it removed alone, as `_lower_floor` needs).
        conf = self.conf
        quorum_index = self._quorum_match(conf.voters)
        for index in sorted(self.pending_confs):
            if index >= quorum_index:
                break
            conf = conf.apply(self.pending_confs[index])
            quorum_index = max(index, min(quorum_index, self._quorum_match(conf.voters)))
        # Only entries of the current term commit by counting replicas (§5.4.2).
        if quorum_index > self.log.committed and self.log.term(quorum_index) == self.term:
            return self._commit_to(quorum_index)
        return False

    def _quorum_match(self, voters: tuple[str, ...]) -> int:
        """The highest index that a quorum of `voters` holds."""
        progress = self.progress
        matches = sorted((progress[n].match if n in progress else -1 for n in voters), reverse=True)
        return matches[len(voters) // 2] if matches else -1

    def _commit_to(self, index: int) -> bool:
        if not self.log.commit_to(index):
            return False
        self._apply_committed_confs()
        return True

    def _apply_committed_confs(self) -> None:
        changed = False
        for index in sorted(i for i in self.pending_confs if i <= self.log.committed):
            self.conf = self.conf.apply(self.pending_confs.pop(index))
            changed = True
        if changed:
            self._reset_progress_after_conf()

    def _reset_progress_after_conf(self) -> None:
        last = self.log.last_index()
        for node in self.conf.members():
            if node not in self.progress:
                self.progress[node] = Progress(last + 1)
            self.progress[node].is_learner = node in self.conf.learners
        for node in [n for n in self.progress if n not in self.conf.members()]:
            del self.progress[node]
        if self.role is Role.LEADER and self.id not in self.conf.voters:
            # removed (or demoted): step down, with a last heartbeat that tells each member
            # the commit index. A member not told this change's commit (or, told lazily, the
            # commits of changes before it) counts the voters it knew: holding the longest
            # log, it may be one that no voter it counts can outvote, and no voter in its
            # own view (node simulation with workers and transactions, seed 56).
            self._broadcast_heartbeat(b"")
            self.become_follower(self.term, None)
        elif self.role is Role.LEADER:
            if self.transferee is not None and self.transferee not in self.conf.voters:
                self.transferee = None
            if self._maybe_commit():
                self._broadcast_append()

    def _announce_commit(self, *, everyone: bool) -> None:
        """An answer moved the commit index: owe an append to each follower that wants commit
        notices, and to the others only entries they lack ("Commit notices on demand"), but
        to `everyone` when the commit took a configuration change (which members campaign,
        and whose votes count, follows from what each knows committed)."""
        if self.role is not Role.LEADER:
            return
        for node, progress in self.progress.items():
            if node != self.id:
                self._append_later(node, if_empty=everyone or progress.commit_notices)

    def _broadcast_append(self) -> None:
        if self.role is not Role.LEADER:
            return  # e.g. a leader that just committed its own removal
        for node in self.progress:
            if node != self.id:
                self._append_later(node)

    def _append_later(self, to: str, *, if_empty: bool = True) -> None:
        """Owe `to` an append, sent at the next `ready()` (`_send_due_appends`): what a step,
        a tick or a proposal asks for, however many times, goes out as one message (or as few
        as `max_append_bytes` allows). `if_empty=False` owes one only if entries are unsent."""
        due = self._appends_due
        due[to] = due.get(to, False) or if_empty  # (its input touched the group already)

    def _send_due_appends(self) -> None:
        """Send the appends owed (`_append_later`): each follower's unsent entries, up to its
        window, or an empty append if one was owed and none had entries."""
        due, self._appends_due = self._appends_due, {}
        if self.role is not Role.LEADER:
            return  # stepped down since: a new leader starts its followers afresh
        window = self.config.max_inflight_appends
        last = self.log.last_index()
        for node, if_empty in due.items():
            progress = self.progress.get(node)
            if progress is None:
                continue  # removed since
            self._send_append(node, send_if_empty=if_empty)
            while (
                progress.state is ProgressState.REPLICATE
                and progress.next <= last
                and not progress.is_paused(window)
            ):
                sent_to = progress.next
                self._send_append(node, send_if_empty=False)
                if progress.next == sent_to:
                    break  # nothing went (a snapshot is due, or the log is damaged there)

    def _broadcast_heartbeat(self, context: bytes) -> None:
        for node, progress in self.progress.items():
            if node != self.id:
                commit = min(progress.match, self.log.committed)
                self._send(self._msg(MT.HEARTBEAT, node, commit=commit, context=context))

    def _send_append(self, to: str, *, send_if_empty: bool = True) -> None:
        """Send `to` the entries from its next index. An empty append still carries the
        commit index and, if an earlier append was lost, draws the rejection that makes
        us resend; only a pipeline refill (`send_if_empty=False`) skips it."""
        progress = self.progress[to]
        if progress.is_paused(self.config.max_inflight_appends):
            return
        log = self.log
        prev_index = progress.next - 1
        prev_term = log.term(prev_index)
        if prev_term is None or progress.next < log.first_index():
            self._send_snapshot(to, progress)
            return
        if progress.next > log.last_index():
            entries: list[Entry] = []
        else:
            try:
                entries = log.entries(progress.next, self.config.max_append_bytes)
            except StorageUnavailable:
                return  # damaged on disk (the caller repairs the log) or just compacted
        if not entries and not send_if_empty:
            return
        # An empty append to a follower known to hold our whole log carries only the commit
        # index: it asks for no answer (`reject`, unused on appends, as a heartbeat's marks
        # quiescence), which would tell nothing new. A follower whose log does not match
        # answers anyway (a rejection), and one that predates the flag ignores it.
        quiet = (
            not entries
            and progress.state is ProgressState.REPLICATE
            and progress.match == prev_index
        )
        self._send(
            self._msg(
                MT.APPEND,
                to,
                index=prev_index,
                log_term=prev_term,
                entries=tuple(entries),
                commit=log.committed,
                reject=quiet,
            )
        )
        if not quiet:  # (no answer will free a window slot)
            progress.sent(entries[-1].last_index if entries else prev_index)

    def _send_snapshot(self, to: str, progress: Progress) -> None:
        if not progress.recent_active:
            return  # do not ship a snapshot to a node that may be down
        snapshot = self.log.storage.snapshot()
        self._send(self._msg(MT.SNAPSHOT, to, snapshot=snapshot))
        progress.become_snapshot(snapshot.index)

    # ---- output ----------------------------------------------------------------------------

    def hard_state(self) -> HardState:
        return HardState(
            self.term, self.vote, self.log.committed, self.conf, self.repair_floor, self.joining
        )

    def has_ready(self) -> bool:
        prev = self._prev_hard
        return bool(
            self.msgs
            or self._appends_due
            or self.log.unstable
            or self.log.unstable_snapshot
            or self.log.committed > self._applied_commit
            or self.read_states
            or self.term != prev.term
            or self.vote != prev.vote
            or self.log.committed != prev.commit
            or self.conf != prev.conf
            or self.repair_floor != prev.repair_floor
            or self.joining != prev.joining
        )

    def ready(self) -> Ready:
        if self._appends_due:
            self._send_due_appends()
        hard_state = self.hard_state()
        ready = Ready(
            hard_state=hard_state if hard_state != self._prev_hard else None,
            entries=list(self.log.unstable),
            snapshot=self.log.unstable_snapshot,
            messages=self.msgs,
            read_states=self.read_states,
        )
        if self.log.committed > self._applied_commit:
            ready.committed = (self._applied_commit + 1, self.log.committed)
        self.msgs = []
        self.read_states = []
        return ready

    def advance(self, ready: Ready) -> None:
        """The caller persisted `ready` (and sent its messages)."""
        self._touch()
        if ready.hard_state is not None:
            self._prev_hard = ready.hard_state
        if ready.snapshot is not None:
            self.log.snapshot_persisted(ready.snapshot)
        if ready.committed is not None:
            self._applied_commit = max(self._applied_commit, ready.committed[1])
        if ready.entries:
            last = ready.entries[-1]
            self.log.stable_to(last.last_index, last.term)
        self._persisted_changed()

    def _persisted_changed(self) -> None:
        """A leader counts its own log only once persisted; that may commit entries."""
        if self.role is Role.LEADER:
            own = self.progress.get(self.id)
            persisted = own is not None and own.maybe_update(self.log.offset - 1)
            if persisted and self._maybe_commit():
                self._broadcast_append()


def _conf_of(entry: Entry) -> ConfChange:
    (record,) = decode_batch(entry.data)
    assert record.value is not None
    return decode_conf_change(record.value)


def scan_pending_confs(storage: RaftStorage, after: int) -> dict[int, ConfChange]:
    """Configuration entries stored after index `after` (the last commit): needed to reopen."""
    return {
        entry.index: _conf_of(entry)
        for entry in stored_entries(storage, after + 1, storage.last_index())
        if entry.kind is EntryKind.CONF
    }
