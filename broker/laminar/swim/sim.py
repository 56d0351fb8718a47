"""A seeded, deterministic simulation of SWIM nodes on a virtual clock and a faulty network.

N real `Swim` cores exchange real (encoded, authenticated) datagrams through a simulated
network that loses, duplicates and delays (so reorders) them and can be partitioned. Nodes
can crash (stop sending and receiving), restart with a new epoch, leave, and change their
weight or leaving flag; foreign datagrams can be injected. Time is virtual: the simulation
jumps from one due event (a delivery, or a core's next timer) to the next, so ten minutes of
a 20-node cluster take seconds. Everything random comes from one `random.Random(seed)`,
iteration is in sorted order and no wall clock is read, so a seed replays exactly.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterable
from dataclasses import dataclass, field

from .config import SwimConfig
from .core import Swim
from .member import Addresses, Member, MembershipEvent, MemberState

GOSSIP_PORT = 7946
API_PORT = 8080
PEER_PORT = 7000
FIRST_EPOCH = 1_000

_START, _DELIVER, _TICK = 0, 1, 2


@dataclass(frozen=True, slots=True)
class SwimSimConfig:
    nodes: int = 20
    #: The first `seeds` nodes' gossip addresses are every node's seed list.
    seeds: int = 3
    loss_rate: float = 0.0  # per datagram
    duplicate_rate: float = 0.0  # per datagram that is not lost
    min_delay_ms: int = 1
    max_delay_ms: int = 10
    #: Nodes start at random times in [0, start_spread_ms).
    start_spread_ms: int = 2000
    swim: SwimConfig = field(default_factory=SwimConfig)
    cluster_id: str = "sim-cluster"
    secret: bytes = b"sim-cluster-secret"


@dataclass(frozen=True, slots=True)
class Observation:
    """`observer` saw `event` (at event.at_ms)."""

    observer: str
    event: MembershipEvent


@dataclass(slots=True)
class SimNode:
    id: str
    member: Member  # what it advertises on its current run
    core: Swim | None = None  # None while down (not started yet, or crashed)
    wake_ms: int | None = None  # the tick scheduled for it, if any


def node_id(number: int) -> str:
    return f"n{number:02d}"


def _address(number: int, port: int) -> str:
    return f"10.0.{number // 256}.{number % 256}:{port}"


class SwimSimulation:
    def __init__(self, seed: int, config: SwimSimConfig | None = None) -> None:
        self.seed = seed
        self.config = config or SwimSimConfig()
        self.rng = random.Random(seed)
        self.now_ms = 0
        self.observations: list[Observation] = []
        self.stats = {
            "sent": 0,
            "delivered": 0,
            "lost": 0,
            "duplicated": 0,
            "partitioned": 0,
            "to_down_node": 0,
            "unroutable": 0,
        }
        self._queue: list[tuple[int, int, int, str, bytes, str]] = []
        self._order = 0
        self._next_epoch = FIRST_EPOCH
        self._side: frozenset[str] | None = None
        self.nodes: dict[str, SimNode] = {}
        self._by_addr: dict[str, str] = {}
        for number in range(self.config.nodes):
            addresses = Addresses(
                api=_address(number, API_PORT),
                peer=_address(number, PEER_PORT),
                gossip=_address(number, GOSSIP_PORT),
            )
            member = Member(node_id(number), addresses, epoch=0)
            self.nodes[member.id] = SimNode(member.id, member)
            self._by_addr[addresses.gossip] = member.id
        self.seeds = [
            _address(number, GOSSIP_PORT)
            for number in range(min(self.config.seeds, self.config.nodes))
        ]
        spread = max(1, self.config.start_spread_ms)
        for member_id in sorted(self.nodes):
            self._push(self.rng.randrange(spread), _START, member_id)

    # ---- running ---------------------------------------------------------------------------

    def run_until(self, until_ms: int) -> None:
        while self._queue and self._queue[0][0] <= until_ms:
            at_ms, _, kind, target, data, from_addr = heapq.heappop(self._queue)
            self.now_ms = at_ms
            if kind == _DELIVER:
                self._deliver(target, data, from_addr)
            elif kind == _TICK:
                self._tick(target, at_ms)
            else:
                self._start(target)
        self.now_ms = max(self.now_ms, until_ms)

    def run_for(self, duration_ms: int) -> None:
        self.run_until(self.now_ms + duration_ms)

    # ---- faults and operations -------------------------------------------------------------

    def crash(self, member_id: str) -> None:
        """The node stops at once: no leave, no more sending or receiving."""
        node = self.nodes[member_id]
        node.core = None
        node.wake_ms = None

    def restart(self, member_id: str) -> None:
        """Start the node again (a new process: a new epoch, everything else forgotten)."""
        self.crash(member_id)
        self._start(member_id)

    def leave(self, member_id: str) -> None:
        node = self.nodes[member_id]
        assert node.core is not None, f"{member_id} is down"
        node.core.leave(self.now_ms)
        self._after(node, ticked=False)

    def update_self(
        self, member_id: str, *, weight: int | None = None, leaving: bool | None = None
    ) -> None:
        node = self.nodes[member_id]
        assert node.core is not None, f"{member_id} is down"
        node.core.update_self(weight=weight, leaving=leaving)
        self._after(node, ticked=False)

    def isolate(self, member_ids: Iterable[str]) -> None:
        """Partition: nothing crosses between `member_ids` and the other nodes until `heal`
        (datagrams already in flight included)."""
        self._side = frozenset(member_ids)

    def heal(self) -> None:
        self._side = None

    def inject(self, to_id: str, data: bytes, from_addr: str, delay_ms: int = 0) -> None:
        """Deliver a datagram that no simulated core sent (forged, foreign, garbage)."""
        self._push(self.now_ms + delay_ms, _DELIVER, to_id, data, from_addr)

    # ---- views -----------------------------------------------------------------------------

    def up(self) -> list[str]:
        return [m for m, node in sorted(self.nodes.items()) if node.core is not None]

    def core(self, member_id: str) -> Swim:
        core = self.nodes[member_id].core
        assert core is not None, f"{member_id} is down"
        return core

    def view(self, observer: str) -> dict[str, MemberState]:
        return self.core(observer).members()

    def address(self, member_id: str) -> str:
        return self.nodes[member_id].member.addresses.gossip

    # ---- internals -------------------------------------------------------------------------

    def _push(self, at_ms: int, kind: int, target: str, data: bytes = b"", src: str = "") -> None:
        self._order += 1
        heapq.heappush(self._queue, (at_ms, self._order, kind, target, data, src))

    def _start(self, member_id: str) -> None:
        node = self.nodes[member_id]
        if node.core is not None:
            return
        self._next_epoch += 1
        node.member = Member(node.member.id, node.member.addresses, epoch=self._next_epoch)
        node.core = Swim(
            self.config.swim,
            node.member,
            self.seeds,
            random.Random(self.rng.getrandbits(64)),
            self.config.cluster_id,
            self.config.secret,
        )
        node.core.tick(self.now_ms)
        self._after(node, ticked=True)

    def _tick(self, member_id: str, at_ms: int) -> None:
        node = self.nodes[member_id]
        if node.core is None or node.wake_ms != at_ms:
            return  # superseded by a rescheduling, or the node is down
        node.wake_ms = None
        node.core.tick(at_ms)
        self._after(node, ticked=True)

    def _deliver(self, member_id: str, data: bytes, from_addr: str) -> None:
        node = self.nodes[member_id]
        if node.core is None:
            self.stats["to_down_node"] += 1
            return
        source = self._by_addr.get(from_addr)
        if source is not None and not self._connected(source, member_id):
            self.stats["partitioned"] += 1
            return
        self.stats["delivered"] += 1
        node.core.receive(data, from_addr, self.now_ms)
        self._after(node, ticked=False)

    def _after(self, node: SimNode, *, ticked: bool) -> None:
        core = node.core
        assert core is not None
        source = node.member.addresses.gossip
        for addr, data in core.outbox():
            self._transmit(source, addr, data)
        for event in core.events():
            self.observations.append(Observation(node.id, event))
        # A core has done everything due at the time it was ticked, so its next wake-up is
        # strictly later; the guard keeps a faulty core from spinning the clock in place.
        wake_ms = max(core.next_tick_ms(), self.now_ms + 1 if ticked else self.now_ms)
        if node.wake_ms != wake_ms:
            node.wake_ms = wake_ms
            self._push(wake_ms, _TICK, node.id)

    def _transmit(self, source: str, addr: str, data: bytes) -> None:
        self.stats["sent"] += 1
        target = self._by_addr.get(addr)
        if target is None:
            self.stats["unroutable"] += 1
            return
        if self.rng.random() < self.config.loss_rate:
            self.stats["lost"] += 1
            return
        copies = 1
        if self.config.duplicate_rate and self.rng.random() < self.config.duplicate_rate:
            copies = 2
            self.stats["duplicated"] += 1
        for _ in range(copies):
            delay_ms = self.rng.randint(self.config.min_delay_ms, self.config.max_delay_ms)
            self._push(self.now_ms + delay_ms, _DELIVER, target, data, source)

    def _connected(self, a: str, b: str) -> bool:
        return self._side is None or (a in self._side) == (b in self._side)
