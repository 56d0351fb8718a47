"""A broker that hands off its leaderships is leaving (`Broker.hand_off_leaderships`): for
`--leaving-hold-ms` after a handoff alone (a pod's preStop, whose SIGTERM follows), and for
good once it is stopping. A real Broker, not started: it leads nothing, so the handoff ends at
once, and only the leaving is left to look at."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from laminar.server.config import BrokerConfig, new_secret
from laminar.server.node import Broker


def broker(path: Path) -> Broker:
    return Broker(BrokerConfig("n1", path, secret=new_secret(), allow_anonymous=True))


async def test_a_handoff_leaves_for_its_hold_then_takes_leaderships_again(tmp_path: Path) -> None:
    b = broker(tmp_path)
    assert b.core.takes_leadership("n1")
    assert await b.hand_off_leaderships(1.0, hold_s=0.05) == 0
    assert b.core.leaving and not b.core.takes_leadership("n1")
    deadline = time.monotonic() + 10
    while b.core.leaving and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert not b.core.leaving and b.core.takes_leadership("n1")


async def test_a_stopping_broker_leaves_for_good(tmp_path: Path) -> None:
    b = broker(tmp_path)
    assert await b.hand_off_leaderships(1.0, hold_s=0.05) == 0  # the preStop
    b._stopping = True  # SIGTERM: what `stop` sets before its own handoff
    assert await b.hand_off_leaderships(1.0) == 0
    assert b._leaving_ends is None  # the preStop's end of leaving is cancelled
    b._leave(False)  # (what that end would have done): a stopping broker stays leaving
    assert b.core.leaving
