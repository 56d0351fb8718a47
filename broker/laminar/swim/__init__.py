"""Sans-I/O SWIM membership (with Lifeguard), its authenticated wire codec and a
deterministic simulator (the asyncio UDP runtime: laminar.server.swim_runtime)."""

from .codec import Codec, Rejection, cluster_hash
from .config import (
    SwimConfig,
    expected_confirmations,
    push_pull_interval_ms,
    retransmit_limit,
    suspicion_timeouts_ms,
)
from .core import Swim
from .member import (
    Addresses,
    EventKind,
    Member,
    MembershipEvent,
    MemberState,
    MemberStatus,
)
from .suspicion import Suspicion, suspicion_timeout_ms

__all__ = [
    "Addresses",
    "Codec",
    "EventKind",
    "Member",
    "MemberState",
    "MemberStatus",
    "MembershipEvent",
    "Rejection",
    "Suspicion",
    "Swim",
    "SwimConfig",
    "cluster_hash",
    "expected_confirmations",
    "push_pull_interval_ms",
    "retransmit_limit",
    "suspicion_timeout_ms",
    "suspicion_timeouts_ms",
]
