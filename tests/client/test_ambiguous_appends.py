"""How the client deals with appends answered 503 (nothing was written) and 504 (the outcome
is unknown), against the broker's real HTTP API over a real replica whose leadership the test
takes away and gives back (tests/replicas.py): a Producer's idempotent append is retried and
deduplicated; a plain append is repeated after a 503, and never after a 504."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families

from laminar.client import AsyncClient, Producer, Record, RecordMetadata, Timeout
from tests.replicas import ack, append_from, depose, drive, elect, noop, serving, until


async def errors_answered(http: TestClient) -> dict[tuple[str, str], float]:
    """(status, code) -> how many requests the broker answered so (its own counter)."""
    async with http.get("/metrics") as response:
        text = await response.text()
    return {
        (sample.labels["status"], sample.labels["code"]): sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "laminar_request_errors"
        for sample in family.samples
        if sample.name == "laminar_request_errors_total"
    }


async def test_a_plain_append_answered_504_raises_at_once_marked_ambiguous(
    tmp_path: Path,
) -> None:
    async with (
        serving(tmp_path) as (http, replica, _),
        AsyncClient([str(http.make_url(""))], timeout_s=10) as client,
    ):
        append = asyncio.create_task(client.append("t", 0, [Record(b"once")]))
        await until(lambda: replica.pending)
        drive(replica)  # on disk here and maybe at the peers: a restarted n1 may commit it
        replica.close()
        with pytest.raises(Timeout) as info:
            await append
        error = info.value
        assert (error.status, error.code, error.ambiguous) == (504, "outcome_unknown", True)
        assert "may still be committed" in error.message
        # the one attempt the broker answered: not repeated (not even to hear a 503)
        assert await errors_answered(http) == {("504", "outcome_unknown"): 1.0}


async def test_a_plain_append_answered_503_is_repeated_and_written_once(tmp_path: Path) -> None:
    async with (
        serving(tmp_path) as (http, replica, _),
        AsyncClient([str(http.make_url(""))], timeout_s=10) as client,
    ):
        append = asyncio.create_task(client.append("t", 0, [Record(b"again")]))
        await until(lambda: replica.pending)
        (base,) = replica.pending
        drive(replica)
        term = replica.raft.term + 1  # n2 never got it: its no-op takes the index
        append_from(replica, "n2", term, base - 1, [noop(base, term)], commit=base)
        elect(replica)  # the client retries (503s while n2 leads) until n1 leads again
        await until(lambda: replica.pending)
        ack(replica)
        result = await append
        records = (await client.read("t", 0, base)).records
        assert [(r.index, r.value) for r in records] == [(result.base_index, b"again")]
        assert ("503", "unavailable") in await errors_answered(http)


async def test_a_producer_retries_through_504_and_503_and_is_deduplicated(
    tmp_path: Path,
) -> None:
    """The append is not committed within the broker's request timeout (504 timeout), its
    leader steps down (503s while n2 leads), then leads again and commits it: the Producer's
    retries carry the same producer id and sequence, and the record is written once."""
    async with (
        serving(tmp_path, request_timeout_ms=300) as (http, replica, _),
        AsyncClient([str(http.make_url(""))], timeout_s=10) as client,
    ):
        async with Producer(client, "t", partitions=1, linger_ms=0) as producer:
            sent = await producer.send(b"exactly once")
            await until(lambda: replica.pending)
            (base,) = replica.pending
            drive(replica)  # written here, maybe in n2's log too
            timeouts = ("504", "timeout")
            while timeouts not in await errors_answered(http):
                await asyncio.sleep(0.05)
            depose(replica)
            while ("503", "unavailable") not in await errors_answered(http):
                await asyncio.sleep(0.05)
            elect(replica)  # n1 leads again, the entry still in its log
            ack(replica)
            assert await sent == RecordMetadata(0, base)
        records = (await client.read("t", 0, base)).records
        assert [(r.index, r.value) for r in records] == [(base, b"exactly once")]


async def test_a_leadership_change_while_an_append_waits_is_no_error(tmp_path: Path) -> None:
    """Its leader steps down and leads again: the waiting append is answered once its entry
    commits, with no 504 (a leadership transfer needs no retry)."""
    async with (
        serving(tmp_path) as (http, replica, _),
        AsyncClient([str(http.make_url(""))], timeout_s=10) as client,
    ):
        append = asyncio.create_task(client.append("t", 0, [Record(b"kept")]))
        await until(lambda: replica.pending)
        (base,) = replica.pending
        drive(replica)
        depose(replica)
        elect(replica)
        ack(replica)
        assert (await append).base_index == base
        assert await errors_answered(http) == {}
