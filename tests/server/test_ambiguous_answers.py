"""What the API answers when it does not know whether a write committed (504), when nothing
was done (503), and that no failure is left for asyncio to report as never retrieved.

The real HTTP handlers over a real partition replica (files, Raft): the test plays the
broker's driver and the replica's two peers, stepping their Raft messages in, so a leader
steps down exactly while a request waits (docs/api.md, "All errors").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from laminar.partition.replica import Replica
from laminar.server.api import Api
from tests.replicas import ack, append_from, depose, drive, noop, serving, until

RECORDS = "/v1/topics/t/partitions/0/records"
GROUP = "/v1/topics/t/partitions/0/groups/g"


Serving = AbstractAsyncContextManager[tuple[TestClient, Replica, list[str]]]


@pytest.fixture(params=["aiohttp", "fast path"])
def appends(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., Serving]:
    """`serving` for appends: by aiohttp's server (`Api.append`), or through the HTTP/1.1 fast
    path, whose `AppendNow` must answer them itself (`Api.append` fails the test)."""
    fast = request.param == "fast path"
    if fast:

        async def refused(*_: Any) -> web.Response:
            raise AssertionError("Api.append served an append AppendNow should have taken")

        monkeypatch.setattr(Api, "append", refused)
    return lambda **kwargs: serving(tmp_path, fast=fast, **kwargs)


def error_of(status: int, body: Any) -> tuple[int, str, str]:
    return status, body["error"]["code"], body["error"]["message"]


async def post(client: TestClient, path: str, body: Any) -> tuple[int, Any]:
    async with client.post(path, json=body) as response:
        return response.status, await response.json()


async def test_an_append_whose_leader_stepped_down_is_answered_when_its_index_commits(
    appends: Callable[..., Serving],
) -> None:
    """A leader that steps down (a transfer, an election) keeps the append waiting: the next
    leader commits the entry, and the client is told it was written."""
    async with appends() as (client, replica, _):
        answer = asyncio.create_task(post(client, RECORDS, {"records": [{"value": "v"}]}))
        await until(lambda: replica.pending)
        (base,) = replica.pending
        drive(replica)  # written here and sent to the peers, not acknowledged
        depose(replica)  # n2 won an election: n1 cannot know whether n2 has the entry
        await asyncio.sleep(0)
        assert not answer.done()
        # n2 had it: it commits it, and the waiting append learns so as a follower
        term = replica.raft.term
        append_from(replica, "n2", term, base, [noop(base + 1, term)], commit=base + 1)
        status, body = await answer
        assert (status, body["base_index"]) == (200, base)
        async with client.get(RECORDS, params={"from": base}) as response:
            records = (await response.json())["records"]
        assert [(r["index"], r["value"]) for r in records] == [(base, "v")]


async def test_an_append_whose_index_the_next_leader_took_is_503(
    appends: Callable[..., Serving],
) -> None:
    async with appends() as (client, replica, _):
        answer = asyncio.create_task(post(client, RECORDS, {"records": [{"value": "v"}]}))
        await until(lambda: replica.pending)
        (base,) = replica.pending
        drive(replica)
        # n2 never got it: its own no-op takes the index, committed
        term = replica.raft.term + 1
        append_from(replica, "n2", term, base - 1, [noop(base, term)], commit=base)
        status, code, message = error_of(*await answer)
        assert (status, code) == (503, "unavailable")
        assert "not written" in message


async def test_an_append_waiting_when_the_replica_closes_is_504(
    appends: Callable[..., Serving],
) -> None:
    async with appends() as (client, replica, _):
        answer = asyncio.create_task(post(client, RECORDS, {"records": [{"value": "v"}]}))
        await until(lambda: replica.pending)
        drive(replica)  # on disk here: a restarted n1 may still commit it
        replica.close()
        assert error_of(*await answer)[:2] == (504, "outcome_unknown")


async def test_an_append_not_committed_in_time_is_504_and_may_still_commit(
    appends: Callable[..., Serving],
) -> None:
    """The request timeout ends the wait, not the append: the entry stays in the log, and a
    later commit answers nobody but makes it readable (APPEND_MAY_COMMIT)."""
    async with appends(request_timeout_ms=200) as (client, replica, _):
        answer = asyncio.create_task(post(client, RECORDS, {"records": [{"value": "late"}]}))
        await until(lambda: replica.pending)
        (base,) = replica.pending
        drive(replica)  # written here; no peer acknowledges it before the timeout
        status, code, message = error_of(*await answer)
        assert (status, code) == (504, "timeout")
        assert "may" in message
        pending = replica.pending[base].future
        assert not pending.done()  # the wait timed out; what it waited on did not
        ack(replica)  # n2 has it now: committed
        assert pending.result() == base
        async with client.get(RECORDS, params={"from": base}) as response:
            records = (await response.json())["records"]
        assert [(r["index"], r["value"]) for r in records] == [(base, "late")]


async def accept_written(client: TestClient, replica: Replica) -> asyncio.Task[tuple[int, Any]]:
    """An accept, proposed and written on the leader, waiting for its commit."""
    groups = replica.groups
    assert groups is not None
    body = {"consumer": "c", "indexes": [0]}
    answer = asyncio.create_task(post(client, GROUP + "/accept", body))
    await until(lambda: groups._waiters)
    drive(replica)
    return answer


async def test_a_queue_command_not_committed_in_time_is_504(tmp_path: Path) -> None:
    async with serving(tmp_path, request_timeout_ms=200) as (client, replica, _):
        groups = replica.groups
        assert groups is not None
        answer = await accept_written(client, replica)
        status, code, _ = error_of(*await answer)
        assert (status, code) == (504, "timeout")
        ack(replica)  # committed after all: its waiter is answered, with nobody listening
        await until(lambda: not groups._waiters)


async def test_a_queue_command_whose_leader_stepped_down_is_504(tmp_path: Path) -> None:
    async with serving(tmp_path) as (client, replica, _):
        answer = await accept_written(client, replica)
        depose(replica)
        status, code, message = error_of(*await answer)
        assert (status, code) == (504, "outcome_unknown")
        assert "repeating an accept" in message


@pytest.mark.parametrize("fast", [False, True], ids=["aiohttp", "fast path"])
async def test_a_request_refused_before_anything_was_proposed_is_no_504(
    tmp_path: Path, fast: bool
) -> None:
    """(On the fast path, `AppendNow` leaves the append to `Api.append`, which answers it.)"""
    async with serving(tmp_path, fast=fast) as (client, replica, _):
        depose(replica)  # no address known for n2: nothing to redirect to
        for path, body in (
            (RECORDS, {"records": [{"value": "v"}]}),
            (GROUP + "/accept", {"consumer": "c", "indexes": [0]}),
        ):
            status, code, _ = error_of(*await post(client, path, body))
            assert (status, code) == (503, "unavailable"), path


async def test_long_polls_interrupted_by_the_replica_closing_are_503(tmp_path: Path) -> None:
    async with serving(tmp_path) as (client, replica, _):
        groups = replica.groups
        assert groups is not None

        async def read() -> tuple[int, Any, str | None]:
            query = {"from": replica.log_end, "wait_ms": 30_000}
            async with client.get(RECORDS, params=query) as response:
                retry = response.headers.get("Retry-After")
                return response.status, await response.json(), retry

        async def acquire() -> tuple[int, Any, str | None]:
            body = {"consumer": "c", "wait_ms": 30_000}
            async with client.post(GROUP + "/acquire", json=body) as response:
                retry = response.headers.get("Retry-After")
                return response.status, await response.json(), retry

        reading = asyncio.create_task(read())
        acquiring = asyncio.create_task(acquire())
        await until(lambda: replica._committed._waiters and groups._parked)
        replica.close()  # the broker stops, or dropped the replica: not "nothing new yet"
        for answer in (reading, acquiring):
            status, body, retry = await answer
            assert (status, body["error"]["code"], retry) == (503, "unavailable", "1")


async def test_every_request_to_a_closed_replica_is_503(tmp_path: Path) -> None:
    async with serving(tmp_path) as (client, replica, _):
        replica.close()
        for method, path, body in (
            ("GET", RECORDS + "?from=0", None),  # committed here: the log is closed
            ("GET", RECORDS, None),
            ("POST", RECORDS, {"records": [{"value": "v"}]}),
            ("POST", GROUP + "/acquire", {"consumer": "c"}),
            ("POST", GROUP + "/accept", {"consumer": "c", "indexes": [0]}),
        ):
            async with client.request(method, path, json=body) as response:
                answer = response.status, (await response.json())["error"]["code"]
            assert answer == (503, "unavailable"), (method, path)
