"""`laminar serve`: one broker process — the HTTP API, the peer transport, SWIM and the
driver — until SIGTERM or SIGINT, then a graceful shutdown (hand over leaderships, leave the
gossip group, persist, exit 0)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import sys
from urllib.parse import urlsplit

from .. import allocator
from ..contract import STREAM_APPEND
from ..kube import KubeError
from ..log.storage import OPEN_FILES, raise_open_files_limit
from ..swim.address import format_address
from . import console, logs, tracing
from .api import Api
from .config import BrokerConfig
from .http import ApiRunner, ApiSite, ConnectionLimits
from .kube_status import KubeStatusReporter
from .metrics import BrokerMetrics
from .node import Broker, BrokerError
from .supervisor import STEER_FD_VARIABLE

log = logging.getLogger(__name__)


async def serve(config: BrokerConfig) -> None:
    broker = Broker(config)
    api = Api(broker, BrokerMetrics(broker))
    limits = ConnectionLimits(
        header_timeout_s=config.header_timeout_ms / 1000,
        idle_timeout_s=config.idle_timeout_ms / 1000,
        max_connections_per_client=config.max_connections_per_client,
    )
    # a WebSocket upgrade is aiohttp's to serve, and so is the web console
    runner = ApiRunner(api.app(), limits, aiohttp_paths=(STREAM_APPEND.path, *console.PATHS))
    await runner.setup()
    api.metrics.connections_refused = runner.connections_refused
    site = ApiSite(
        runner,
        config.host,
        config.worker_api_port,
        # HTTPS only when TLS is on; the certificate in use follows its files (broker.tls)
        ssl_context=None if broker.tls is None else broker.tls.api_listener,
        handshake_timeout_s=config.header_timeout_ms / 1000,
    )
    try:
        await site.start()
        steered = os.environ.get(STEER_FD_VARIABLE)
        if steered:  # this worker's socket of the steer port (laminar.server.steering)
            sock = socket.socket(fileno=int(steered))
            await ApiSite(
                runner,
                config.host,
                config.steer_port,
                ssl_context=None if broker.tls is None else broker.tls.api_listener,
                handshake_timeout_s=config.header_timeout_ms / 1000,
                sock=sock,
            ).start()
    except OSError:
        await runner.cleanup()
        raise
    port = int(runner.addresses[0][1]) if runner.addresses else config.worker_api_port
    broker.set_api_addr(format_address(config.public_host, port))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    reporting: asyncio.Task[None] | None = None
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    tls = broker.tls

    def reload() -> None:
        """SIGHUP: re-read the credentials file and the TLS files now (both are polled too)."""
        api.auth.reload()
        if tls is not None:
            tls.reload()

    loop.add_signal_handler(signal.SIGHUP, reload)
    try:
        await broker.start()
        # Long-lived objects made at start leave the collector's view, and young objects
        # are collected less often: fewer, shorter pauses on the request path.
        gc.collect()
        gc.freeze()
        gc.set_threshold(GC_GEN0_THRESHOLD, 20, 20)
        log.info("%s: api %s", broker.id, broker.api_url(broker.api_addr))
        if config.kube_namespace and config.kube_cluster and config.worker == 0:
            try:
                reporter = KubeStatusReporter(
                    api, config.kube_namespace, config.kube_cluster, config.kube_config
                )
            except KubeError as e:
                raise BrokerError(f"cannot report status to Kubernetes: {e}") from e
            reporting = asyncio.create_task(reporter.run())
        failed = asyncio.create_task(broker.failed.wait())
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait((failed, stopped), return_when=asyncio.FIRST_COMPLETED)
        failed.cancel()
        stopped.cancel()
        if broker.failed.is_set():
            raise BrokerError("storage failed: stopped so that a restart recovers from disk")
        log.info("%s: shutting down", broker.id)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(signum)
        if reporting is not None:
            reporting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporting
        with contextlib.suppress(Exception):
            await broker.stop(graceful=not broker.failed.is_set())
        await runner.cleanup()


#: How long a thread waits for the GIL before asking for it (default 5 ms): an fsync that
#: finished in a worker thread should not wait behind request handling that long.
GIL_SWITCH_INTERVAL_S = 0.0005
GC_GEN0_THRESHOLD = 50_000


def run(config: BrokerConfig) -> None:
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    worker = config.worker if config.workers > 1 else None
    logs.configure(config.log_level, config.log_format, config.raft_id, worker)
    if config.otel_endpoint is not None:
        try:
            tracing.start(config.otel_endpoint, config.raft_id, config.worker)
        except tracing.TracingUnavailable as e:
            log.critical("laminar serve: %s", e)
            raise SystemExit(1) from None
        log.info("tracing: spans go to %s", urlsplit(config.otel_endpoint).hostname)
    allocator.keep_read_buffers()
    open_files = raise_open_files_limit()
    log.info("open files: limit %d, at most %d held by log files", open_files, OPEN_FILES.budget)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - a dependency on Linux; plain asyncio works too
        runner = asyncio.run
    else:
        runner = uvloop.run
    try:
        runner(serve(config))
    except (BrokerError, OSError) as e:
        log.critical("laminar serve: %s", e)
        raise SystemExit(1) from None
    finally:
        tracing.shutdown()  # the spans still queued are sent
