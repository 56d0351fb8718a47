"""Shared builders for the SWIM tests: members, codecs and a driven single core."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from laminar.swim import Addresses, Codec, Member, SwimConfig
from laminar.swim.codec import Stamp, encode_update
from laminar.swim.core import Swim
from laminar.swim.messages import Ack, Alive, Datagram, Gossip, Message, Ping, Update

CLUSTER = "test-cluster"
SECRET = b"test-secret-0123456789abcdef0123"


def member(name: str, *, epoch: int = 1, weight: int = 1, leaving: bool = False) -> Member:
    addresses = Addresses(f"{name}.api:8080", f"{name}.peer:7000", f"{name}:7946")
    return Member(name, addresses, weight, leaving, epoch)


def codec(config: SwimConfig | None = None, *, sender: str = "peer:7946") -> Codec:
    """A codec sealing datagrams as sent from gossip address `sender`."""
    return Codec(CLUSTER, SECRET, (config or SwimConfig()).max_datagram_bytes, sender=sender)


_nonces = iter(range(1, 2**63))


def stamp(at_ms: int) -> Stamp:
    """A stamp for a datagram sealed at `at_ms` (a new nonce each call)."""
    return Stamp(at_ms, next(_nonces))


@dataclass
class Sent:
    at_ms: int
    to: str
    datagram: Datagram
    size: int


@dataclass
class Harness:
    """One real core ("me") and hand-driven peers. Peers named in `responsive` ack every
    ping the core sends them, at once; everything the core sends is decoded into `sent`."""

    config: SwimConfig = field(default_factory=SwimConfig)
    seeds: Sequence[str] = ()
    seed: int = 1
    responsive: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.codec = codec(self.config)
        self.me = member("me")
        self.core = Swim(
            self.config, self.me, self.seeds, random.Random(self.seed), CLUSTER, SECRET
        )
        self.now_ms = 0
        self.sent: list[Sent] = []
        self.core.tick(0)
        self.collect()

    def deliver(
        self, message: Message, updates: Iterable[Update] = (), from_addr: str = "peer:7946"
    ) -> None:
        """A datagram sealed by the member at `from_addr`, now, arrives from there."""
        encoded = [encode_update(u) for u in updates]
        data = codec(self.config, sender=from_addr).encode(
            message, encoded, stamp=stamp(self.now_ms)
        )
        self.core.receive(data, from_addr, self.now_ms)
        self.collect()

    def add(self, *names: str, incarnation: int = 0) -> None:
        """Let the core learn alive members through a gossip datagram."""
        self.deliver(Gossip(), [Alive(member(name), incarnation) for name in names])

    def run_until(self, until_ms: int) -> None:
        """Tick now, then at every due timer up to `until_ms`, then at `until_ms`."""
        self.core.tick(self.now_ms)
        self.collect()
        while True:
            due = max(self.core.next_tick_ms(), self.now_ms + 1)
            if due > until_ms:
                break
            self.now_ms = due
            self.core.tick(due)
            self.collect()
        if until_ms > self.now_ms:
            self.now_ms = until_ms
            self.core.tick(until_ms)
            self.collect()

    def run_for(self, duration_ms: int) -> None:
        self.run_until(self.now_ms + duration_ms)

    def take_sent(self) -> list[Sent]:
        sent, self.sent = self.sent, []
        return sent

    def pings(self) -> list[Sent]:
        return [s for s in self.sent if isinstance(s.datagram.message, Ping)]

    def collect(self) -> None:
        """Decode what the core has put in its outbox (after a direct call into the core)."""
        replies: list[tuple[str, Ack]] = []
        for to, data in self.core.outbox():
            decoded = self.codec.decode(data)
            assert isinstance(decoded, Datagram), decoded
            self.sent.append(Sent(self.now_ms, to, decoded, len(data)))
            message = decoded.message
            if isinstance(message, Ping) and message.target in self.responsive:
                replies.append((to, Ack(message.seq)))
        for to, ack in replies:
            self.deliver(ack, from_addr=to)
