"""Clusters of real broker processes on loopback addresses no other test uses.

Each cluster gets its own 127.<a>.<b>.0/24 block (from the pytest worker's pid), so tests and a
user's `laminar local-cluster` (127.0.0.x) never collide, and every broker is stopped at the end.
Every cluster requires a token, as every broker does: its admin token is `cluster.token`
(`auth(cluster)`: the header, for raw HTTP requests).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import aiohttp
import pytest

from laminar.client import AsyncClient
from laminar.client.errors import LaminarError
from laminar.local_cluster import LocalCluster

TOKEN = "integration-test-token"
WAIT_S = 60.0
#: how much of each broker's log a failed test's report shows
LOG_LINES_ON_FAILURE = 60
#: the clusters `make_cluster` made for the running test (`pytest_runtest_makereport`)
_made: list[LocalCluster] = []


def loopback_prefix() -> str:
    rng = random.Random(os.getpid() ^ random.getrandbits(32))
    return f"127.{rng.randint(100, 250)}.{rng.randint(1, 250)}"


def make_cluster(path: Path, nodes: int = 3, **kwargs: object) -> LocalCluster:
    cluster = LocalCluster(path, nodes, prefix=loopback_prefix(), **kwargs)  # type: ignore[arg-type]
    try:
        cluster.start()
    except BaseException:
        logs = "\n".join(f"--- {n}\n{cluster.tail(n)}" for n in cluster.nodes)
        cluster.stop()
        raise RuntimeError(f"the cluster did not start:\n{logs}") from None
    _made.append(cluster)
    return cluster


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item) -> Iterator[None]:
    """A failed test's report ends with the end of each broker's log of the clusters it
    made (CI keeps only its output: a race is found from what the brokers said)."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed:
        for cluster in _made:
            for node in cluster.nodes:
                title = f"{node}'s broker.log (last {LOG_LINES_ON_FAILURE} lines)"
                report.sections.append((title, cluster.tail(node, LOG_LINES_ON_FAILURE)))
    if report.when == "teardown":
        _made.clear()


def auth(cluster: LocalCluster, token: str | None = None) -> dict[str, str]:
    """The Authorization header of `cluster`'s admin token (or of `token`)."""
    return {"Authorization": f"Bearer {token or cluster.token}"}


@pytest.fixture(scope="module")
def cluster3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three brokers (fsync always) shared by the tests of one module."""
    cluster = make_cluster(tmp_path_factory.mktemp("cluster3"))
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def secured_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One broker whose admin token is TOKEN (a token chosen, not made)."""
    cluster = make_cluster(tmp_path_factory.mktemp("secured"), 1, token=TOKEN)
    yield cluster
    cluster.stop()


async def wait_until(
    what: str, check: Callable[[], Awaitable[object]], timeout_s: float = WAIT_S
) -> None:
    """Poll `check` until it returns True (errors of a cluster in motion count as not yet)."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = await check()
        except (LaminarError, aiohttp.ClientError, OSError) as e:
            last = e
        if last is True:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def interruptible() -> None:
    """`preexec_fn` for a child the test stops with SIGINT (Ctrl-C): a shell that runs the
    tests in the background hands every child SIGINT ignored, and Python then never raises
    KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def settled_log_end(client: AsyncClient, topic: str, partition: int = 0) -> int:
    """`topic`/`partition`'s log end once its leader committed all it appended (its first entry
    is a no-op). A description made between the election and that append says 0, and one made
    before its commit says 1 with nothing readable: neither is where the log rests (CI44)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        state = (await client.describe_topic(topic)).partition_states[partition]
        if state.leader and state.commit_index >= 0 and state.log_end == state.commit_index + 1:
            return state.log_end
        await asyncio.sleep(0.05)
    raise AssertionError(f"{topic}/{partition} did not settle in {WAIT_S} s")
