"""`AppendNow` (laminar.server.append_now), the fast path's appends, on a real replica: what
it logs carries the request's id as the middleware's lines do, and a fault while answering is
a 500 at once, not a connection left waiting for its idle timeout.

The broker's driver and the replica's peers are played by the test (tests/replicas.py)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from laminar.server import append_now, request_context
from laminar.server.api import Api
from laminar.server.logs import REQUEST
from laminar.server.metrics import BrokerMetrics
from tests.replicas import ack, drive, serving, until

RECORDS = "/v1/topics/t/partitions/0/records"
RID = "append-now-1"


class Contexts(logging.Handler):
    """Each line logged, with the request context it was logged in."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.getMessage(), REQUEST.get()))


@pytest.fixture
def contexts() -> Any:
    handler = Contexts()
    logger = logging.getLogger(append_now.__name__)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


@pytest.fixture
def fast_only(monkeypatch: pytest.MonkeyPatch) -> None:
    async def refused(*_: Any) -> web.Response:
        raise AssertionError("Api.append served an append AppendNow should have taken")

    monkeypatch.setattr(Api, "append", refused)
    # AppendNow leaves every append to Api.append while debug lines are logged: a logger an
    # earlier test in this process left at debug would make these tests meaningless
    assert not request_context.log.isEnabledFor(logging.DEBUG), "a logger was left at debug"


@pytest.mark.usefixtures("fast_only")
async def test_a_fault_answering_a_committed_append_is_a_500_with_the_request_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, contexts: Contexts
) -> None:
    def broken(*_: Any) -> None:
        raise RuntimeError("a bug in the answer's bookkeeping")

    monkeypatch.setattr(BrokerMetrics, "appended", broken)
    async with serving(tmp_path, fast=True) as (client, replica, _):

        async def post() -> tuple[int, Any, str | None]:
            body = {"records": [{"value": "v"}]}
            headers = {"X-Request-Id": RID}
            async with client.post(RECORDS, json=body, headers=headers) as response:
                return response.status, await response.json(), response.headers.get("X-Request-Id")

        answer = asyncio.create_task(post())
        await until(lambda: replica.pending or answer.done())
        assert not answer.done(), f"AppendNow did not take the append: {answer.result()}"
        drive(replica)
        ack(replica)  # committed: the answer's callback runs, and fails
        status, body, rid = await asyncio.wait_for(answer, 10)
    assert (status, body["error"]["code"], rid) == (500, "internal", RID)
    failed = [context for message, context in contexts.lines if "answering" in message]
    assert [(c.request_id, c.topic, c.partition) for c in failed] == [(RID, "t", 0)]
