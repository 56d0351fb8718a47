"""The brokers' log lines (docs/logging.md): `--log-format json` makes every line of a broker's
output one JSON object with its node, and the lines logged while a request is served carry
its request id, topic and partition; `X-Request-Id` is echoed (a client's valid one, else a new
one), on errors too; `--log-level` filters; the workers of a supervisor log as it does; bad
values are refused before anything starts. The formatters themselves, in process."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from laminar.client import AsyncClient
from laminar.local_cluster import LocalCluster
from laminar.server.config import new_secret
from laminar.server.logs import (
    REQUEST,
    JsonFormatter,
    LogFormat,
    LogLevel,
    RequestContext,
    TextFormatter,
    configure,
    rfc3339_ms,
)
from laminar.server.request_context import REQUEST_ID_HEADER, _printable

from .conftest import auth, make_cluster, wait_until

pytestmark = pytest.mark.integration

JSON_DEBUG = ("--log-format", "json", "--log-level", "debug")
TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
GENERATED_ID = re.compile(r"[0-9a-f]{32}")
#: the line a broker (a worker) logs once it serves: "<node>: api <url>"
API_LINE = re.compile(r"\S+: api https?://")
RECORDS = "/v1/topics/{topic}/partitions/{partition}/records"


def log_lines(cluster: LocalCluster, node: str = "n1") -> list[str]:
    """The broker's whole lines so far (one being written is left out)."""
    text = (cluster.nodes[node].data_dir / "broker.log").read_text()
    return text.split("\n")[:-1]


def json_lines(cluster: LocalCluster, node: str = "n1") -> list[dict[str, Any]]:
    """Every line of the broker's output as the JSON object it must be (AssertionError: a
    line that is not one, with the line)."""
    out = []
    for line in log_lines(cluster, node):
        try:
            document = json.loads(line)
        except ValueError:
            raise AssertionError(f"not a JSON line: {line!r}") from None
        assert isinstance(document, dict), line
        assert {"ts", "level", "logger", "message", "node"} <= set(document), line
        assert TS.fullmatch(document["ts"]), line
        assert document["level"] in ("debug", "info", "warning", "error", "critical"), line
        out.append(document)
    return out


@pytest.fixture
def json_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = make_cluster(tmp_path / "json", 1, extra_args=JSON_DEBUG)
    yield cluster
    cluster.stop()


async def test_json_lines_carry_the_node_and_the_requests_id_topic_and_partition(
    json_cluster: LocalCluster,
) -> None:
    cluster = json_cluster
    base = cluster.urls[0]
    async with AsyncClient(cluster.urls, token=cluster.token) as client:
        await client.create_topic("logged", partitions=2, replication_factor=1)
        await client.wait_for_leaders("logged")
    appended = {"records": [{"value": "v"}]}
    async with aiohttp.ClientSession(headers=auth(cluster)) as session:
        # a client's id: echoed, on a success and on an error (no such topic)
        url = base + RECORDS.format(topic="logged", partition=1)
        headers = {REQUEST_ID_HEADER: "abc-123"}
        async with session.post(url, json=appended, headers=headers) as response:
            assert response.status == 200, await response.text()
            assert response.headers[REQUEST_ID_HEADER] == "abc-123"
        missing = base + RECORDS.format(topic="missing", partition=0)
        headers = {REQUEST_ID_HEADER: "err-1.x_Y"}
        async with session.post(missing, json=appended, headers=headers) as response:
            assert response.status == 404
            assert response.headers[REQUEST_ID_HEADER] == "err-1.x_Y"
        # none, or one that is not 1-64 of [A-Za-z0-9._-]: a new one
        given: list[str] = []
        for headers in ({}, {REQUEST_ID_HEADER: "a b"}, {REQUEST_ID_HEADER: "x" * 65}):
            async with session.get(base + "/v1/topics", headers=headers) as response:
                assert response.status == 200
                given.append(response.headers[REQUEST_ID_HEADER])
        assert all(GENERATED_ID.fullmatch(rid) for rid in given), given
        assert len(set(given)) == 3
        # an error aiohttp's own path answers (a HEAD takes it; no route: 404)
        async with session.head(base + "/v1/nothing-here", headers={REQUEST_ID_HEADER: "h-1"}) as r:
            assert r.status == 404 and r.headers[REQUEST_ID_HEADER] == "h-1"

    # a WebSocket upgrade (a streaming append): its handler sends the answer itself
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(
            (
                f"GET {RECORDS.format(topic='logged', partition=0)}/stream HTTP/1.1\r\n"
                f"Host: {host}\r\nAuthorization: {auth(cluster)['Authorization']}\r\n"
                "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nX-Request-Id: ws-1\r\n\r\n"
            ).encode()
        )
        head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).decode()
    finally:
        writer.close()
        await writer.wait_closed()  # (the stream ends: the broker stops without waiting for it)
    assert head.startswith("HTTP/1.1 101 ") and "\r\nX-Request-Id: ws-1\r\n" in head, head

    def line_of(rid: str) -> dict[str, Any] | None:
        return next((d for d in json_lines(cluster) if d.get("request_id") == rid), None)

    async def logged() -> bool:
        return all(line_of(rid) is not None for rid in ("abc-123", "err-1.x_Y", "h-1", "ws-1"))

    await wait_until("the requests' log lines", logged, timeout_s=10)
    ok, failed = line_of("abc-123"), line_of("err-1.x_Y")
    assert ok is not None and failed is not None
    assert ok["level"] == "debug" and ok["node"] == "n1" and "worker" not in ok
    assert (ok["topic"], ok["partition"]) == ("logged", 1)
    assert ok["message"].startswith("POST /v1/topics/logged/partitions/1/records: 200 in ")
    assert (failed["topic"], failed["partition"]) == ("missing", 0)
    assert ": 404 in " in failed["message"]
    streamed = line_of("ws-1")  # logged once the stream ended
    assert streamed is not None and (streamed["topic"], streamed["partition"]) == ("logged", 0)
    assert "/records/stream: 101 in " in streamed["message"]
    # a line outside any request has no request context
    started = [d for d in json_lines(cluster) if API_LINE.match(d["message"])]
    assert len(started) == 1 and "request_id" not in started[0]

    assert cluster.stop_node("n1") == 0
    lines = json_lines(cluster)  # every line, to the graceful stop's
    assert all(d["node"] == "n1" for d in lines)
    assert any(d["message"] == "n1: shutting down" for d in lines)


def test_warning_level_writes_warnings_and_leaves_out_info(tmp_path: Path) -> None:
    """--allow-anonymous logs a warning at start; the info lines of a start and a graceful
    stop are left out (text lines: their level is the third field)."""
    extra = ("--log-level", "warning", "--allow-anonymous")
    cluster = make_cluster(tmp_path / "warning", 1, extra_args=extra)
    try:
        assert cluster.stop_node("n1") == 0
        lines = log_lines(cluster)
    finally:
        cluster.stop()
    levels = [line.split(" ")[3] for line in lines]
    assert "WARNING" in levels, lines
    assert set(levels) <= {"WARNING", "ERROR", "CRITICAL"}, lines
    assert any("--allow-anonymous" in line for line in lines)


def test_a_supervisors_workers_log_as_it_does(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path / "workers", 1, workers=2, extra_args=JSON_DEBUG)
    try:
        assert cluster.stop_node("n1") == 0
        lines = json_lines(cluster)
    finally:
        cluster.stop()
    started = {(d["node"], d.get("worker")) for d in lines if API_LINE.match(d["message"])}
    assert started == {("n1", 0), ("n1~1", 1)}, lines
    assert any(d["level"] == "debug" and d.get("worker") == 1 for d in lines)


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        (["--log-format", "xml"], {}, "argument --log-format: invalid choice: 'xml'"),
        (["--log-level", "verbose"], {}, "argument --log-level: invalid choice: 'verbose'"),
        ([], {"LAMINAR_LOG_FORMAT": "yaml"}, "LAMINAR_LOG_FORMAT) 'yaml' is not one of text, json"),
        ([], {"LAMINAR_LOG_LEVEL": "loud"}, "LAMINAR_LOG_LEVEL) 'loud' is not one of debug, info"),
    ],
)
def test_bad_values_are_refused_with_the_reason(
    tmp_path: Path, args: list[str], env: dict[str, str], said: str
) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(new_secret())
    command = [sys.executable, "-m", "laminar", "serve", "--node-id", "n1", "--data-dir",
               str(tmp_path / "n1"), "--secret-file", str(secret), "--allow-anonymous",
               *args]  # fmt: skip
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LAMINAR_")}
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env={**clean, **env})
    assert done.returncode == 2, done.stderr
    assert said in done.stderr, done.stderr
    assert not (tmp_path / "n1").exists()  # refused before anything started


# ---- the formatters, in process --------------------------------------------------------------


def record(message: str, level: int = logging.INFO, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            exc_info = sys.exc_info()
    made = logging.LogRecord("laminar.test", level, __file__, 1, message, None, exc_info)
    made.created = 1_700_000_000.0421
    return made


def test_a_json_line_has_the_fields_and_the_context_and_an_exception() -> None:
    formatter = JsonFormatter("n2~1", 1)
    plain = json.loads(formatter.format(record('hello "there"\nnext')))
    assert plain == {
        "ts": "2023-11-14T22:13:20.042Z",
        "level": "info",
        "logger": "laminar.test",
        "message": 'hello "there"\nnext',
        "node": "n2~1",
        "worker": 1,
    }
    token = REQUEST.set(RequestContext("r-1", "t", 3))
    try:
        line = formatter.format(record("failed", logging.ERROR, exc=True))
    finally:
        REQUEST.reset(token)
    assert "\n" not in line
    document = json.loads(line)
    assert (document["request_id"], document["topic"], document["partition"]) == ("r-1", "t", 3)
    assert document["exception"].startswith("Traceback") and "ValueError: boom" in line


def test_a_text_line_is_as_before_with_the_request_id_after_the_message() -> None:
    formatter = TextFormatter("n1")
    assert formatter.format(record("up")).endswith(" n1 INFO up")
    token = REQUEST.set(RequestContext("abc-123"))
    try:
        text = formatter.format(record("failed", logging.ERROR, exc=True))
    finally:
        REQUEST.reset(token)
    first, *rest = text.splitlines()
    assert first.endswith(" n1 ERROR failed request_id=abc-123")
    assert rest[0].startswith("Traceback") and rest[-1] == "ValueError: boom"


def test_the_level_is_the_brokers_and_libraries_stay_at_info() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    saved = root.handlers[:], root.level, logging.getLogger("laminar").level
    try:
        configure(LogLevel.DEBUG, LogFormat.JSON, "n1", stream=stream)
        logging.getLogger("laminar.x").debug("mine")
        logging.getLogger("aiohttp.x").debug("theirs")
        logging.getLogger("aiohttp.x").info("theirs, info")
    finally:
        root.handlers[:], level, broker_level = saved
        root.setLevel(level)
        logging.getLogger("laminar").setLevel(broker_level)
        logging.captureWarnings(False)
    messages = [json.loads(line)["message"] for line in stream.getvalue().splitlines()]
    assert messages == ["mine", "theirs, info"]


def test_rfc3339_milliseconds_never_round_up_to_the_next_second() -> None:
    assert rfc3339_ms(0.9999) == "1970-01-01T00:00:00.999Z"
    assert rfc3339_ms(86_400.5) == "1970-01-02T00:00:00.500Z"


def test_a_logged_path_never_breaks_a_text_line() -> None:
    assert _printable("/v1/topics/a\nb\x1b") == "/v1/topics/a\\nb\\x1b"
    assert _printable("/v1/topics/ünï") == "/v1/topics/ünï"
