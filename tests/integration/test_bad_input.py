"""Bad input against real brokers: every request gets the documented 4xx and changes nothing.

Names (`..`, `/`, 300 characters), unknown topics and partitions, negative, huge or non-ASCII
indexes, malformed JSON (lone surrogates, deep nesting, too many records or values), records
the batch format cannot hold (timestamps, header names and counts), a batch with a wrong
checksum, a body over the limit (declared or sent), requests aiohttp cannot parse, a missing
token; and clients that hold connections (slow heads and bodies, idle or too many sockets).
No input reaches the API's catch-all (a JSON 500 `internal`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from laminar.client import h1
from laminar.local_cluster import LocalCluster
from laminar.log.batch import Record, encode_batch
from laminar.server.http import LINGERING_TIME_S

from .conftest import TOKEN, auth, make_cluster

pytestmark = pytest.mark.integration
BATCH = "application/vnd.laminar.batch"
#: the `limited` broker's connection rules (short, for the tests to be quick)
HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.0
IDLE_TIMEOUT_S = 1.5
MAX_CONNECTIONS = 64
#: how long the broker reads on after an answer to a request whose body it did not read
LINGER_S = LINGERING_TIME_S
#: how late a close may come, on a busy machine
SLACK_S = 3.0


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One broker with short connection timeouts and a small cap of connections per client."""
    cluster = make_cluster(
        tmp_path_factory.mktemp("limited"),
        1,
        extra_args=(
            f"--header-timeout-ms={HEADER_TIMEOUT_S * 1000:.0f}",
            f"--body-timeout-ms={BODY_TIMEOUT_S * 1000:.0f}",
            f"--idle-timeout-ms={IDLE_TIMEOUT_S * 1000:.0f}",
            f"--max-connections-per-client={MAX_CONNECTIONS}",
        ),
    )
    yield cluster
    cluster.stop()


async def call(
    session: aiohttp.ClientSession, method: str, url: str, **kwargs: Any
) -> tuple[int, Any]:
    """One request, following 307s to the leader itself (aiohttp drops the Authorization
    header on a redirect to another host, as curl does)."""
    for _ in range(5):
        async with session.request(method, url, allow_redirects=False, **kwargs) as response:
            if response.status == 307 and "Location" in response.headers:
                url = response.headers["Location"]
                continue
            if response.content_type == "application/json":
                return response.status, await response.json()
            return response.status, await response.read()
    raise AssertionError(f"{method} {url}: redirected too often")


async def state(session: aiohttp.ClientSession, base: str) -> Any:
    """Everything a bad request must leave alone: topics and every partition's records (their
    indexes and values; not the log end, which a leader's no-op moves when leadership moves
    to a partition's preferred leader)."""
    _, topics = await call(session, "GET", f"{base}/v1/topics")
    _, cluster = await call(session, "GET", f"{base}/v1/cluster")
    urls = {m["id"]: m["api_url"] for m in cluster["members"]}
    records = {}
    for topic in topics["topics"]:
        name = topic["name"]
        _, described = await call(session, "GET", f"{base}/v1/topics/{name}")
        for p in described["partition_states"]:
            leader = urls.get(p["leader"], base)  # the leader: no replica lagging behind it
            url = f"{leader}/v1/topics/{name}/partitions/{p['partition']}/records"
            _, read = await call(session, "GET", f"{url}?from={p['log_start']}&max_records=100000")
            records[(name, p["partition"])] = [(r["index"], r["value"]) for r in read["records"]]
    return topics, records


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


async def no_internal_errors(session: aiohttp.ClientSession, cluster: LocalCluster) -> None:
    """No request reached the API's catch-all (a JSON 500 `internal`: a bug) on any broker."""
    for base in cluster.urls:
        _, text = await call(session, "GET", f"{base}/metrics")
        internal = [
            line
            for line in text.decode().splitlines()
            if line.startswith("laminar_request_errors_total{") and 'code="internal"' in line
        ]
        assert not internal, internal


async def refused_connections(cluster: LocalCluster) -> float:
    """The first broker's count of connections it refused over the per-address cap."""
    async with aiohttp.ClientSession() as session:
        _, text = await call(session, "GET", f"{cluster.urls[0]}/metrics")
    (value,) = [
        float(line.split()[1])
        for line in text.decode().splitlines()
        if line.startswith("laminar_http_connections_refused_total ")
    ]
    return value


async def connect(base: str, source: str | None = None) -> tuple[Any, Any]:
    """A raw connection to `base`'s broker, from the loopback address `source` if given."""
    address = urlsplit(base)
    return await asyncio.open_connection(
        address.hostname, address.port, local_addr=(source, 0) if source else None
    )


async def answer_and_close(reader: Any, timeout_s: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection (end of stream or reset),
    and when it closed it (monotonic); AssertionError after `timeout_s`."""
    data = b""
    try:
        async with asyncio.timeout(timeout_s):
            while chunk := await reader.read(1 << 16):
                data += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        raise AssertionError(f"still open after {timeout_s} s; received {data[:200]!r}") from None
    return data, time.monotonic()


def parse_answer(data: bytes) -> tuple[int, dict[str, str], Any]:
    """Status, headers (lower-case names) and body (decoded when JSON) of one raw answer."""
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", len(body)))
    assert len(body) >= length, (status_line, headers, body)
    content = body[:length]
    if headers.get("content-type", "").startswith("application/json"):
        return int(status_line.split()[1]), headers, json.loads(content)
    return int(status_line.split()[1]), headers, content


async def raw(base: str, request: bytes, timeout_s: float = 10.0) -> tuple[int, Any]:
    """Send `request` as it is on a new connection; the answer's status and body, read until
    the body is complete or the server closes the connection."""
    reader, writer = await connect(base)
    data = b""
    try:
        async with asyncio.timeout(timeout_s):
            writer.write(request)
            while chunk := await reader.read(1 << 16):
                data += chunk
                head, found, body = data.partition(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.lower().split(b"\r\n")
                        if line.startswith(b"content-length:")
                    ),
                    None,
                )
                if found and length is not None and len(body) >= length:
                    break
    except ConnectionResetError:
        pass
    finally:
        writer.close()
    status, _, body = parse_answer(data)
    return status, body


async def test_bad_topic_names_and_unknown_resources(cluster3: LocalCluster) -> None:
    base = cluster3.urls[0]
    async with aiohttp.ClientSession(headers=auth(cluster3)) as session:
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
        json_type = {"Content-Type": "application/json"}
        for body_bytes, code, want in [
            # objects nested 60,000 deep overflowed the parser's C stack (orjson before 3.9
            # has no depth limit): the broker died of a segfault
            (b'{"a":' * 60_000 + b"1" + b"}" * 60_000, 400, "bad_request"),
            (b'{"a":' * 150_000 + b"1" + b"}" * 150_000, 413, "payload_too_large"),
            (b'{"name": "\\ud800x", "partitions": 1}', 400, "bad_request"),
            (b'{"name": "x", "partitions": NaN}', 400, "bad_request"),
        ]:
            status, body = await call(
                session, "POST", f"{base}/v1/topics", data=body_bytes, headers=json_type
            )
            expect(status, body, code, want)
        status, body = await call(
            session, "POST", f"{base}/v1/topics", data=b"{}", headers={"Content-Type": "text/x"}
        )
        expect(status, body, 415, "unsupported_media_type")
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
            # digits that are not ASCII: "²" (str.isdigit but not int), full-width and
            # Arabic-Indic zero (int() takes both)
            ("bad-input/partitions/%C2%B2", 400, "bad_request"),
            ("bad-input/partitions/%EF%BC%90", 400, "bad_request"),
            ("bad-input/partitions/%D9%A0", 400, "bad_request"),
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
        await no_internal_errors(session, cluster3)


async def test_bad_reads(cluster3: LocalCluster) -> None:
    base = cluster3.urls[1]
    async with aiohttp.ClientSession(headers=auth(cluster3)) as session:
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
            "from=%C2%B2",  # "²": str.isdigit says yes, int() says no
            "from=%EF%BC%91",  # full-width 1: int() takes it
            "from=%D9%A1",  # Arabic-Indic 1
            "max_records=%DB%B5",  # Extended Arabic-Indic 5
            "isolation=serializable",
            "isolation=READ_COMMITTED",
        ]:
            status, body = await call(session, "GET", f"{url}?{query}")
            expect(status, body, 400, "bad_request")
        # far beyond the end is not an error: nothing is there (yet)
        status, body = await call(session, "GET", f"{url}?from=9223372036854775807")
        assert status == 200 and body["records"] == [], body
        for isolation in ("read_committed", "read_uncommitted", ""):
            status, body = await call(session, "GET", f"{url}?isolation={isolation}")
            assert status == 200, (isolation, body)
        await no_internal_errors(session, cluster3)


async def test_accept_weights_choose_the_read_format(cluster3: LocalCluster) -> None:
    """Reads answer binary only when `Accept` names the batch type with a weight above 0."""
    base = cluster3.urls[1]
    async with aiohttp.ClientSession(headers=auth(cluster3)) as session:
        await ensure_topic(session, base, "bad-input")
        url = f"{base}/v1/topics/bad-input/partitions/0/records"
        status, body = await call(session, "POST", url, json={"records": [{"value": "v"}]})
        assert status == 200, body
        for accept, binary in [
            (BATCH, True),
            (f"application/json, {BATCH}", True),
            (f"{BATCH};q=0.5", True),
            (f"{BATCH.upper()} ; Q=1", True),
            (f"{BATCH};q=0", False),
            (f"{BATCH};q=0.000, application/json", False),
            (f"{BATCH};q=x", False),
            (f"{BATCH}+zip", False),
            ("*/*", False),
            ("application/*", False),
            ("", False),
        ]:
            async with session.get(url, headers={"Accept": accept}) as response:
                assert response.status == 200, accept
                want = BATCH if binary else "application/json"
                assert response.content_type == want, (accept, response.content_type)
        # and acquires, between JSON and the binary deliveries
        acquired = "application/vnd.laminar.acquired"
        _, described = await call(session, "GET", f"{base}/v1/topics/bad-input")
        leader = described["partition_states"][0]["leader_url"]  # (aiohttp's redirects: no token)
        acquire = f"{leader}/v1/topics/bad-input/partitions/0/groups/accept-weights/acquire"
        for accept, binary in [(acquired, True), (f"{acquired};q=0", False), ("*/*", False)]:
            headers = {"Accept": accept}
            async with session.post(acquire, json={"lease_ms": 1}, headers=headers) as response:
                assert response.status == 200, (accept, await response.text())
                want = acquired if binary else "application/json"
                assert response.content_type == want, (accept, response.content_type)
        await no_internal_errors(session, cluster3)


async def test_bad_appends_change_nothing(cluster3: LocalCluster) -> None:
    base = cluster3.urls[2]
    async with aiohttp.ClientSession(headers=auth(cluster3)) as session:
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
            # lone surrogates: in a value, a key, a header name, a header value
            b'{"records": [{"value": "\\ud800"}]}',
            b'{"records": [{"key": "\\udfff", "value": "v"}]}',
            b'{"records": [{"value": "v", "headers": {"\\ud800": "x"}}]}',
            b'{"records": [{"value": "v", "headers": {"h": "a\\udc00"}}]}',
            b'{"records": [{"value": "v", "headers": []}]}',
            # timestamps: valid from 0 to the end of the year 9999, and within 2^31-1 ms of the
            # batch's first one
            b'{"records": [{"value": "v", "timestamp_ms": 9223372036854775808}]}',
            b'{"records": [{"value": "v", "timestamp_ms": 18446744073709551616}]}',
            b'{"records": [{"value": "v", "timestamp_ms": 253402300800000}]}',
            b'{"records": [{"value": "v", "timestamp_ms": -1}]}',
            b'{"records": [{"value": "v", "timestamp_ms": 1.5}]}',
            b'{"records": [{"value": "v", "timestamp_ms": NaN}]}',
            b'{"records": [{"value": "v", "timestamp_ms": 1e400}]}',
            b'{"records": [{"value": "a", "timestamp_ms": 0}, {"value": "b", "timestamp_ms": '
            + str(2**40).encode()
            + b"}]}",
            b'{"records": [{"value": "a", "timestamp_ms": 0}, {"value": "b"}]}',  # b is now
            # header names of 70,000 bytes, 70,000 headers
            json.dumps({"records": [{"value": "v", "headers": {"h" * 70_000: "x"}}]}).encode(),
            json.dumps({"records": [{"value": "v", "headers": {"\u00e9" * 35_000: ""}}]}).encode(),
            json.dumps({"records": [{"headers": {str(i): "" for i in range(70_000)}}]}).encode(),
            # nested 100,000 deep (and objects 50,000 deep: the parser's stack)
            b'{"records": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
            b'{"records": [' + b'{"a":' * 50_000 + b"1" + b"}" * 50_000 + b"]}",
            b'{"records": [{"value": "v"}], "x": ' + b"[" * 40 + b"}" * 40 + b"}",
            b'{"records": [{"value": "v\\"}]}',
        ]:
            status, body = await call(session, "POST", url, data=body_bytes, headers=json_type)
            expect(status, body, 400, "bad_request")
        # at most 32 levels of nesting and 200,000 values: the limits themselves are JSON
        for levels, values, want in [
            (32, 1, "the body must be"),
            (33, 1, "nest deeper than 32"),
            (1, 199_999, "the body must be"),
        ]:
            body_bytes = b"[" * (levels - 1) + b"[" + b",".join([b"1"] * values) + b"]" * levels
            status, body = await call(session, "POST", url, data=body_bytes, headers=json_type)
            expect(status, body, 400, "bad_request")
            assert want in body["error"]["message"], body
        for body_bytes in [
            b"[" + b",".join([b"1"] * 200_000) + b"]",
            b'{"records": [' + b",".join([b'{"value": "v"}'] * 10_001) + b"]}",
        ]:
            status, body = await call(session, "POST", url, data=body_bytes, headers=json_type)
            expect(status, body, 413, "payload_too_large")
        assert await state(session, base) == before
        status, body = await call(session, "POST", url, json={"records": [{}] * 10_000})
        assert status == 200 and body["count"] == 10_000, body
        before = await state(session, base)
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
        # a transaction's batch outside any transaction: it would hold back every later
        # record from read_committed readers
        marked = encode_batch([Record(value=b"x")], producer_id=1 << 16, transactional=True)
        status, body = await call(
            session, "POST", url, data=marked, headers={"Content-Type": BATCH}
        )
        expect(status, body, 409, "conflict")
        assert "no open transaction" in body["error"]["message"]
        huge = encode_batch([Record(value=b"z" * (9 << 20))])
        status, body = await call(session, "POST", url, data=huge, headers={"Content-Type": BATCH})
        expect(status, body, 413, "payload_too_large")
        assert await state(session, base) == before
        # and a good append still works and moves the log end
        status, body = await call(session, "POST", url, json={"records": [{"value": "fine"}]})
        assert status == 200 and body["count"] == 1, body
        after = await state(session, base)
        assert after[1][("bad-input", 1)] > before[1][("bad-input", 1)]
        await no_internal_errors(session, cluster3)


async def test_big_json_bodies_are_refused_before_they_stall_the_broker(
    cluster3: LocalCluster,
) -> None:
    """7.7 MiB of 2.5 million empty records: refused (413) before anything is parsed, and the
    broker keeps answering meanwhile (it used to spend seconds on it, its loop stalled)."""
    async with aiohttp.ClientSession(headers=auth(cluster3)) as session:
        await ensure_topic(session, cluster3.urls[0], "bad-input")
        _, described = await call(session, "GET", f"{cluster3.urls[0]}/v1/topics/bad-input")
        leader = described["partition_states"][1]["leader_url"]
        before = await state(session, leader)
        body = b'{"records": [' + b",".join([b"{}"] * 2_560_000) + b"]}"
        append = asyncio.create_task(
            call(
                session,
                "POST",
                f"{leader}/v1/topics/bad-input/partitions/1/records",
                data=body,
                headers={"Content-Type": "application/json"},
            )
        )
        latencies = []
        deadline = time.monotonic() + 60
        while not append.done() and len(latencies) < 10_000 and time.monotonic() < deadline:
            started = time.monotonic()
            status, _ = await call(session, "GET", f"{leader}/healthz")
            latencies.append(time.monotonic() - started)
            assert status == 200
        status, answer = await append
        expect(status, answer, 413, "payload_too_large")
        assert latencies and max(latencies) < 1.0, max(latencies)
        assert await state(session, leader) == before
        await no_internal_errors(session, cluster3)


async def test_requests_aiohttp_cannot_parse_get_json_errors(cluster3: LocalCluster) -> None:
    """Request smuggling, bad lengths, a bad request line, heads too long: 400 `bad_request`
    in the JSON envelope (aiohttp answers them before any handler; it used to in plain text)."""
    base = cluster3.urls[0]
    async with aiohttp.ClientSession(headers=auth(cluster3)) as session:
        await ensure_topic(session, base, "bad-input")
        before = await state(session, base)
        head = b"POST /v1/topics HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        head += f"Authorization: Bearer {cluster3.token}\r\n".encode()  # not refused for that
        create = b'{"name": "smuggled", "partitions": 1}'
        for request in [
            head + b"Content-Length: 39\r\nTransfer-Encoding: chunked\r\n\r\n" + create,
            head + b"Transfer-Encoding: chunked\r\nContent-Length: 39\r\n\r\n" + create,
            head + b"Content-Length: 39\r\nContent-Length: 38\r\n\r\n" + create,
            head + b"Content-Length: 3x9\r\n\r\n" + create,
            head + b"Content-Length: -39\r\n\r\n" + create,
            head + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n" + create + b"\r\n0\r\n\r\n",
            b"GARBAGE\r\n\r\n",
            b"G@T /v1/topics HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /v1/topics HTTP/9.9.9\r\nHost: x\r\n\r\n",
            b"GET /v1/topics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n",
            b"GET /v1/topics HTTP/1.1\r\nHost: x\r\n" + b"X" * 70_000 + b": a\r\n\r\n",
            b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /v1/topics HTTP/1.1\r\nHost: x\r\n"
            + b"".join(b"X-%d: a\r\n" % i for i in range(1_000))
            + b"\r\n",
            b"GET /v1/topics HTTP/1.1\r\nHost: x\r\nX-A: a\x01b\r\n\r\n",
        ]:
            status, body = await raw(base, request)
            expect(status, body, 400, "bad_request")
        assert await state(session, base) == before
        await no_internal_errors(session, cluster3)


async def test_bodies_the_broker_never_takes_are_refused_before_reading(
    cluster3: LocalCluster,
) -> None:
    """A body declared over --max-request-bytes (default 8 MiB) is 413 at once, before the
    pending-bytes check (it was 429 + Retry-After: clients retried for ever); a compressed
    one is 415 (no inflating on the broker)."""
    base = cluster3.urls[0]
    async with aiohttp.ClientSession(headers=auth(cluster3)) as session:
        await ensure_topic(session, base, "bad-input")
        before = await state(session, base)
        for partition in (0, 1):  # one on this broker's leader or not: 413 either way
            path = f"/v1/topics/bad-input/partitions/{partition}/records"
            head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            head += f"Authorization: Bearer {cluster3.token}\r\n"
            for length in (65 << 20, 10**12, (8 << 20) + 1):
                request = f"{head}Content-Length: {length}\r\n\r\n".encode() + b'{"records"'
                status, body = await raw(base, request)
                expect(status, body, 413, "payload_too_large")
            request = f"{head}Content-Encoding: gzip\r\nContent-Length: 5\r\n\r\nabcde".encode()
            status, body = await raw(base, request)
            expect(status, body, 415, "unsupported_media_type")
        assert await state(session, base) == before
        await no_internal_errors(session, cluster3)


async def test_slow_clients_are_cut_off_while_others_are_served(limited: LocalCluster) -> None:
    """Heads and bodies sent a byte at a time end with a 408 and a closed connection within
    the timeouts (they were held for as long as the client kept sending); meanwhile another
    client is served."""
    base = limited.urls[0]
    slow_head = b"GET /v1/topics HTTP/1.1\r\nHost: x\r\nX-Slow: "
    slow_body = (
        b"POST /v1/topics HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {limited.token}\r\n".encode()  # (else 401 before the body)
        + b'Content-Length: 1000\r\n\r\n{"name": "'
    )
    sockets = []
    for start in [slow_head] * 40 + [slow_body] * 20:
        sockets.append((time.monotonic(), await connect(base, "127.0.0.2"), start))

    async def drip(writer: Any, start: bytes, closed: asyncio.Event) -> None:
        writer.write(start)
        for _ in range(100):  # a byte every 0.3 s: at most 30 s
            try:
                await asyncio.wait_for(closed.wait(), 0.3)
                return
            except TimeoutError:
                pass
            writer.write(b"a")

    async def slow(reader: Any, writer: Any, start: bytes) -> tuple[bytes, float]:
        closed = asyncio.Event()
        dripping = asyncio.create_task(drip(writer, start, closed))
        try:
            return await answer_and_close(reader, HEADER_TIMEOUT_S + LINGER_S + SLACK_S)
        finally:
            closed.set()
            await dripping
            writer.close()

    clients = [asyncio.create_task(slow(r, w, start)) for _, (r, w), start in sockets]
    async with aiohttp.ClientSession(headers=auth(limited)) as session:
        status, body = await call(session, "GET", f"{base}/v1/topics")
        assert status == 200, body
        assert not any(client.done() for client in clients)  # served while they are held
        await no_internal_errors(session, limited)
    results = await asyncio.gather(*clients)
    for (opened, _, start), (data, closed_at) in zip(sockets, results, strict=True):
        timeout_s = HEADER_TIMEOUT_S if start is slow_head else BODY_TIMEOUT_S
        assert closed_at - opened >= timeout_s * 0.9, closed_at - opened
        if data:  # a client that sends as the connection closes may see a reset instead
            status, headers, body = parse_answer(data)
            expect(status, body, 408, "request_timeout")
            assert headers["connection"] == "close"
    assert sum(1 for data, _ in results if data) >= len(results) // 2


async def test_connections_per_client_are_capped(limited: LocalCluster) -> None:
    """A client address holds at most --max-connections-per-client connections: one more is
    answered 429 and closed at once; other clients are served; closed ones free their slot.
    A connection that never sends a request is closed after the header timeout (408)."""
    base = limited.urls[0]
    refused = await refused_connections(limited)
    opened = time.monotonic()
    held = [await connect(base, "127.0.0.3") for _ in range(MAX_CONNECTIONS)]
    reader, writer = await connect(base, "127.0.0.3")
    data, closed_at = await answer_and_close(reader, SLACK_S)
    writer.close()
    assert closed_at - opened < HEADER_TIMEOUT_S  # refused at once, not timed out
    status, headers, body = parse_answer(data)
    expect(status, body, 429, "overloaded")
    assert headers["retry-after"] == "1"
    assert headers["laminar-connection-limit"] == str(MAX_CONNECTIONS)
    assert await refused_connections(limited) == refused + 1
    async with aiohttp.ClientSession(headers=auth(limited)) as session:
        status, body = await call(session, "GET", f"{base}/v1/topics")  # from 127.0.0.1
        assert status == 200, body
        for reader, writer in held:  # idle: closed by the header timeout
            data, closed_at = await answer_and_close(reader, HEADER_TIMEOUT_S + SLACK_S)
            writer.close()
            assert closed_at - opened >= HEADER_TIMEOUT_S * 0.9
            status, _, body = parse_answer(data)
            expect(status, body, 408, "request_timeout")
        reader, writer = await connect(base, "127.0.0.3")  # a slot is free again
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data, _ = await answer_and_close(reader, SLACK_S)
        writer.close()
        status, _, body = parse_answer(data)
        assert (status, body) == (200, {"status": "ok"})
        await no_internal_errors(session, limited)


async def test_a_client_over_the_cap_learns_it_and_every_request_is_served(
    limited: LocalCluster,
) -> None:
    """The client's pool, allowed more connections than the broker lets one address hold,
    opens one for each of as many requests at once: the broker refuses those over its cap,
    the pool learns the cap from the refusal and sends those requests again on the
    connections it holds. Every request is answered, none with the 429."""
    base = limited.urls[0]
    p = h1.Pool(MAX_CONNECTIONS + 32, connect_timeout_s=5.0)
    try:
        deadline = asyncio.get_running_loop().time() + 30.0
        answers = await asyncio.gather(
            *(
                p.request("GET", f"{base}/healthz", {}, None, deadline)
                for _ in range(MAX_CONNECTIONS + 32)
            )
        )
        assert sorted({status for status, _, _ in answers}) == [200]
        cap = p.cap_of(base)
        assert cap is not None and 0 < cap <= MAX_CONNECTIONS
    finally:
        p.close()


async def test_idle_connections_are_closed(limited: LocalCluster) -> None:
    """A keep-alive connection is closed --idle-timeout-ms after its last answer."""
    reader, writer = await connect(limited.urls[0])
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    answered = time.monotonic()
    data, closed_at = await answer_and_close(reader, IDLE_TIMEOUT_S + SLACK_S)
    writer.close()
    assert closed_at - answered >= IDLE_TIMEOUT_S * 0.9
    status, _, body = parse_answer(data)
    assert (status, body) == (200, {"status": "ok"})


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
