"""SWIM knobs in one place, with hashicorp/memberlist's DefaultLANConfig as the defaults.

Every duration is in milliseconds of the caller's clock; the core never reads a clock itself.
The derived quantities (suspicion timeouts, retransmit limit, push-pull scaling) are small
pure functions here so that the tests and the dead-detection bound use the same formulas as
the core.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .codec import MIN_DATAGRAM_BYTES

#: UDP payload limit over IPv4 (65,535 - 8 byte UDP header - 20 byte IP header).
MAX_UDP_PAYLOAD_BYTES = 65_507
#: Push-pull starts slowing down above this many members (memberlist's pushPullScaleThreshold).
PUSH_PULL_SCALE_THRESHOLD = 32


@dataclass(frozen=True, slots=True)
class SwimConfig:
    #: Time between two failure-detection probes (one member pinged per interval), before the
    #: local health multiplier scales it.
    probe_interval_ms: int = 1000
    #: How long to wait for a direct ack before asking `indirect_checks` members to probe
    #: (ping-req); also scaled by local health.
    probe_timeout_ms: int = 500
    #: Members asked to probe on our behalf when a direct probe gets no ack (SWIM's k).
    indirect_checks: int = 3
    #: Each membership update is retransmitted at most
    #: retransmit_mult * ceil(log10(n + 1)) times (SWIM's lambda * log n).
    retransmit_mult: int = 4
    #: Minimum suspicion timeout = suspicion_mult * max(1, log10(n)) * probe_interval_ms.
    suspicion_mult: int = 4
    #: Maximum suspicion timeout = suspicion_max_timeout_mult * minimum (Lifeguard).
    suspicion_max_timeout_mult: int = 6
    #: Local health (Lifeguard awareness) scales probe interval and timeout by 1 .. this.
    awareness_max_multiplier: int = 8
    #: Time between two gossip rounds (only sent when there are updates to spread).
    gossip_interval_ms: int = 200
    #: Members gossiped to per round.
    gossip_nodes: int = 3
    #: Dead members still receive gossip this long, so they learn they were declared dead
    #: and can refute.
    gossip_to_the_dead_ms: int = 30_000
    #: Full-state sync (push-pull anti-entropy) with one random alive member this often,
    #: scaled up above PUSH_PULL_SCALE_THRESHOLD members.
    push_pull_interval_ms: int = 30_000
    #: Sync with one random dead member this often, so the two sides of a healed partition
    #: find each other again (serf's reconnect).
    reconnect_interval_ms: int = 30_000
    #: While no other member is alive, sync with the seed addresses this often.
    join_retry_interval_ms: int = 1000
    #: Dead members stay in the member table this long (then they are forgotten). Members
    #: that left stay until they come back: placement keeps their place while they are away.
    dead_member_retention_ms: int = 86_400_000
    #: Bound on the member table (self included); the oldest dead or left member is evicted
    #: to make room, and alive newcomers beyond it are dropped.
    max_members: int = 1024
    #: Bound on every datagram sent or accepted (header, message, piggyback and MAC).
    max_datagram_bytes: int = 1400
    #: Ping-reqs relayed for others at the same time; more are dropped.
    max_pending_relays: int = 64
    #: Membership events kept for the caller to drain; beyond it the oldest are dropped
    #: (and counted).
    max_pending_events: int = 4096
    #: A datagram whose timestamp is further than this from our wall clock is dropped
    #: (`stale`); the members' clocks must agree within it. NTP does far better; it is this
    #: wide so that a broker whose wall clock is off by a minute (the fault suite's clock
    #: jump) still gossips, and costs little: replays within it are refused by the cache.
    max_clock_skew_ms: int = 120_000
    #: Datagrams remembered per sender to refuse replays within the clock-skew window; beyond
    #: it the oldest is forgotten and older timestamps of that sender are refused.
    replay_cache_per_sender: int = 1024

    def __post_init__(self) -> None:
        positive = {
            "probe_interval_ms": self.probe_interval_ms,
            "probe_timeout_ms": self.probe_timeout_ms,
            "retransmit_mult": self.retransmit_mult,
            "suspicion_mult": self.suspicion_mult,
            "suspicion_max_timeout_mult": self.suspicion_max_timeout_mult,
            "awareness_max_multiplier": self.awareness_max_multiplier,
            "gossip_interval_ms": self.gossip_interval_ms,
            "gossip_nodes": self.gossip_nodes,
            "push_pull_interval_ms": self.push_pull_interval_ms,
            "reconnect_interval_ms": self.reconnect_interval_ms,
            "join_retry_interval_ms": self.join_retry_interval_ms,
            "max_members": self.max_members,
            "max_pending_events": self.max_pending_events,
            "max_clock_skew_ms": self.max_clock_skew_ms,
            "replay_cache_per_sender": self.replay_cache_per_sender,
        }
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        if self.probe_timeout_ms >= self.probe_interval_ms:
            raise ValueError("probe_timeout_ms must be below probe_interval_ms")
        if self.indirect_checks < 0 or self.max_pending_relays < 0:
            raise ValueError("indirect_checks and max_pending_relays must not be negative")
        if self.gossip_to_the_dead_ms < 0 or self.dead_member_retention_ms < 0:
            raise ValueError(
                "gossip_to_the_dead_ms and dead_member_retention_ms must not be negative"
            )
        if not MIN_DATAGRAM_BYTES <= self.max_datagram_bytes <= MAX_UDP_PAYLOAD_BYTES:
            raise ValueError(
                f"max_datagram_bytes must be in [{MIN_DATAGRAM_BYTES}, {MAX_UDP_PAYLOAD_BYTES}]"
            )


def suspicion_timeouts_ms(config: SwimConfig, members: int) -> tuple[int, int]:
    """(min, max) suspicion timeout for a cluster of `members` (memberlist suspicionTimeout:
    the log10 scale never drops below 1, so tiny clusters get suspicion_mult intervals)."""
    node_scale = max(1.0, math.log10(max(1, members)))
    minimum = int(config.suspicion_mult * node_scale * config.probe_interval_ms)
    return minimum, config.suspicion_max_timeout_mult * minimum


def expected_confirmations(config: SwimConfig, members: int) -> int:
    """Lifeguard's k: independent suspicions that drive the timeout to its minimum. Set so the
    nominal timeout is hit two probe intervals early; 0 if the cluster is too small to give
    that many (members minus ourselves minus the suspect)."""
    k = config.suspicion_mult - 2
    return 0 if members - 2 < k else max(0, k)


def retransmit_limit(config: SwimConfig, members: int) -> int:
    """Times one update is piggybacked or gossiped before it is dropped from the queue."""
    return config.retransmit_mult * math.ceil(math.log10(members + 1))


def push_pull_interval_ms(config: SwimConfig, members: int) -> int:
    """Push-pull slows down as the cluster grows: x2 above 32 members, x3 above 64, ..."""
    if members <= PUSH_PULL_SCALE_THRESHOLD:
        return config.push_pull_interval_ms
    multiplier = math.ceil(math.log2(members) - math.log2(PUSH_PULL_SCALE_THRESHOLD)) + 1
    return multiplier * config.push_pull_interval_ms
