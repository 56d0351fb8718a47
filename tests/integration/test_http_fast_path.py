"""The API's HTTP/1.1 fast path (laminar.server.h1) on a real broker, over raw connections:
pipelined requests, bodies that arrive in pieces or after their answer, `Connection: close`,
and a connection handed over to aiohttp between two requests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson

from laminar.local_cluster import LocalCluster

from .conftest import TOKEN
from .test_bad_input import connect

TIMEOUT_S = 10.0


@asynccontextmanager
async def opened(cluster: LocalCluster) -> AsyncIterator[tuple[Any, Any]]:
    reader, writer = await connect(cluster.urls[0])
    try:
        yield reader, writer
    finally:
        writer.close()


async def answer(reader: Any, *, head_only: bool = False) -> tuple[int, dict[str, str], bytes]:
    """The next answer on the connection: status, headers (names lowercased) and body (none
    for the answer to a HEAD, `head_only`)."""
    async with asyncio.timeout(TIMEOUT_S):
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        length = 0 if head_only else int(headers.get("content-length", "0"))
        body = await reader.readexactly(length)
    return int(lines[0].split()[1]), headers, body


def request(
    method: str, path: str, body: bytes = b"", *, token: bool = True, **extra: str
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: laminar"]
    if token:
        lines.append(f"Authorization: Bearer {TOKEN}")
    if body or method == "POST":
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in extra.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def append(topic: str, value: str) -> bytes:
    records = orjson.dumps({"records": [{"value": value}]})
    return request("POST", f"/v1/topics/{topic}/partitions/0/records", records)


async def created(cluster: LocalCluster, topic: str) -> None:
    async with opened(cluster) as (reader, writer):
        body = orjson.dumps({"name": topic, "partitions": 1, "replication_factor": 1})
        writer.write(request("POST", "/v1/topics", body))
        status, _, text = await answer(reader)
        assert status == 201, text
        for _ in range(100):  # until its leader is elected
            writer.write(request("GET", f"/v1/topics/{topic}"))
            _, _, text = await answer(reader)
            if orjson.loads(text)["partition_states"][0]["leader"]:
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"no leader for {topic}")


async def test_pipelined_requests_are_answered_in_order(secured_cluster: LocalCluster) -> None:
    await created(secured_cluster, "pipelined")
    async with opened(secured_cluster) as (reader, writer):
        writer.write(
            append("pipelined", "a")
            + request("GET", "/v1/topics/pipelined/partitions/0/records?from=0")
            + append("pipelined", "b")
            + request("GET", "/v1/topics/pipelined/partitions/0/records?from=0&max_records=5")
        )
        first = await answer(reader)
        read_one = await answer(reader)
        second = await answer(reader)
        read_two = await answer(reader)
    assert (first[0], second[0]) == (200, 200)
    base = orjson.loads(first[2])["base_index"]
    assert orjson.loads(second[2])["base_index"] == base + 1
    assert [r["value"] for r in orjson.loads(read_one[2])["records"]] == ["a"]
    assert [r["value"] for r in orjson.loads(read_two[2])["records"]] == ["a", "b"]
    assert read_two[1]["laminar-next-index"] == str(base + 2)


async def test_a_body_in_pieces_and_a_body_after_its_answer(
    secured_cluster: LocalCluster,
) -> None:
    await created(secured_cluster, "pieces")
    async with opened(secured_cluster) as (reader, writer):
        whole = append("pieces", "in pieces")
        head, _, body = whole.partition(b"\r\n\r\n")
        writer.write(head + b"\r\n\r\n")
        for start in range(0, len(body), 7):
            writer.write(body[start : start + 7])
            await writer.drain()
        status, _, text = await answer(reader)
        assert status == 200, text
        # refused before its body is read (no token): answered, the body read and dropped,
        # and the connection goes on to the next request
        refused = request(
            "POST", "/v1/topics/pieces/partitions/0/records", b'{"records": []}', token=False
        )
        head, _, body = refused.partition(b"\r\n\r\n")
        writer.write(head + b"\r\n\r\n")
        status, headers, text = await answer(reader)
        assert (status, orjson.loads(text)["error"]["code"]) == (401, "unauthorized")
        assert headers.get("connection") != "close"
        writer.write(body + request("GET", "/v1/topics/pieces/partitions/0/records?from=0"))
        status, _, text = await answer(reader)
    assert status == 200, text
    assert [r["value"] for r in orjson.loads(text)["records"]] == ["in pieces"]


async def test_connection_close_is_kept(secured_cluster: LocalCluster) -> None:
    async with opened(secured_cluster) as (reader, writer):
        writer.write(request("GET", "/healthz", Connection="close") + request("GET", "/healthz"))
        status, headers, _ = await answer(reader)
        assert (status, headers["connection"]) == (200, "close")
        async with asyncio.timeout(TIMEOUT_S):
            assert await reader.read() == b""  # closed: the second request is not served


async def test_a_connection_handed_to_aiohttp_between_requests(
    secured_cluster: LocalCluster,
) -> None:
    """A HEAD and a request for no route are aiohttp's to answer: the connection goes on,
    in order, with the requests before and after them."""
    async with opened(secured_cluster) as (reader, writer):
        writer.write(
            request("GET", "/v1/cluster")
            + request("HEAD", "/healthz")
            + request("GET", "/v1/nowhere")
            + request("GET", "/v1/cluster")
        )
        status, _, before = await answer(reader)
        head = await answer(reader, head_only=True)
        missing = await answer(reader)
        status_after, _, after = await answer(reader)
    assert (status, status_after) == (200, 200)
    assert orjson.loads(before)["cluster_id"] == orjson.loads(after)["cluster_id"]
    assert head[0] == 200 and int(head[1]["content-length"]) > 0
    assert (missing[0], orjson.loads(missing[2])["error"]["code"]) == (404, "not_found")


async def test_appends_answered_without_a_task_look_like_the_others(
    secured_cluster: LocalCluster,
) -> None:
    """A small append is answered by `AppendNow` (laminar.server.append_now), one whose JSON
    body is over its inline bound by `Api.append`: the same headers in the same order, the
    client's request id, and the same fields."""
    await created(secured_cluster, "now")
    records = [orjson.dumps({"records": [{"value": v}]}) for v in ("v", "w" * 2000)]
    answers = []
    async with opened(secured_cluster) as (reader, writer):
        for n, body in enumerate(records):
            path = "/v1/topics/now/partitions/0/records"
            writer.write(request("POST", path, body, X_Request_Id=f"now-{n}"))
            answers.append(await answer(reader))
    (small_status, small_headers, small), (large_status, large_headers, large) = answers
    assert (small_status, large_status) == (200, 200)
    assert list(small_headers) == list(large_headers)
    assert (small_headers["x-request-id"], large_headers["x-request-id"]) == ("now-0", "now-1")
    assert small_headers["content-type"] == large_headers["content-type"]
    first = orjson.loads(small)
    assert orjson.loads(large) == {**first, "base_index": first["base_index"] + 1}


async def test_an_append_with_a_bad_metadata_index_is_400_and_one_seen_is_taken(
    secured_cluster: LocalCluster,
) -> None:
    """`AppendNow` leaves an append whose Laminar-Metadata-Index it cannot take to
    `Api.append`, which answers a malformed one 400; one this broker has applied is served."""
    await created(secured_cluster, "indexed")
    body = orjson.dumps({"records": [{"value": "v"}]})
    path = "/v1/topics/indexed/partitions/0/records"
    async with opened(secured_cluster) as (reader, writer):
        for value, expected in (("1x", 400), ("99999999999999999999", 400), ("0", 200)):
            writer.write(request("POST", path, body, Laminar_Metadata_Index=value))
            status, _, text = await answer(reader)
            assert status == expected, (value, text)
            if expected == 400:
                assert orjson.loads(text)["error"]["code"] == "bad_request"
