"""Bad input against real brokers: every request gets the documented 4xx and changes nothing.

Names (`..`, `/`, 300 characters), unknown topics and partitions, negative or huge indexes,
malformed JSON, a batch with a wrong checksum, a body over the limit, a missing token.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from laminar.local_cluster import LocalCluster
from laminar.log.batch import Record, encode_batch

from .conftest import TOKEN

pytestmark = pytest.mark.integration
BATCH = "application/vnd.laminar.batch"


async def call(
    session: aiohttp.ClientSession, method: str, url: str, **kwargs: Any
) -> tuple[int, Any]:
    async with session.request(method, url, allow_redirects=True, **kwargs) as response:
        if response.content_type == "application/json":
            return response.status, await response.json()
        return response.status, await response.read()


async def state(session: aiohttp.ClientSession, base: str) -> Any:
    """Everything a bad request must leave alone: topics and every partition's log end."""
    _, topics = await call(session, "GET", f"{base}/v1/topics")
    ends = {}
    for topic in topics["topics"]:
        _, described = await call(session, "GET", f"{base}/v1/topics/{topic['name']}")
        for p in described["partition_states"]:
            ends[(topic["name"], p["partition"])] = p["log_end"]
    return topics, ends


async def ensure_topic(session: aiohttp.ClientSession, base: str, name: str) -> None:
    status, body = await call(
        session,
        "POST",
        f"{base}/v1/topics",
        json={"name": name, "partitions": 2, "replication_factor": 3},
    )
    assert status in (201, 409), body
    for _ in range(100):  # wait for leaders
        _, described = await call(session, "GET", f"{base}/v1/topics/{name}")
        if all(p["leader"] for p in described["partition_states"]):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"no leaders for {name}: {described}")


def expect(status: int, body: Any, want_status: int, want_code: str) -> None:
    assert status == want_status, (status, body)
    assert isinstance(body, dict) and body["error"]["code"] == want_code, body
    assert body["error"]["message"]


async def test_bad_topic_names_and_unknown_resources(cluster3: LocalCluster) -> None:
    base = cluster3.urls[0]
    async with aiohttp.ClientSession() as session:
        await ensure_topic(session, base, "bad-input")
        before = await state(session, base)
        for name in ["..", "a/b", "x" * 300, "", "-lead", "sp ace", 7, None]:
            status, body = await call(
                session, "POST", f"{base}/v1/topics", json={"name": name, "partitions": 1}
            )
            expect(status, body, 400, "bad_request")
        for fields in [
            {"name": "ok", "partitions": 0},
            {"name": "ok", "partitions": -3},
            {"name": "ok", "partitions": "2"},
            {"name": "ok", "replication_factor": 99},
            {"name": "ok", "config": {"no_such_key": 1}},
            {"name": "ok", "config": {"segment_bytes": 1}},
            {"name": "ok", "surprise": True},
        ]:
            status, body = await call(session, "POST", f"{base}/v1/topics", json=fields)
            expect(status, body, 400, "bad_request")
        status, body = await call(
            session, "POST", f"{base}/v1/topics", json={"name": "bad-input", "partitions": 2}
        )
        expect(status, body, 409, "conflict")
        status, body = await call(session, "GET", f"{base}/v1/topics/..")
        assert status in (400, 404), body
        status, body = await call(session, "GET", f"{base}/v1/topics/{'y' * 300}")
        expect(status, body, 400, "bad_request")
        status, body = await call(session, "GET", f"{base}/v1/topics/missing")
        expect(status, body, 404, "not_found")
        status, body = await call(session, "DELETE", f"{base}/v1/topics/missing")
        expect(status, body, 404, "not_found")
        records = {"records": [{"value": "v"}]}
        for path, code, want in [
            ("missing/partitions/0", 404, "not_found"),
            ("bad-input/partitions/2", 404, "not_found"),
            ("bad-input/partitions/x", 400, "bad_request"),
            ("bad-input/partitions/99999999999", 400, "bad_request"),
        ]:
            url = f"{base}/v1/topics/{path}/records"
            status, body = await call(session, "POST", url, json=records)
            expect(status, body, code, want)
            status, body = await call(session, "GET", url)
            expect(status, body, code, want)
        status, body = await call(session, "PUT", f"{base}/v1/nodes/nobody/weight", json={})
        expect(status, body, 404, "not_found")
        status, body = await call(
            session, "PATCH", f"{base}/v1/topics/bad-input", json={"partitions": 1}
        )
        expect(status, body, 400, "bad_request")
        status, body = await call(session, "GET", f"{base}/v1/nowhere")
        expect(status, body, 404, "not_found")
        status, body = await call(session, "PUT", f"{base}/v1/topics")
        expect(status, body, 405, "method_not_allowed")
        assert await state(session, base) == before


async def test_bad_reads(cluster3: LocalCluster) -> None:
    base = cluster3.urls[1]
    async with aiohttp.ClientSession() as session:
        await ensure_topic(session, base, "bad-input")
        url = f"{base}/v1/topics/bad-input/partitions/0/records"
        for query in [
            "from=-1",
            "from=99999999999999999999",
            "from=abc",
            "from=1.5",
            "max_records=0",
            "max_records=100001",
            "max_bytes=0",
            "max_bytes=999999999",
            "wait_ms=-5",
            "wait_ms=600001",
        ]:
            status, body = await call(session, "GET", f"{url}?{query}")
            expect(status, body, 400, "bad_request")
        # far beyond the end is not an error: nothing is there (yet)
        status, body = await call(session, "GET", f"{url}?from=9223372036854775807")
        assert status == 200 and body["records"] == [], body


async def test_bad_appends_change_nothing(cluster3: LocalCluster) -> None:
    base = cluster3.urls[2]
    async with aiohttp.ClientSession() as session:
        await ensure_topic(session, base, "bad-input")
        before = await state(session, base)
        url = f"{base}/v1/topics/bad-input/partitions/1/records"
        json_type = {"Content-Type": "application/json"}
        for body_bytes in [
            b"{not json",
            b"[]",
            b'{"records": []}',
            b'{"records": "x"}',
            b'{"records": [1]}',
            b'{"records": [{"value": 5}]}',
            b'{"records": [{"value": "%%%", "encoding": "base64"}]}',
            b'{"records": [{"value": "v", "encoding": "rot13"}]}',
            b'{"records": [{"value": "v", "extra": 1}]}',
            b'{"records": [{"value": "v"}], "producer_id": 1}',
            b'{"records": [{"value": "v"}], "producer_id": -1, "sequence": 0}',
            b"\xff\xfe",
        ]:
            status, body = await call(session, "POST", url, data=body_bytes, headers=json_type)
            expect(status, body, 400, "bad_request")
        status, body = await call(
            session, "POST", url, data=b"v", headers={"Content-Type": "text/plain"}
        )
        expect(status, body, 415, "unsupported_media_type")
        batch = bytearray(encode_batch([Record(value=b"payload")]))
        batch[-1] ^= 0x40  # one flipped bit in the payload
        status, body = await call(
            session, "POST", url, data=bytes(batch), headers={"Content-Type": BATCH}
        )
        expect(status, body, 400, "corrupt_batch")
        status, body = await call(
            session, "POST", url, data=b"LMQB" + b"\x00" * 10, headers={"Content-Type": BATCH}
        )
        expect(status, body, 400, "corrupt_batch")
        control = encode_batch([Record(value=b"x")], control=True)
        status, body = await call(
            session, "POST", url, data=control, headers={"Content-Type": BATCH}
        )
        expect(status, body, 400, "corrupt_batch")
        huge = encode_batch([Record(value=b"z" * (9 << 20))])
        status, body = await call(session, "POST", url, data=huge, headers={"Content-Type": BATCH})
        expect(status, body, 413, "payload_too_large")
        assert await state(session, base) == before
        # and a good append still works and moves the log end
        status, body = await call(session, "POST", url, json={"records": [{"value": "fine"}]})
        assert status == 200 and body["count"] == 1, body
        after = await state(session, base)
        assert after[1][("bad-input", 1)] > before[1][("bad-input", 1)]


async def test_token_required(secured_cluster: LocalCluster) -> None:
    base = secured_cluster.urls[0]
    good = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession() as session:
        for headers in [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}]:
            status, body = await call(session, "GET", f"{base}/v1/topics", headers=headers)
            expect(status, body, 401, "unauthorized")
            status, body = await call(
                session,
                "POST",
                f"{base}/v1/topics",
                json={"name": "secret-topic", "partitions": 1},
                headers=headers,
            )
            expect(status, body, 401, "unauthorized")
            status, body = await call(session, "POST", f"{base}/v1/nodes/n1/drain", headers=headers)
            expect(status, body, 401, "unauthorized")
        status, body = await call(session, "GET", f"{base}/v1/topics", headers=good)
        assert status == 200 and body["topics"] == [], body
        _, cluster = await call(session, "GET", f"{base}/v1/cluster", headers=good)
        assert [m["draining"] for m in cluster["members"]] == [False]
        for path in ["/healthz", "/readyz", "/metrics"]:
            status, _ = await call(session, "GET", base + path)
            assert status == 200, path
