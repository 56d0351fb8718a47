"""Real partition replicas on files, driven by hand as the broker's driver would drive them:
a three-voter group whose peers are played by the test (it steps their Raft messages in);
and the broker's real HTTP API serving such a replica."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from aiohttp.web_runner import BaseRunner

from laminar.log.config import LogConfig
from laminar.log.storage import FileDirectory
from laminar.metadata import CreateTopic
from laminar.partition.replica import Replica
from laminar.raft.config import RaftConfig
from laminar.raft.messages import ConfState, Entry, EntryKind, Message, MessageType
from laminar.raft.raft import encode_control
from laminar.server.api import Api
from laminar.server.config import BrokerConfig, new_secret
from laminar.server.http import ApiRunner, ConnectionLimits
from laminar.server.metrics import BrokerMetrics
from laminar.server.node import Broker

VOTERS = ("n1", "n2", "n3")


def open_replica(path: Path, voters: tuple[str, ...] = VOTERS, topic: str = "t") -> Replica:
    directory = FileDirectory(str(path))
    return Replica(
        topic, 0, "n1", directory, LogConfig(segment_bytes=4096), RaftConfig(), ConfState(voters)
    )


def drive(replica: Replica) -> None:
    """What the broker's driver does with each Ready (messages to peers are dropped: the
    test answers for the peers itself)."""
    while replica.raft.has_ready():
        ready = replica.raft.ready()
        if ready.entries:
            replica.storage.append(ready.entries)
            replica.storage.sync()
        if ready.hard_state is not None:
            replica.storage.set_hard_state(ready.hard_state)
        if ready.committed is not None:
            replica.on_committed(*ready.committed)
        replica.raft.advance(ready)
        replica.on_leadership()


def elect(replica: Replica, voter: str = "n2") -> None:
    """n1 wins an election with `voter`'s pre-vote and vote."""
    raft = replica.raft
    raft.campaign()
    drive(replica)
    raft.step(Message(MessageType.PRE_VOTE_RESP, raft.group, voter, raft.id, raft.term + 1))
    drive(replica)
    raft.step(Message(MessageType.VOTE_RESP, raft.group, voter, raft.id, raft.term))
    drive(replica)
    assert replica.is_leader


def depose(replica: Replica, leader: str = "n2") -> None:
    """`leader` was elected in a later term and makes itself heard: n1 steps down."""
    raft = replica.raft
    raft.step(Message(MessageType.HEARTBEAT, raft.group, leader, raft.id, raft.term + 1))
    drive(replica)
    assert not replica.is_leader and raft.lead == leader


def noop(index: int, term: int) -> Entry:
    """The no-op a new leader of `term` appends at `index`."""
    return Entry(index, 1, term, encode_control(EntryKind.NOOP), EntryKind.NOOP)


def append_from(
    replica: Replica,
    leader: str,
    term: int,
    after: int,
    entries: Sequence[Entry] = (),
    *,
    commit: int,
) -> None:
    """`leader` of `term` sends `entries` following index `after` (which it holds with the
    term n1 has there), and its commit index."""
    raft = replica.raft
    raft.step(
        Message(
            MessageType.APPEND,
            raft.group,
            leader,
            raft.id,
            term,
            log_term=raft.log.term(after) or 0,
            index=after,
            entries=tuple(entries),
            commit=commit,
        )
    )
    drive(replica)


def ack(replica: Replica, voter: str = "n2") -> None:
    """`voter` has (and persisted) everything the leader n1 sent: n1 commits it."""
    raft = replica.raft
    last = raft.log.last_index()
    raft.step(Message(MessageType.APPEND_RESP, raft.group, voter, raft.id, raft.term, index=last))
    drive(replica)


async def until(condition: Callable[[], object]) -> None:
    """Wait for `condition` to hold (requests in flight get to run meanwhile)."""
    while not condition():
        await asyncio.sleep(0.01)


class FastTestServer(TestServer):
    """aiohttp's test server on the API's runner: its connections take the fast path."""

    async def _make_runner(self, **_: Any) -> BaseRunner:
        return ApiRunner(self.app, ConnectionLimits())


@asynccontextmanager
async def serving(
    tmp_path: Path, request_timeout_ms: int = 60_000, *, fast: bool = False
) -> AsyncIterator[tuple[TestClient, Replica, list[str]]]:
    """An HTTP client of a broker (never started: no peers, no driver) hosting partition t/0,
    whose replica n1 leads; and what asyncio reports to the loop's exception handler (checked
    empty at the end, after a collection). `fast`: served as `laminar serve` serves, through
    the HTTP/1.1 fast path (laminar.server.h1), else by aiohttp's own server."""
    reported: list[str] = []
    asyncio.get_running_loop().set_exception_handler(
        lambda _, context: reported.append(context["message"])
    )
    config = BrokerConfig(  # (the API open: authorization is tests/integration/test_auth.py's)
        "n1",
        tmp_path / "broker",
        secret=new_secret(),
        request_timeout_ms=request_timeout_ms,
        allow_anonymous=True,
    )
    broker = Broker(config)
    broker.core.state.apply(0, CreateTopic("t", 1, 3, {}, (VOTERS,)))
    replica = open_replica(tmp_path / "t-0")
    broker.core.replicas[replica.group] = replica
    elect(replica)
    api = Api(broker, BrokerMetrics(broker))
    server = (FastTestServer if fast else TestServer)(api.app(), host="127.0.0.1")
    async with TestClient(server) as client:
        broker.set_api_addr(f"{client.host}:{client.port}")  # what describe_topic tells
        yield client, replica, reported
    replica.close()
    gc.collect()
    assert reported == []
