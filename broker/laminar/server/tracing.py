"""Optional OpenTelemetry traces (`--otel-endpoint`, docs/logging.md "Traces"): a server span
per API request, joined to the caller's trace when its request carries a W3C `traceparent`,
and under an append's span one span per step from HTTP to commit:

* `decode`: the body checked (a binary batch) or encoded as one (JSON);
* `propose`: the batch handed to the partition's Raft leader (its log and in-flight table);
* `commit`: waiting until the batch is committed (replicated to a quorum, durable as
  `--fsync` says) and its append can be answered.

Spans go to an OTLP/HTTP endpoint through a BatchSpanProcessor (a bounded queue, exported by
a thread of its own; the OTEL_BSP_*, OTEL_TRACES_SAMPLER* and OTEL_EXPORTER_OTLP_TRACES_*
variables apply), flushed at a graceful stop.

Without an endpoint nothing of OpenTelemetry is imported and nothing is made per request:
`ENABLED` is False, and `span` hands back one shared context manager that does nothing (the
packages are the `laminar-mq[tracing]` extra, not a dependency).
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiohttp import web
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

#: The service every broker's spans name.
SERVICE_NAME = "laminar"
#: The packages tracing needs: the `tracing` extra of the laminar-mq distribution.
EXTRA = "laminar-mq[tracing]"
REQUIRED_MODULES = ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")
#: An append's steps, the names of their spans (children of the request's).
DECODE = "decode"
PROPOSE = "propose"
COMMIT = "commit"
#: Span attributes (the HTTP ones are OpenTelemetry's semantic conventions).
HTTP_METHOD = "http.request.method"
HTTP_ROUTE = "http.route"
HTTP_STATUS = "http.response.status_code"
REQUEST_ID = "laminar.request_id"
TOPIC = "laminar.topic"
PARTITION = "laminar.partition"
RECORD_COUNT = "laminar.record_count"
FIRST_INDEX = "laminar.first_index"
DUPLICATE = "laminar.duplicate"

#: Tracing is on (`start` ran): read by the request path before anything is made for a span.
ENABLED = False
_provider: TracerProvider | None = None
_tracer: Tracer | None = None
#: What `span` gives while tracing is off: enters as None, reusable, shared.
_NO_SPAN: AbstractContextManager[None] = contextlib.nullcontext()

Handler = Callable[[Any], Awaitable["web.StreamResponse"]]


class TracingUnavailable(RuntimeError):
    """--otel-endpoint was given, but OpenTelemetry is not installed."""


def missing_packages() -> str | None:
    """Why tracing cannot start here (its packages are not installed), or None."""
    missing = [name for name in REQUIRED_MODULES if not _importable(name)]
    if not missing:
        return None
    return (
        f"--otel-endpoint needs OpenTelemetry, which is not installed ({', '.join(missing)} "
        f"missing): install the extra `pip install '{EXTRA}'`, or leave --otel-endpoint unset"
    )


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or None in sys.modules
        return False


def start(endpoint: str, node: str, worker: int) -> None:
    """Trace this process's API requests to `endpoint` (OTLP/HTTP), its spans' resource
    naming the service `laminar`, the node and its worker (TracingUnavailable: the packages
    are missing)."""
    global ENABLED, _provider, _tracer
    problem = missing_packages()
    if problem is not None:
        raise TracingUnavailable(problem)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create(
        {
            "service.name": SERVICE_NAME,
            "service.instance.id": node,
            "laminar.node": node,
            "laminar.worker": worker,
        }
    )
    # the sampler is the SDK's default unless OTEL_TRACES_SAMPLER says otherwise: every
    # request, or as the caller's trace decided
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    _provider = provider
    _tracer = provider.get_tracer("laminar.server")
    ENABLED = True


def shutdown() -> None:
    """Export the spans still queued and stop (a graceful stop; bounded by the exporter's
    timeout, OTEL_EXPORTER_OTLP_TRACES_TIMEOUT, 10 s by default). Nothing when off."""
    global ENABLED, _provider, _tracer
    provider, _provider = _provider, None
    ENABLED = False
    _tracer = None
    if provider is not None:
        provider.shutdown()


async def serve(
    request: Any,
    handler: Handler,
    route: str | None,
    request_id: str,
) -> web.StreamResponse:
    """`handler(request)` in a server span named by its method and `route` (its template),
    the child of the caller's span when its headers carry one (`traceparent`)."""
    from opentelemetry import propagate
    from opentelemetry.trace import SpanKind, StatusCode

    assert _tracer is not None
    method = request.method
    attributes: dict[str, str] = {HTTP_METHOD: method, REQUEST_ID: request_id}
    if route is not None:
        attributes[HTTP_ROUTE] = route
    parent = propagate.extract(request.headers)  # (a case-insensitive mapping)
    with _tracer.start_as_current_span(
        f"{method} {route}" if route else method,
        context=parent,
        kind=SpanKind.SERVER,
        attributes=attributes,
    ) as span:
        try:
            response = await handler(request)
        except Exception as e:
            status = getattr(e, "status", None)  # aiohttp's HTTP exceptions (redirects)
            if isinstance(status, int):
                span.set_attribute(HTTP_STATUS, status)
            raise
        span.set_attribute(HTTP_STATUS, response.status)
        if response.status >= 500:  # (4xx are the client's: not the server span's error)
            span.set_status(StatusCode.ERROR)
        return response


def span(
    name: str, topic: str, partition: int, records: int | None = None
) -> AbstractContextManager[Span | None]:
    """A span of an append's step `name` (DECODE, PROPOSE, COMMIT), the current span's child,
    entered as the span; while tracing is off, a shared context manager that enters as None
    (nothing is made)."""
    if not ENABLED or _tracer is None:
        return _NO_SPAN
    attributes: dict[str, str | int] = {TOPIC: topic, PARTITION: partition}
    if records is not None:
        attributes[RECORD_COUNT] = records
    return _tracer.start_as_current_span(name, attributes=attributes)
