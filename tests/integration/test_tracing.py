"""OpenTelemetry traces (docs/logging.md "Traces"): a broker given `--otel-endpoint` sends an
append's spans to an OTLP/HTTP receiver (a small one here, on the test's loopback address):
the request's server span in the caller's trace (its `traceparent`), and under it the append's
decode, propose and commit spans with their attributes. Without the flag no exporter runs,
even with the OTEL_* variables set, and OpenTelemetry is not even imported; with it but
without the packages, `laminar serve` refuses to start, naming the extra."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from laminar.client import AsyncClient
from laminar.local_cluster import LocalCluster
from laminar.server.config import new_secret
from laminar.server.tracing import EXTRA

from .conftest import auth, loopback_prefix, wait_until

pytestmark = pytest.mark.integration

RECORDS = "/v1/topics/{topic}/partitions/{partition}/records"
#: the batch span processor exports every 100 ms (default 5 s)
QUICK_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100"}


@dataclass
class Receiver:
    """An OTLP/HTTP traces endpoint: every span exported to it, with its resource's
    attributes."""

    url: str
    spans: list[tuple[dict[str, Any], Span]] = field(default_factory=list)
    requests: int = 0

    def of_trace(self, trace_id: bytes) -> dict[str, tuple[dict[str, Any], Span]]:
        """The spans of a trace, by name (the last of each name)."""
        return {span.name: (res, span) for res, span in self.spans if span.trace_id == trace_id}


def attributes(values: Any) -> dict[str, Any]:
    """OTLP key-values as a dict of plain values."""
    out: dict[str, Any] = {}
    for kv in values:
        kind = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, kind) if kind else None
    return out


@contextlib.asynccontextmanager
async def otlp_receiver() -> AsyncIterator[Receiver]:
    """A Receiver serving on the test's loopback address, until the block ends."""
    host = f"{loopback_prefix()}.2"
    found = Receiver(url="")

    async def export(request: web.Request) -> web.Response:
        found.requests += 1
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        for resource_spans in message.resource_spans:
            resource = attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                found.spans += [(resource, span) for span in scope_spans.spans]
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )

    app = web.Application()
    app.router.add_post("/v1/traces", export)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    port = runner.addresses[0][1]
    found.url = f"http://{host}:{port}/v1/traces"
    try:
        yield found
    finally:
        await runner.cleanup()


async def start_cluster(path: Path, **kwargs: Any) -> LocalCluster:
    """One broker (started in a thread: the receiver answers meanwhile)."""
    cluster = LocalCluster(path, 1, prefix=loopback_prefix(), **kwargs)
    try:
        await asyncio.to_thread(cluster.start)
    except BaseException:
        log = cluster.tail("n1")
        cluster.stop()
        raise RuntimeError(f"the broker did not start:\n{log}") from None
    return cluster


async def append_traced(cluster: LocalCluster, topic: str, trace_id: str, parent_id: str) -> int:
    """Append three records in the caller's span `parent_id` of trace `trace_id`: the first
    index."""
    async with AsyncClient(cluster.urls, token=cluster.token) as client:
        await client.create_topic(topic, partitions=1, replication_factor=1)
        await client.wait_for_leaders(topic)
    headers = {**auth(cluster), "traceparent": f"00-{trace_id}-{parent_id}-01"}
    headers["X-Request-Id"] = "traced-1"
    body = {"records": [{"value": "a"}, {"value": "b"}, {"value": "c"}]}
    url = cluster.urls[0] + RECORDS.format(topic=topic, partition=0)
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json=body, headers=headers) as response,
    ):
        assert response.status == 200, await response.text()
        return int((await response.json())["base_index"])


async def test_an_append_is_traced_from_http_to_commit_in_the_callers_trace(
    tmp_path: Path,
) -> None:
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    trace = bytes.fromhex(trace_id)
    server_name = f"POST {RECORDS}"
    wanted = {server_name, "decode", "propose", "commit"}
    async with otlp_receiver() as receiver:
        extra = ("--otel-endpoint", receiver.url)
        cluster = await start_cluster(tmp_path / "traced", extra_args=extra, env=QUICK_EXPORT)
        try:
            base = await append_traced(cluster, "traced", trace_id, parent_id)

            async def exported() -> bool:
                return wanted <= set(receiver.of_trace(trace))

            await wait_until("the append's spans", exported, timeout_s=30)
        finally:
            await asyncio.to_thread(cluster.stop)
    spans = receiver.of_trace(trace)
    assert set(spans) == wanted  # (the trace is the append's alone)
    resource, server = spans[server_name]
    assert resource["service.name"] == "laminar" and resource["laminar.node"] == "n1"
    assert server.kind == Span.SpanKind.SPAN_KIND_SERVER
    assert server.parent_span_id == bytes.fromhex(parent_id)
    assert attributes(server.attributes) == {
        "http.request.method": "POST",
        "http.route": RECORDS,
        "http.response.status_code": 200,
        "laminar.request_id": "traced-1",
    }
    steps = {name: spans[name][1] for name in ("decode", "propose", "commit")}
    for name, span in steps.items():
        assert span.parent_span_id == server.span_id, name
        assert span.start_time_unix_nano >= server.start_time_unix_nano, name
        assert span.end_time_unix_nano <= server.end_time_unix_nano, name
        got = attributes(span.attributes)
        assert got["laminar.topic"] == "traced" and got["laminar.partition"] == 0, name
        assert got["laminar.record_count"] == 3, name
    # in order: decoded, then proposed, then committed
    assert steps["decode"].end_time_unix_nano <= steps["propose"].start_time_unix_nano
    assert steps["propose"].end_time_unix_nano <= steps["commit"].start_time_unix_nano
    committed = attributes(steps["commit"].attributes)
    assert committed["laminar.first_index"] == base and committed["laminar.duplicate"] is False


async def test_without_the_flag_nothing_is_exported(tmp_path: Path) -> None:
    """Even with the exporter's variables pointing at the receiver: the flag alone turns
    tracing on. A graceful stop would flush what was queued: after it, nothing came."""
    async with otlp_receiver() as receiver:
        env = {**QUICK_EXPORT, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.url}
        cluster = await start_cluster(tmp_path / "untraced", env=env)
        try:
            trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
            await append_traced(cluster, "untraced", trace_id, parent_id)
            assert await asyncio.to_thread(cluster.stop_node, "n1") == 0  # gracefully
        finally:
            await asyncio.to_thread(cluster.stop)
        assert receiver.requests == 0 and receiver.spans == []


def test_opentelemetry_is_not_imported_unless_tracing_is_on() -> None:
    code = (
        "import sys; import laminar.cli, laminar.server.app, laminar.server.api; "
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("workers", ["1", "2"])
def test_the_flag_without_the_packages_is_refused_naming_the_extra(
    tmp_path: Path, workers: str
) -> None:
    """OpenTelemetry made unimportable in the process (as where it is not installed): exit 1,
    before anything starts (with workers: the supervisor, before it starts any)."""
    secret = tmp_path / "secret"
    secret.write_bytes(new_secret())
    args = ["serve", "--node-id", "n1", "--data-dir", str(tmp_path / "n1"), "--secret-file",
            str(secret), "--allow-anonymous", "--workers", workers, "--otel-endpoint",
            "http://127.0.0.1:1/v1/traces"]  # fmt: skip
    code = (
        "import sys; sys.modules['opentelemetry.sdk'] = None; from laminar.cli import main; "
        f"sys.exit(main({args!r}))"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LAMINAR_")}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=clean
    )
    assert done.returncode == 1, done.stderr
    assert f"pip install '{EXTRA}'" in done.stderr and EXTRA == "laminar-mq[tracing]"
    assert "opentelemetry.sdk" in done.stderr
    assert not (tmp_path / "n1" / "workers.json").exists()


def test_an_endpoint_that_is_no_http_url_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(new_secret())
    command = [sys.executable, "-m", "laminar", "serve", "--node-id", "n1", "--data-dir",
               str(tmp_path / "n1"), "--secret-file", str(secret), "--allow-anonymous",
               "--otel-endpoint", "collector:4318"]  # fmt: skip
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LAMINAR_")}
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=clean)
    assert done.returncode == 2
    assert "--otel-endpoint 'collector:4318' must be an http:// or https:// URL" in done.stderr
