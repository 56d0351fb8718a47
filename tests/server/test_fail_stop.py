"""A failed write or fdatasync stops the broker (fail-stop): the round it interrupted may be
half persisted, and after a failed fdatasync the kernel may already have dropped the pages a
retry would claim durable. A restart recovers from what is on disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from laminar.log.errors import SegmentError
from laminar.node.core import Round
from laminar.server.config import BrokerConfig, new_secret
from laminar.server.node import Broker


@pytest.mark.parametrize("error", [SegmentError("fdatasync failed: EIO"), OSError(28, "ENOSPC")])
async def test_a_storage_failure_in_a_round_stops_the_driver(
    tmp_path: Path, error: Exception
) -> None:
    broker = Broker(BrokerConfig("n1", tmp_path, secret=new_secret(), allow_anonymous=True))
    rounds = 0

    def failing() -> Round:
        nonlocal rounds
        rounds += 1
        raise error

    broker.core.begin = failing  # type: ignore[method-assign]
    broker.wake()
    await broker._drive()  # returns: it does not retry the round
    assert broker.failed.is_set() and rounds == 1


async def test_other_errors_are_logged_and_the_driver_goes_on(tmp_path: Path) -> None:
    broker = Broker(BrokerConfig("n1", tmp_path, secret=new_secret(), allow_anonymous=True))
    rounds = 0

    def flaky() -> Round | None:
        nonlocal rounds
        rounds += 1
        if rounds == 1:
            broker.wake()  # (the next tick)
            raise RuntimeError("a bug")
        broker.core.stopping = True
        return None

    broker.core.begin = flaky  # type: ignore[method-assign]
    broker.wake()
    await broker._drive()
    assert rounds == 2 and not broker.failed.is_set()
