"""The sans-I/O SWIM core: failure detection, suspicion and dissemination for one node.

Inputs are datagrams (`receive`) and the passage of time (`tick`); outputs are datagrams to
send (`outbox`) and membership events (`events`). The core never touches a socket or a clock,
takes all randomness from the `random.Random` it is given, and iterates in sorted order, so
a simulation replays exactly. Time comes in twice: `now_ms`, a monotonic clock for the
timers, and `wall_ms`, the wall clock (ms since the Unix epoch) that datagrams are stamped
with and checked against; a simulation passes its one virtual clock as both.

Every datagram carries, under its MAC, the sender's gossip address, a timestamp and a nonce.
One is dropped if its declared sender is not where it came from (`wrong_sender`; a declared
host name is checked through the driver's `check_host`, `unverified_sender` until it knows),
if its timestamp is more than `max_clock_skew_ms` away from our wall clock (`stale`), or if
the same sender's same timestamp and nonce were accepted before (`replay`): so a datagram
recorded on the network and sent again, from elsewhere or from the same place, is never
answered (docs/security.md, "Peer traffic").

Protocol (SWIM with memberlist's and Lifeguard's refinements):

* Every probe interval, ping the next member of a shuffled round-robin order. No ack within
  the probe timeout: ask `indirect_checks` random members to ping it (ping-req); they answer
  with the target's ack, or a nack if none came. No ack by the end of the interval: suspect.
* A suspicion becomes a death after a timeout that starts at the maximum and shrinks towards
  the minimum as other members independently suspect the same member. Only the member
  itself can refute, by raising its incarnation number.
* Every update (alive, suspect, dead, left) is piggybacked on outgoing messages and gossiped,
  at most `retransmit_limit` times per node.
* Lifeguard: missed acks/nacks and refutations raise a local health score that stretches the
  probe interval and timeout; a ping to a suspect member carries the suspicion (buddy system).
* Epochs: an update about a newer epoch of a member id replaces everything known about the
  older one; updates about older epochs are ignored.
* Join, anti-entropy and partition healing use sync (push-pull of the whole member table):
  with the seeds while no other member is alive, with a random alive member every
  push-pull interval, with a random dead member every reconnect interval, and with any
  member that pings us without our knowing it (gossip missed its announcement).
* Beyond memberlist: a stale accusation of us (an older incarnation) is answered by
  repeating our current alive update, so the accuser does not declare us dead on its own.
* Beyond memberlist: a member that left is remembered until it comes back (dead members
  are forgotten after `dead_member_retention_ms`), and a push-pull teaches it to nodes that
  started after it left: the broker's placement keeps a departed broker's replicas where
  they are while it is away (`laminar.node.core.counts_for_placement`).

Precedence for one member and epoch: a higher incarnation wins; at the same incarnation
LEFT > DEAD > SUSPECT > ALIVE, except that nothing but a higher-incarnation ALIVE (which only
the member itself issues) ends a DEAD or LEFT state.
"""

from __future__ import annotations

import heapq
import random
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from .address import HostCheck, sender_matches
from .awareness import Awareness
from .broadcast import BroadcastQueue
from .codec import (
    MAX_UPDATES_PER_DATAGRAM,
    Codec,
    Rejection,
    Stamp,
    encode_sync_entry,
    encode_update,
)
from .config import (
    SwimConfig,
    expected_confirmations,
    push_pull_interval_ms,
    retransmit_limit,
    suspicion_timeouts_ms,
)
from .member import (
    MAX_INCARNATION,
    EventKind,
    Member,
    MembershipEvent,
    MemberState,
    MemberStatus,
    member_problem,
)
from .messages import (
    Ack,
    Alive,
    Datagram,
    Dead,
    Gossip,
    Left,
    Message,
    MessageKind,
    Nack,
    Ping,
    PingReq,
    Suspect,
    Sync,
    Update,
)
from .suspicion import Suspicion

#: A relay nacks after this fraction of its probe timeout, so that the nack reaches the
#: requester before the requester's probe interval ends (Lifeguard).
NACK_TIMEOUT_FRACTION = 0.8
SEQ_MASK = 0xFFFF_FFFF

ALIVE, SUSPECT, DEAD, LEFT = (
    MemberStatus.ALIVE,
    MemberStatus.SUSPECT,
    MemberStatus.DEAD,
    MemberStatus.LEFT,
)
_LIVE = (ALIVE, SUSPECT)

#: Reasons (besides the codec's `Rejection`s) for which the core drops a message or update.
DROP_WRONG_TARGET = "wrong_target"  # a ping for another member id or a newer run of us
DROP_LATE_ACK = "late_ack"  # an ack (or nack) for no probe or relay in flight
DROP_LATE_NACK = "late_nack"
DROP_RELAY_FULL = "relay_full"  # max_pending_relays ping-reqs already in flight
DROP_MEMBERS_FULL = "members_full"  # a newcomer while the table holds max_members live ones
DROP_SUPERSEDED = "superseded"  # an update about a newer epoch of ourselves
DROP_EVENT_OVERFLOW = "event_overflow"  # an event pushed out unread by max_pending_events
DROP_WRONG_SENDER = "wrong_sender"  # the declared sender is not the source address
DROP_UNVERIFIED_SENDER = "unverified_sender"  # a declared host name not resolved yet
DROP_STALE = "stale"  # timestamp further than max_clock_skew_ms from our wall clock
DROP_REPLAY = "replay"  # this sender's timestamp and nonce were accepted before


@dataclass(slots=True)
class _Node:
    member: Member
    status: MemberStatus
    incarnation: int
    changed_ms: int

    def state(self) -> MemberState:
        return MemberState(self.member, self.status, self.incarnation)


@dataclass(slots=True)
class _Probe:
    target: str
    epoch: int
    incarnation: int  # the target's incarnation when the probe started
    seq: int
    indirect_at_ms: int  # no ack by then: send ping-reqs
    deadline_ms: int  # no ack by then: suspect
    indirect_sent: bool = False
    expected_nacks: int = 0
    nacks: int = 0


@dataclass(slots=True)
class _Relay:
    requester_addr: str
    requester_seq: int
    nack_at_ms: int


@dataclass(slots=True)
class _Seen:
    """One sender's (timestamp, nonce) pairs accepted within the window, and a floor: every
    timestamp at or below it may have been accepted and forgotten, so it is refused."""

    floor_ms: int
    heap: list[tuple[int, int]] = field(default_factory=list)
    pairs: set[tuple[int, int]] = field(default_factory=set)

    def forget(self) -> None:
        pair = heapq.heappop(self.heap)
        self.pairs.discard(pair)
        self.floor_ms = max(self.floor_ms, pair[0])


class ReplayCache:
    """The datagrams accepted within the clock-skew window, per sender address, bounded:
    `per_sender` pairs per sender (beyond it the oldest is forgotten and the floor rises to
    it) and `max_senders` senders (the least recently heard is forgotten, and the floor of
    every sender first heard after that rises to its highest timestamp). Forgetting never
    lets a replay through; it can only refuse a genuine datagram that arrives after newer
    ones of its sender filled the cache."""

    def __init__(self, window_ms: int, per_sender: int, max_senders: int) -> None:
        self._window_ms = window_ms
        self._per_sender = per_sender
        self._max_senders = max_senders
        self._senders: OrderedDict[str, _Seen] = OrderedDict()
        self._floor_ms = -1  # for senders not tracked

    def accept(self, sender: str, timestamp_ms: int, nonce: int, wall_ms: int) -> bool:
        """Record the pair and return True, or False if it may have been accepted before."""
        seen = self._senders.get(sender)
        if seen is None:
            seen = _Seen(self._floor_ms)
            self._senders[sender] = seen
            while len(self._senders) > self._max_senders:
                _, gone = self._senders.popitem(last=False)
                highest = max((pair[0] for pair in gone.heap), default=gone.floor_ms)
                self._floor_ms = max(self._floor_ms, gone.floor_ms, highest)
        else:
            self._senders.move_to_end(sender)
        while seen.heap and seen.heap[0][0] < wall_ms - self._window_ms:
            seen.forget()
        pair = (timestamp_ms, nonce)
        if timestamp_ms <= seen.floor_ms or pair in seen.pairs:
            return False
        heapq.heappush(seen.heap, pair)
        seen.pairs.add(pair)
        if len(seen.heap) > self._per_sender:
            seen.forget()
        return True

    def __len__(self) -> int:
        return sum(len(seen.heap) for seen in self._senders.values())


class Swim:
    """One node's SWIM state machine."""

    def __init__(
        self,
        config: SwimConfig,
        me: Member,
        seeds: Sequence[str],
        rng: random.Random,
        cluster_id: str,
        secret: bytes,
        *,
        check_host: HostCheck | None = None,
    ) -> None:
        """`check_host(name, ip)`: whether host name `name` resolves to `ip`, for senders
        that declare a host name rather than an IP address (None: such senders are refused);
        it must answer at once (None: not known yet), and the driver resolves names
        meanwhile."""
        problem = member_problem(me)
        if problem is not None:
            raise ValueError(problem)
        self.config = config
        self.id = me.id
        self._epoch = me.epoch
        #: Drops by reason: the codec's `Rejection` names and the DROP_* names above.
        self.dropped: dict[str, int] = {}
        self._codec = Codec(
            cluster_id, secret, config.max_datagram_bytes, sender=me.addresses.gossip
        )
        self._check_host = check_host
        self._replays = ReplayCache(
            config.max_clock_skew_ms, config.replay_cache_per_sender, config.max_members
        )
        #: Nonces: the low 32 bits of the epoch (a new run starts elsewhere), then a count.
        self._nonce = (me.epoch & 0xFFFF_FFFF) << 32
        self._wall_ms = 0
        self._rng = rng
        self._seeds = sorted({seed for seed in seeds if seed != me.addresses.gossip})
        self._nodes: dict[str, _Node] = {me.id: _Node(me, ALIVE, 0, 0)}
        self._suspicions: dict[str, Suspicion] = {}
        self._probe_order: list[str] = []
        self._probe_index = 0
        self._probe: _Probe | None = None
        self._relays: dict[int, _Relay] = {}
        self._seq = 0
        self._broadcasts = BroadcastQueue()
        self._awareness = Awareness(config.awareness_max_multiplier)
        self._outbox: list[tuple[str, bytes]] = []
        self._events: deque[MembershipEvent] = deque()
        self._left = False
        self._started = False
        self._now_ms = 0
        self._next_probe_ms = 0
        self._next_gossip_ms = 0
        self._next_push_pull_ms = 0
        self._next_reconnect_ms = 0
        self._next_join_ms = 0
        self._live_count = 1  # members alive or suspect, ourselves included

    # ---- inputs ----------------------------------------------------------------------------

    def tick(self, now_ms: int, wall_ms: int | None = None) -> None:
        """Let time pass: fire whatever timers are due at `now_ms`. `wall_ms`: the wall
        clock, ms since the Unix epoch (default: `now_ms`, for a simulation's one clock)."""
        self._advance(now_ms, wall_ms)
        self._expire_relays()
        self._expire_suspicions()
        if not self._left:
            self._tick_probe()
            self._tick_join()
            self._tick_push_pull()
            self._tick_reconnect()
        self._tick_gossip()

    def receive(self, data: bytes, from_addr: str, now_ms: int, wall_ms: int | None = None) -> None:
        """Handle one datagram that arrived from `from_addr` (the source "ip:port")."""
        self._advance(now_ms, wall_ms)
        datagram = self._codec.decode(data)
        if isinstance(datagram, Rejection):
            self._drop(datagram.value)
            return
        problem = self._envelope_problem(datagram, from_addr)
        if problem is not None:
            self._drop(problem)
            return
        # Updates first: a buddy-system suspicion of us is refuted before we answer the ping,
        # so the ack carries the refutation.
        for update in datagram.updates:
            self._apply(update)
        self._handle(datagram.message, from_addr)

    def leave(self, now_ms: int, wall_ms: int | None = None) -> None:
        """Leave gracefully: tell every live member at once and keep gossiping it; stop
        probing. The caller keeps ticking a little while before closing the socket."""
        self._advance(now_ms, wall_ms)
        if self._left:
            return
        self._left = True
        me = self._nodes[self.id]
        self._set_status(me, LEFT)
        self._probe = None
        update = encode_update(Left(self.id, me.member.epoch, me.incarnation))
        self._broadcasts.push(self.id, update)
        for node in self._others(_LIVE):
            self._send(node.member.addresses.gossip, Gossip(), first=update, exclude=self.id)

    def update_self(
        self,
        *,
        weight: int | None = None,
        leaving: bool | None = None,
        workers_down: int | None = None,
    ) -> None:
        """Change what we advertise; the new incarnation is gossiped to everyone. Leaving is
        also told to every live member at once, as `leave` is: they stop handing this member
        leaderships within a datagram's time, not a gossip round's."""
        if self._left:
            raise RuntimeError("this member has left")
        me = self._nodes[self.id]
        member = replace(
            me.member,
            weight=me.member.weight if weight is None else weight,
            leaving=me.member.leaving if leaving is None else leaving,
            workers_down=me.member.workers_down if workers_down is None else workers_down,
        )
        problem = member_problem(member)
        if problem is not None:
            raise ValueError(problem)
        if member == me.member:
            return
        if me.incarnation >= MAX_INCARNATION:
            raise RuntimeError("incarnation number exhausted; restart with a new epoch")
        starts_leaving = member.leaving and not me.member.leaving
        me.member = member
        me.incarnation += 1
        update = Alive(member, me.incarnation)
        self._queue(update)
        if starts_leaving:
            encoded = encode_update(update)
            for node in self._others(_LIVE):
                self._send(node.member.addresses.gossip, Gossip(), first=encoded, exclude=self.id)

    # ---- outputs ---------------------------------------------------------------------------

    def outbox(self) -> list[tuple[str, bytes]]:
        """Datagrams to send, as (address, bytes); drained by the call."""
        out, self._outbox = self._outbox, []
        return out

    def events(self) -> list[MembershipEvent]:
        """Membership changes seen since the last call, oldest first; drained by the call."""
        out = list(self._events)
        self._events.clear()
        return out

    def member(self, member_id: str) -> Member | None:
        """What member `member_id` advertises, in our view (None: not a member we know)."""
        node = self._nodes.get(member_id)
        return None if node is None else node.member

    def members(self) -> dict[str, MemberState]:
        """Our view of every member (ourselves included), by id in sorted order."""
        return {member_id: node.state() for member_id, node in sorted(self._nodes.items())}

    def next_tick_ms(self) -> int:
        """The earliest time at which `tick` has something to do (the caller may tick more
        often; ticking later delays probes, suspicion timeouts and gossip)."""
        if not self._started:
            return self._now_ms
        times: list[int] = []
        if self._broadcasts:
            times.append(self._next_gossip_ms)
        if not self._left:
            times += [self._next_probe_ms, self._next_push_pull_ms, self._next_reconnect_ms]
            if self._joining():
                times.append(self._next_join_ms)
        if self._probe is not None:
            probe = self._probe
            times.append(probe.deadline_ms if probe.indirect_sent else probe.indirect_at_ms)
        times.extend(relay.nack_at_ms for relay in self._relays.values())
        times.extend(suspicion.deadline_ms for suspicion in self._suspicions.values())
        return min(times) if times else self._now_ms + self.config.probe_interval_ms

    @property
    def incarnation(self) -> int:
        return self._nodes[self.id].incarnation

    @property
    def health_multiplier(self) -> int:
        """Lifeguard's local health multiplier (1 = healthy) scaling probe timing."""
        return self._awareness.multiplier

    @property
    def joined(self) -> bool:
        """Whether we know of at least one other live member."""
        return not self._joining()

    @property
    def has_left(self) -> bool:
        return self._left

    # ---- time ------------------------------------------------------------------------------

    def _advance(self, now_ms: int, wall_ms: int | None) -> None:
        self._wall_ms = now_ms if wall_ms is None else wall_ms
        if not self._started:
            self._started = True
            self._now_ms = now_ms
            config = self.config
            # Stagger the periodic work (as memberlist does) so that nodes started together
            # don't march in lockstep.
            stagger = self._rng.randrange
            self._next_probe_ms = now_ms + stagger(config.probe_interval_ms)
            self._next_gossip_ms = now_ms + stagger(config.gossip_interval_ms)
            self._next_push_pull_ms = now_ms + stagger(config.push_pull_interval_ms)
            self._next_reconnect_ms = now_ms + stagger(config.reconnect_interval_ms)
            self._next_join_ms = now_ms
            me = self._nodes[self.id]
            me.changed_ms = now_ms
            self._queue(Alive(me.member, me.incarnation))  # announce ourselves, as memberlist
        elif now_ms > self._now_ms:
            self._now_ms = now_ms

    def _expire_relays(self) -> None:
        for seq, relay in sorted(self._relays.items()):
            if relay.nack_at_ms <= self._now_ms:
                del self._relays[seq]
                self._send(relay.requester_addr, Nack(relay.requester_seq))

    def _expire_suspicions(self) -> None:
        for member_id, suspicion in sorted(self._suspicions.items()):
            if suspicion.deadline_ms <= self._now_ms:
                node = self._nodes[member_id]
                self._apply_dead(Dead(member_id, node.member.epoch, node.incarnation, self.id))

    def _tick_probe(self) -> None:
        probe = self._probe
        if probe is not None:
            if not probe.indirect_sent and self._now_ms >= probe.indirect_at_ms:
                self._send_ping_reqs(probe)
            if self._now_ms >= probe.deadline_ms:
                self._probe = None
                self._probe_failed(probe)
        if self._probe is None and self._now_ms >= self._next_probe_ms:
            self._start_probe()

    def _tick_join(self) -> None:
        if self._now_ms < self._next_join_ms:
            return
        self._next_join_ms = self._now_ms + self.config.join_retry_interval_ms
        if self._joining():
            for seed in self._seeds:
                self._send_sync(seed, reply_wanted=True)

    def _tick_push_pull(self) -> None:
        if self._now_ms < self._next_push_pull_ms:
            return
        interval = push_pull_interval_ms(self.config, self._live_count)
        self._next_push_pull_ms = self._now_ms + interval
        candidates = self._others((ALIVE,))
        if candidates:
            target = self._rng.choice(candidates)
            self._send_sync(target.member.addresses.gossip, reply_wanted=True)

    def _tick_reconnect(self) -> None:
        if self._now_ms < self._next_reconnect_ms:
            return
        self._next_reconnect_ms = self._now_ms + self.config.reconnect_interval_ms
        candidates = self._others((DEAD,))
        if candidates:
            target = self._rng.choice(candidates)
            self._send_sync(target.member.addresses.gossip, reply_wanted=True)

    def _tick_gossip(self) -> None:
        # Gossip only when there is news; the interval bounds how often.
        if self._now_ms < self._next_gossip_ms or not self._broadcasts:
            return
        self._next_gossip_ms = self._now_ms + self.config.gossip_interval_ms
        candidates = [
            node
            for node in self._others((ALIVE, SUSPECT, DEAD))
            if node.status is not DEAD
            or self._now_ms - node.changed_ms <= self.config.gossip_to_the_dead_ms
        ]
        count = min(self.config.gossip_nodes, len(candidates))
        for node in self._rng.sample(candidates, count):
            kind, body, budget = self._codec.piggyback_budget(Gossip())
            updates = self._broadcasts.take(
                budget, MAX_UPDATES_PER_DATAGRAM, retransmit_limit(self.config, self._live_count)
            )
            if not updates:
                break
            self._outbox.append((node.member.addresses.gossip, self._seal(kind, body, updates)))

    # ---- probing ---------------------------------------------------------------------------

    def _start_probe(self) -> None:
        interval_ms = self._awareness.scale_ms(self.config.probe_interval_ms)
        self._next_probe_ms = self._now_ms + interval_ms
        target_id = self._next_probe_target()
        if target_id is None:
            return
        node = self._nodes[target_id]
        seq = self._next_seq()
        self._probe = _Probe(
            target=target_id,
            epoch=node.member.epoch,
            incarnation=node.incarnation,
            seq=seq,
            indirect_at_ms=self._now_ms + self._awareness.scale_ms(self.config.probe_timeout_ms),
            deadline_ms=self._now_ms + interval_ms,
        )
        buddy = None
        if node.status is SUSPECT:  # Lifeguard buddy system: let it know so it can refute
            buddy = encode_update(Suspect(target_id, node.member.epoch, node.incarnation, self.id))
        ping = Ping(seq, target_id, node.member.epoch, self.id, self._epoch)
        exclude = target_id if buddy is not None else None
        self._send(node.member.addresses.gossip, ping, first=buddy, exclude=exclude)

    def _next_probe_target(self) -> str | None:
        """Round robin over a shuffled order, reshuffled (and pruned) after each round."""
        for _ in range(len(self._probe_order) + 1):
            if self._probe_index >= len(self._probe_order):
                self._reset_probe_order()
                if not self._probe_order:
                    return None
            member_id = self._probe_order[self._probe_index]
            self._probe_index += 1
            if self._nodes[member_id].status in _LIVE:
                return member_id
        return None

    def _reset_probe_order(self) -> None:
        # Only the dead are forgotten with time: a member that left is remembered until it
        # comes back (or `_make_room` needs its row), since placement keeps its replicas
        # while it is away (`laminar.node.core.counts_for_placement`).
        retention_ms = self.config.dead_member_retention_ms
        expired = [
            member_id
            for member_id in sorted(self._probe_order)
            if self._nodes[member_id].status is DEAD
            and self._now_ms - self._nodes[member_id].changed_ms > retention_ms
        ]
        for member_id in expired:
            self._forget(member_id)
        self._rng.shuffle(self._probe_order)
        self._probe_index = 0

    def _send_ping_reqs(self, probe: _Probe) -> None:
        probe.indirect_sent = True
        node = self._nodes.get(probe.target)
        if node is None or node.member.epoch != probe.epoch or self.config.indirect_checks == 0:
            return
        candidates = [other for other in self._others((ALIVE,)) if other.member.id != probe.target]
        relays = self._rng.sample(candidates, min(self.config.indirect_checks, len(candidates)))
        probe.expected_nacks = len(relays)
        request = PingReq(probe.seq, probe.target, probe.epoch, node.member.addresses.gossip)
        for relay in relays:
            self._send(relay.member.addresses.gossip, request)

    def _probe_failed(self, probe: _Probe) -> None:
        # Lifeguard: relays that nacked show the network around us works, so a missing ack
        # is the target's fault; every missing nack (or, without relays, the failed probe
        # itself) counts against our own health.
        if probe.expected_nacks > 0:
            self._awareness.apply_delta(max(0, probe.expected_nacks - probe.nacks))
        else:
            self._awareness.apply_delta(1)
        self._apply_suspect(Suspect(probe.target, probe.epoch, probe.incarnation, self.id))

    def _next_seq(self) -> int:
        self._seq = (self._seq + 1) & SEQ_MASK
        return self._seq

    # ---- messages --------------------------------------------------------------------------

    def _handle(self, message: Message, from_addr: str) -> None:
        if isinstance(message, Ping):
            self._on_ping(message, from_addr)
        elif isinstance(message, Ack):
            self._on_ack(message.seq)
        elif isinstance(message, PingReq):
            self._on_ping_req(message, from_addr)
        elif isinstance(message, Nack):
            if self._probe is not None and self._probe.seq == message.seq:
                self._probe.nacks += 1
            else:
                self._drop(DROP_LATE_NACK)
        elif isinstance(message, Sync):
            self._merge(message)
            if message.reply_wanted:
                self._send_sync(from_addr, reply_wanted=False)
        # Gossip carries only its piggybacked updates, already applied.

    def _on_ping(self, ping: Ping, from_addr: str) -> None:
        me = self._nodes[self.id]
        if ping.target != self.id or ping.target_epoch > me.member.epoch:
            self._drop(DROP_WRONG_TARGET)  # meant for another member, or a newer run of us
            return
        update = None
        if ping.target_epoch < me.member.epoch and not self._left:
            # The sender still knows our previous run: tell it about this one first.
            update = encode_update(Alive(me.member, me.incarnation))
        self._send(from_addr, Ack(ping.seq), first=update)
        source = self._nodes.get(ping.source)
        if (source is None or source.member.epoch < ping.source_epoch) and not self._left:
            # Gossip missed a member (or its restart) that is probing us: push-pull with it
            # now rather than at the next push-pull interval.
            self._send_sync(from_addr, reply_wanted=True)

    def _on_ack(self, seq: int) -> None:
        probe = self._probe
        if probe is not None and probe.seq == seq:
            self._probe = None
            self._awareness.apply_delta(-1)
            return
        relay = self._relays.pop(seq, None)
        if relay is None:
            self._drop(DROP_LATE_ACK)
            return
        self._send(relay.requester_addr, Ack(relay.requester_seq))

    def _on_ping_req(self, request: PingReq, from_addr: str) -> None:
        if request.target == self.id:
            self._send(from_addr, Ack(request.seq))
            return
        if len(self._relays) >= self.config.max_pending_relays:
            self._drop(DROP_RELAY_FULL)
            return
        seq = self._next_seq()
        nack_after_ms = int(self.config.probe_timeout_ms * NACK_TIMEOUT_FRACTION)
        self._relays[seq] = _Relay(from_addr, request.seq, self._now_ms + nack_after_ms)
        ping = Ping(seq, request.target, request.target_epoch, self.id, self._epoch)
        self._send(request.target_addr, ping)

    def _merge(self, sync: Sync) -> None:
        """Push-pull merge (memberlist mergeState): someone else's dead is only our suspect,
        so that we check for ourselves before declaring anyone dead. Suspect and dead entries
        about members we don't know (or about an epoch we don't know) are ignored: their
        alive update, which carries what they advertise, will follow. A left entry about
        them is taken as it is (`_adopt_left`): no update will follow it, and a node started
        after a member left must still know that it is away (placement keeps its place)."""
        for entry in sync.entries:
            member = entry.member
            if entry.status is ALIVE:
                self._apply_alive(Alive(member, entry.incarnation))
            elif entry.status is LEFT:
                if not self._adopt_left(member, entry.incarnation):
                    self._apply_left(Left(member.id, member.epoch, entry.incarnation))
            else:
                self._apply_suspect(
                    Suspect(member.id, member.epoch, entry.incarnation, sync.sender)
                )

    def _send_sync(self, addr: str, *, reply_wanted: bool) -> None:
        entries = [encode_sync_entry(self._nodes[self.id].state())]
        entries += [
            encode_sync_entry(node.state())
            for member_id, node in sorted(self._nodes.items())
            if member_id != self.id
        ]
        for body, budget in self._codec.sync_bodies(self.id, reply_wanted, entries):
            self._seal_and_send(addr, MessageKind.SYNC, body, budget)

    def _send(
        self,
        addr: str,
        message: Message,
        *,
        first: bytes | None = None,
        exclude: str | None = None,
    ) -> None:
        """Send `message` with as many queued updates piggybacked as fit in a datagram."""
        kind, body, budget = self._codec.piggyback_budget(message)
        self._seal_and_send(addr, kind, body, budget, first=first, exclude=exclude)

    def _seal_and_send(
        self,
        addr: str,
        kind: MessageKind,
        body: bytes,
        budget: int,
        *,
        first: bytes | None = None,
        exclude: str | None = None,
    ) -> None:
        updates: list[bytes] = []
        if first is not None and len(first) <= budget:
            updates.append(first)
            budget -= len(first)
        updates += self._broadcasts.take(
            budget,
            MAX_UPDATES_PER_DATAGRAM - len(updates),
            retransmit_limit(self.config, self._live_count),
            exclude,
        )
        self._outbox.append((addr, self._seal(kind, body, updates)))

    def _seal(self, kind: MessageKind, body: bytes, updates: Sequence[bytes]) -> bytes:
        self._nonce = (self._nonce + 1) & 0xFFFF_FFFF_FFFF_FFFF
        stamp = Stamp(max(0, self._wall_ms), self._nonce)
        return self._codec.seal(kind, body, updates, stamp=stamp)

    def _envelope_problem(self, datagram: Datagram, from_addr: str) -> str | None:
        """Why an authenticated datagram must still be dropped (a DROP_* name), or None.
        Checked in this order, and recorded as seen only when it passes them all."""
        if abs(datagram.timestamp_ms - self._wall_ms) > self.config.max_clock_skew_ms:
            return DROP_STALE
        if datagram.sender == self._codec.sender:
            return DROP_WRONG_SENDER  # we never send to ourselves: a reflection
        matches = sender_matches(datagram.sender, from_addr, self._check_host)
        if matches is None:
            return DROP_UNVERIFIED_SENDER
        if not matches:
            return DROP_WRONG_SENDER
        if not self._replays.accept(
            datagram.sender, datagram.timestamp_ms, datagram.nonce, self._wall_ms
        ):
            return DROP_REPLAY
        return None

    # ---- membership updates ----------------------------------------------------------------

    def _apply(self, update: Update) -> None:
        if isinstance(update, Alive):
            self._apply_alive(update)
        elif isinstance(update, Suspect):
            self._apply_suspect(update)
        elif isinstance(update, Dead):
            self._apply_dead(update)
        else:
            self._apply_left(update)

    def _apply_alive(self, update: Alive) -> None:
        member, incarnation = update.member, update.incarnation
        node = self._nodes.get(member.id)
        if member.id == self.id:
            assert node is not None
            if self._stale_or_superseded(node, member.epoch) or self._left:
                return
            if incarnation < node.incarnation or (
                incarnation == node.incarnation and member == node.member
            ):
                return
            self._refute(incarnation)  # someone speaks for us with a different record
            return
        if node is not None and member.epoch < node.member.epoch:
            return
        if node is None or member.epoch > node.member.epoch:
            # A newcomer, or a restart: the new epoch replaces the old run whatever its state.
            if node is None and not self._make_room():
                self._drop(DROP_MEMBERS_FULL)
                return
            self._suspicions.pop(member.id, None)
            if node is None:
                node = _Node(member, DEAD, incarnation, self._now_ms)
                self._nodes[member.id] = node
                self._insert_probe_order(member.id)
            node.member = member
            node.incarnation = incarnation
            self._set_status(node, ALIVE)
            self._queue(update)
            self._emit(EventKind.JOINED, node)
            return
        if incarnation <= node.incarnation:
            return  # only the member raises its incarnation, and it must to come back
        old_status, old_member = node.status, node.member
        self._suspicions.pop(member.id, None)
        node.member = member
        node.incarnation = incarnation
        self._set_status(node, ALIVE)
        self._queue(update)
        if old_status in (DEAD, LEFT):
            self._emit(EventKind.JOINED, node)
            return
        if old_status is SUSPECT:
            self._emit(EventKind.ALIVE, node)
        if old_member != member:
            self._emit(EventKind.UPDATED, node)

    def _apply_suspect(self, update: Suspect) -> None:
        node = self._current(update)
        if node is None:
            return
        if update.id == self.id:
            if not self._left:
                self._refute(update.incarnation)
            return
        if node.status is SUSPECT:
            suspicion = self._suspicions[update.id]
            if update.incarnation == node.incarnation:
                if suspicion.confirm(update.accuser):
                    self._queue(update)  # let the confirmation reach others too
                return
            node.incarnation = update.incarnation  # a suspicion of a newer incarnation
            self._start_suspicion(update)
            self._queue(update)
            return
        if node.status is not ALIVE:
            return
        node.incarnation = update.incarnation
        self._set_status(node, SUSPECT)
        self._start_suspicion(update)
        self._queue(update)
        self._emit(EventKind.SUSPECT, node)

    def _apply_dead(self, update: Dead) -> None:
        node = self._current(update)
        if node is None:
            return
        if node.status in (DEAD, LEFT):
            return
        if update.id == self.id:
            self._refute(update.incarnation)
            return
        self._suspicions.pop(update.id, None)
        node.incarnation = update.incarnation
        self._set_status(node, DEAD)
        self._queue(update)
        self._emit(EventKind.DEAD, node)

    def _apply_left(self, update: Left) -> None:
        node = self._current(update)
        if node is None:
            return
        if node.status is LEFT:
            return
        if update.id == self.id:
            self._refute(update.incarnation)  # we have not left (or status would be LEFT)
            return
        self._suspicions.pop(update.id, None)
        node.incarnation = update.incarnation
        self._set_status(node, LEFT)
        self._queue(update)
        self._emit(EventKind.LEFT, node)

    def _adopt_left(self, member: Member, incarnation: int) -> bool:
        """A push-pull entry says `member` left, and we know no run of it as recent: record
        it as left (True), unless it is us or there is no room. A newer run that is alive
        replaces it when its alive update comes, as any restart does."""
        node = self._nodes.get(member.id)
        if member.id == self.id or (node is not None and node.member.epoch >= member.epoch):
            return False
        if node is None:
            if not self._make_room():
                return False
            node = _Node(member, DEAD, incarnation, self._now_ms)
            self._nodes[member.id] = node
            self._insert_probe_order(member.id)
        self._suspicions.pop(member.id, None)
        node.member = member
        node.incarnation = incarnation
        self._set_status(node, LEFT)
        self._emit(EventKind.LEFT, node)
        return True

    def _current(self, update: Suspect | Dead | Left) -> _Node | None:
        """The member an accusation is about, if it concerns its current run and incarnation;
        an accusation about an older run or incarnation of ourselves makes us re-announce."""
        node = self._nodes.get(update.id)
        if node is None or node.member.epoch != update.epoch:
            if node is not None and update.id == self.id:
                self._stale_or_superseded(node, update.epoch)
            return None
        if update.incarnation < node.incarnation:
            self._reannounce_if_self(update.id)
            return None
        return node

    def _stale_or_superseded(self, me: _Node, epoch: int) -> bool:
        """For an update about ourselves: True if it is about another run of this id (an
        older one is stale; a newer one means we were replaced, which is counted)."""
        if epoch > me.member.epoch:
            self._drop(DROP_SUPERSEDED)
        return epoch != me.member.epoch

    def _reannounce_if_self(self, member_id: str) -> None:
        """A stale accusation of us (an older incarnation) means someone missed our last
        refutation: say again who we are, at the same incarnation. memberlist ignores these,
        leaving the accuser to declare us dead on its own until the next push-pull."""
        if member_id == self.id and not self._left:
            me = self._nodes[self.id]
            self._queue(Alive(me.member, me.incarnation))

    def _refute(self, accused_incarnation: int) -> None:
        if self._left:
            return
        me = self._nodes[self.id]
        me.incarnation = min(MAX_INCARNATION, max(me.incarnation, accused_incarnation) + 1)
        self._awareness.apply_delta(1)  # being suspected hints that we are the slow one
        self._queue(Alive(me.member, me.incarnation))

    def _start_suspicion(self, update: Suspect) -> None:
        minimum, maximum = suspicion_timeouts_ms(self.config, self._live_count)
        expected = expected_confirmations(self.config, self._live_count)
        self._suspicions[update.id] = Suspicion(
            update.accuser, expected, minimum, maximum, self._now_ms
        )

    # ---- the member table ------------------------------------------------------------------

    def _others(self, statuses: tuple[MemberStatus, ...]) -> list[_Node]:
        return [
            node
            for member_id, node in sorted(self._nodes.items())
            if member_id != self.id and node.status in statuses
        ]

    def _joining(self) -> bool:
        own = 0 if self._left else 1
        return self._live_count - own == 0

    def _set_status(self, node: _Node, status: MemberStatus) -> None:
        was_live = node.status in _LIVE
        node.status = status
        node.changed_ms = self._now_ms
        self._live_count += (status in _LIVE) - was_live

    def _insert_probe_order(self, member_id: str) -> None:
        # At a random position, as memberlist does, so a newcomer is probed within a round on
        # average rather than at its end.
        self._probe_order.append(member_id)
        position = self._rng.randrange(len(self._probe_order))
        order = self._probe_order
        order[position], order[-1] = order[-1], order[position]

    def _make_room(self) -> bool:
        if len(self._nodes) < self.config.max_members:
            return True
        gone = [
            (node.changed_ms, member_id)
            for member_id, node in sorted(self._nodes.items())
            if node.status in (DEAD, LEFT) and member_id != self.id
        ]
        if not gone:
            return False
        self._forget(min(gone)[1])
        return True

    def _forget(self, member_id: str) -> None:
        node = self._nodes.pop(member_id)
        self._live_count -= node.status in _LIVE
        self._suspicions.pop(member_id, None)
        self._broadcasts.discard(member_id)
        position = self._probe_order.index(member_id)
        del self._probe_order[position]
        if position < self._probe_index:
            self._probe_index -= 1

    def _queue(self, update: Update) -> None:
        member_id = update.member.id if isinstance(update, Alive) else update.id
        self._broadcasts.push(member_id, encode_update(update))

    def _emit(self, kind: EventKind, node: _Node) -> None:
        if len(self._events) >= self.config.max_pending_events:
            self._events.popleft()
            self._drop(DROP_EVENT_OVERFLOW)
        self._events.append(MembershipEvent(kind, node.state(), self._now_ms))

    def _drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1
