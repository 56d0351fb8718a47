"""The public HTTP API v1 (DESIGN §5, `openapi.yaml`): aiohttp handlers over a `Broker`.

Handler → request router (which replica, or which broker to redirect to) → partition replica.
Every input is validated before anything changes; errors are JSON
`{"error": {"code", "message"}}`. Appends answer once committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
import re
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from aiohttp import ClientSession, ClientTimeout, web

from ..contract import (
    ACKED_INDEX_HEADER,
    ACKED_WAIT_S,
    BATCH_TYPE,
    COMMIT_INDEX_HEADER,
    DEFAULT_READ_BYTES,
    DEFAULT_READ_RECORDS,
    HANDOFF_TIMEOUT_S,
    ISOLATIONS,
    JSON_TYPE,
    LOG_START_HEADER,
    MAX_INDEX,
    MAX_METADATA_INDEX,
    MAX_READ_BYTES,
    MAX_READ_RECORDS,
    MAX_WAIT_MS,
    METADATA_INDEX_HEADER,
    METADATA_WAIT_S,
    NEXT_INDEX_HEADER,
    ROUTES,
    TOPIC_NAME,
    WAIT_FOR_LEADERS,
    WORKER_NODE_ID,
)
from ..credentials import internal_token
from ..log.batch import (
    BATCH_HEADER_BYTES,
    BatchHeader,
    encode_batch,
    parse_header,
    records_from,
    split_batches,
    verify_batch,
    verify_records,
)
from ..log.errors import (
    BatchError,
    BatchTooLargeError,
    CorruptBatchError,
    IndexOutOfRangeError,
    MalformedRecordsError,
)
from ..metadata import (
    AlterTopic,
    CreateTopic,
    DeleteTopic,
    MetadataError,
    SetDraining,
    SetWeight,
)
from ..metadata.state import Topic
from ..models import (
    ABSENT,
    AlterTopicRequest,
    AppendRequest,
    AppendResult,
    ClusterInfo,
    CreateTopicRequest,
    Handoff,
    Member,
    ModelError,
    NodeAdminState,
    NodePartitions,
    NodeTls,
    PartitionList,
    PartitionState,
    ReadResult,
    TopicDescription,
    TopicInfo,
    TopicList,
    WeightRequest,
)
from ..models.checks import JsonModel
from ..partition import status_table
from ..partition.errors import (
    CommitLost,
    CommitUnknown,
    NotLeader,
    Overloaded,
    ReplicaClosed,
    SequenceConflict,
)
from ..partition.replica import Replica
from ..partition.status_table import View
from ..partition.status_table import leaders as view_leaders
from ..raft.raft import Role
from ..workers import worker_ids
from . import request_context, tracing
from .append_now import AppendNow
from .auth import PRINCIPAL_KEY, Authenticator, check_routes
from .deadlines import Deadlines
from .forward import MetadataForwarder
from .groups_api import GroupsApi
from .h1 import NOW_HANDLERS, NowHandler
from .http import (
    ApiError,
    accepts,
    damaged,
    internal,
    json_response,
    malformed,
    outcome_unknown,
    parse_json,
    parsed,
    read_body,
    unavailable,
)
from .metrics import BrokerMetrics, merge_workers
from .node import Broker
from .offsets_api import OffsetsApi
from .streams import serve_stream
from .topic_groups import TopicGroupsApi
from .txns_api import TxnsApi, check_transactional

log = logging.getLogger(__name__)
#: JSON request bodies are decoded (parsed, checked, encoded as a batch) in worker threads,
#: at most this many at a time, so that a big one never holds the event loop for long. A body
#: this small is decoded on the loop, where it takes well under a millisecond: a JSON body
#: (parsing only), a JSON append (one record costs about a microsecond or two).
DECODE_THREADS = 2
INLINE_JSON_BYTES = 16 << 10
INLINE_APPEND_BYTES = 1 << 10
#: Digits are ASCII digits only (str.isdigit also takes "²" or "٣").
DIGITS = re.compile(r"[0-9]+")
INTEGER = re.compile(r"-?[0-9]+")
COLLECT_INTERVAL_S = 3.0
#: How long a description waits for fresh status reports of the other brokers.
STATUS_REFRESH_S = 1.0
#: How long a request for a partition hosted elsewhere looks for its leader in fresh status
#: reports before it is answered 503.
LEADER_LOOKUP_S = 2.0
#: How often a topic creation waiting for its partitions' leaders looks again when no peer's
#: report came in meanwhile (this broker's own replicas' elections send no report to itself),
#: and a metadata write waiting for the next metadata leader when no metadata was applied.
LEADER_POLL_S = 0.1
#: How long a request for a topic this broker does not know waits for it to confirm, with the
#: metadata leader, that it has applied all the committed metadata (then: 404), and how long
#: /readyz waits for the same.
METADATA_BARRIER_TIMEOUT_S = 3.0
APPEND_MAY_COMMIT = (
    "the append may still be committed: retry with the same producer id and sequence "
    "(the broker deduplicates it); without a producer id, check before appending again"
)
BROKER_KEY = web.AppKey("broker", Broker)
STATUS_CODES = {
    "invalid": (400, "bad_request"),
    "exists": (409, "conflict"),
    "not_found": (404, "not_found"),
    "fenced": (409, "conflict"),  # an older epoch of a transactional id (laminar.txn)
    "busy": (503, "unavailable"),  # the id's transaction is ending: retry
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
T = TypeVar("T")
M = TypeVar("M", bound=JsonModel)
#: aiohttp's own HTTP errors raised under a handler, as API error codes (others: bad_request)
HTTP_ERROR_CODES = {
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


class Api:
    def __init__(self, broker: Broker, metrics: BrokerMetrics) -> None:
        self.broker = broker
        self.metrics = metrics
        broker.render_metrics = metrics.openmetrics  # (what the feed sends worker 0)
        config = broker.config
        #: who may call what (server/auth.py); the brokers' own calls carry `internal_token`
        self.auth = Authenticator(
            internal_token=internal_token(config.secret, config.cluster_id),
            credentials_file=config.credentials_file,
            token=config.token,
            allow_anonymous=config.allow_anonymous,
        )
        if config.allow_anonymous:
            log.warning(
                "--allow-anonymous: requests without a token are served as an admin; anyone "
                "who can reach the API may read, write and delete every topic"
            )
        self._watching: asyncio.Task[None] | None = None
        self.timeout_s = broker.config.request_timeout_ms / 1000
        self.body_timeout_s = broker.config.body_timeout_ms / 1000
        #: appends and queue commands waiting for their commit, `timeout_s` each
        self.commits = Deadlines(self.timeout_s)
        self._decoding = ThreadPoolExecutor(DECODE_THREADS, thread_name_prefix="laminar-decode")
        self._session: ClientSession | None = None
        self._collector: asyncio.Task[None] | None = None
        self._driving: asyncio.Task[None] | None = None
        self.txns = TxnsApi(self)
        #: metadata writes taken here while another broker leads the metadata (forward.py)
        self.forwarding = MetadataForwarder(self)

    # ---- application -----------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(
            client_max_size=self.broker.config.max_request_bytes,
            # the request's id and log context (and trace) around everything else
            middlewares=[request_context.middleware, self._middleware],
        )
        app.on_response_prepare.append(request_context.on_response_prepare)
        app[BROKER_KEY] = self.broker
        r = app.router
        # every route of the contract, to its handler: a method of this Api or of GroupsApi
        owners: dict[str, object] = {
            "": self,
            "groups": GroupsApi(self),
            "topic_groups": TopicGroupsApi(self),
            "offsets": OffsetsApi(self),
            "txns": self.txns,
            "metadata": self.forwarding,
        }
        # appends answered without a task by the HTTP/1.1 fast path (laminar.server.h1)
        now = AppendNow(self, INLINE_APPEND_BYTES)
        now_handlers: dict[tuple[str, str], NowHandler] = {
            (r.method, r.path): now for r in ROUTES if r.handler == "append"
        }
        app[NOW_HANDLERS] = now_handlers
        for route in ROUTES:
            owner, _, name = route.handler.rpartition(".")
            handler: Handler = getattr(owners[owner], name)
            if route.method == "GET":
                r.add_get(route.path, handler)  # and HEAD
            else:
                r.add_route(route.method, route.path, handler)
        check_routes(r)  # every /v1 route has its authorization rule
        from .console import Console  # (imports this module)

        Console(self).register(app)  # the web console authenticates its pages itself
        app.on_startup.append(self._startup)
        app.on_cleanup.append(self._cleanup)
        return app

    async def _startup(self, _: web.Application) -> None:
        self._collector = asyncio.create_task(self._collect_removed())
        self._watching = asyncio.create_task(self.auth.watch())
        self._driving = asyncio.create_task(self.txns.driver.run())

    async def _cleanup(self, _: web.Application) -> None:
        for task in (self._collector, self._watching, self._driving):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._session is not None:
            await self._session.close()
        await self.forwarding.close()
        self._decoding.shutdown(wait=False, cancel_futures=True)
        self.commits.close()

    async def _collect_removed(self) -> None:
        """Every few seconds: drop replicas the partition's leader no longer counts."""
        while True:
            await asyncio.sleep(COLLECT_INTERVAL_S)
            if not self.broker.core.replicas:
                continue
            try:  # fresh reports only: each look reads newer ones than the last (its own
                # rows do not count: `Broker.collect_removed` looks at the others')
                view = self.broker.status.peers_view(status_table.FRESH_MS)
                self.broker.collect_removed(view)
            except Exception:  # keep collecting; a failed round is retried
                log.exception("collecting removed replicas failed")

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        versioned = request.path.startswith("/v1/")
        try:
            if versioned:
                request[PRINCIPAL_KEY] = self.auth.authorize(request)  # 401, 403
            if request.body_exists:
                self.check_body_headers(request)
            if versioned:
                await self._metadata_seen(request)
            response = await handler(request)
            if versioned and not response.prepared:  # a WebSocket's were sent at its upgrade
                response.headers[METADATA_INDEX_HEADER] = str(self.broker.core.meta_applied_index)
            self.count_request(request, response.status)
            return response
        except ApiError as e:
            error = e
        except ReplicaClosed as e:
            # the broker is stopping, or dropped the replica, under the request (a long poll
            # included): nothing was done, another replica or the new leader will answer
            error = unavailable(f"{e}; retry")
        except web.HTTPRequestEntityTooLarge as e:
            error = ApiError(413, "payload_too_large", e.text or "request body too large")
        except web.HTTPNotFound:
            error = ApiError(404, "not_found", f"no route {request.path}")
        except web.HTTPMethodNotAllowed as e:
            error = ApiError(
                405,
                "method_not_allowed",
                f"{request.method} not allowed on {request.path}",
                headers={"Allow": ",".join(sorted(e.allowed_methods))},
            )
        except web.HTTPException as e:  # aiohttp's other HTTP errors, as API errors
            if e.status < 400:
                self.count_request(request, e.status)
                raise
            code = HTTP_ERROR_CODES.get(e.status, "bad_request")
            error = ApiError(e.status, code, e.text or e.reason)
        except ConnectionError:
            raise  # the client is gone: no answer can reach it
        except Exception:
            # a bug: never a plain-text 500, and the traceback in the log
            log.exception("%s %s failed unexpectedly", request.method, request.path)
            error = internal()
        return self.error_response(request, error, versioned=versioned)

    def error_response(
        self, request: web.Request, error: ApiError, *, versioned: bool = True
    ) -> web.Response:
        """The answer to `request` for `error`, counted."""
        if error.status != 307:
            self.metrics.request_errors.labels(str(error.status), error.code).inc()
        response = error.response()
        if versioned:
            response.headers[METADATA_INDEX_HEADER] = str(self.broker.core.meta_applied_index)
        self.count_request(request, response.status)
        return response

    def count_request(self, request: web.Request, status: int) -> None:
        """`laminar_http_requests_total`, by the matched route's template (never the path:
        the label's values stay few), method and status."""
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else None
        self.metrics.count_request(route, request.method, status)

    async def _metadata_seen(self, request: web.Request) -> None:
        """Read-your-writes (laminar.contract): wait until this broker has applied the
        metadata as far as the client has seen it; 503 if it does not in time."""
        value = request.headers.get(METADATA_INDEX_HEADER)
        if value is None:
            return
        if not (DIGITS.fullmatch(value) and len(value) <= 19):
            raise ApiError(
                400, "bad_request", f"{METADATA_INDEX_HEADER} must be a non-negative integer"
            )
        index = int(value)
        if index > MAX_METADATA_INDEX:
            raise ApiError(400, "bad_request", f"{METADATA_INDEX_HEADER} is out of range")
        wait_s = min(METADATA_WAIT_S, self.timeout_s)
        if not await self.broker.waits.metadata_applied(index, wait_s):
            raise unavailable(
                f"this broker has applied the cluster metadata up to index "
                f"{self.broker.core.meta_applied_index}, behind index {index} that the client has "
                f"seen (not within {wait_s:g} s); retry, or ask another broker"
            )

    def check_body_headers(self, request: web.Request) -> None:
        """Refuse before reading it a body the broker never takes: one declared longer than
        the request limit (413, before any 429: retrying cannot help), or one compressed or
        otherwise encoded (415)."""
        declared = request.content_length
        limit = self.broker.config.max_request_bytes
        if declared is not None and declared > limit:
            raise ApiError(
                413,
                "payload_too_large",
                f"the request body of {declared} bytes exceeds the limit of {limit} bytes "
                "(--max-request-bytes)",
                close=True,
            )
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("identity", ""):
            raise ApiError(
                415,
                "unsupported_media_type",
                f"Content-Encoding {encoding[:40]!r} is not supported: send the body as it is",
                close=True,
            )

    async def checked_batch(self, batch: bytes, limit_bytes: int) -> tuple[BatchHeader, int]:
        """The header and payload digest (`verify_batch`'s: for `Replica.propose`) of a batch
        a client appends, once checked (else ApiError: 413 over
        `limit_bytes`, 400 for a corrupt or a control batch). A compressed batch is decompressed
        to check its records: in a worker thread for all but small ones (the codecs let go of
        the GIL), so that the event loop never waits on it."""
        try:
            compressed = parse_header(batch).is_compressed
            header, digest = await self._decode(
                lambda data: verify_batch(data, limit_bytes),
                batch,
                INLINE_APPEND_BYTES if compressed else len(batch),
            )
        except BatchTooLargeError as e:
            raise ApiError(413, "payload_too_large", str(e)) from e
        except BatchError as e:
            raise ApiError(400, "corrupt_batch", str(e)) from e
        if header.is_control:
            raise ApiError(400, "corrupt_batch", "control batches are for Raft only")
        return header, digest

    async def _decode(self, decode: Callable[[bytes], T], body: bytes, inline_bytes: int) -> T:
        """`decode(body)`: on the event loop when the body is at most `inline_bytes`, else in
        a worker thread (whose Python work gives the loop its turn every switch interval)."""
        if len(body) <= inline_bytes:
            return decode(body)
        return await asyncio.get_running_loop().run_in_executor(self._decoding, decode, body)

    # ---- health ----------------------------------------------------------------------------

    async def healthz(self, _: web.Request) -> web.Response:
        return json_response({"status": "ok"})

    async def readyz(self, _: web.Request) -> web.Response:
        ready, reason = await self.broker.readiness(METADATA_BARRIER_TIMEOUT_S)
        if ready:
            return json_response({"status": "ready"})
        return json_response({"status": "not_ready", "reason": reason}, status=503)

    async def metrics_text(self, _: web.Request) -> web.Response:
        feed = self.broker.feed
        if feed is None:
            body, content_type = self.metrics.render()
        else:  # worker 0 of several: every worker's, labelled (docs/workers.md)
            texts = {0: self.metrics.openmetrics(), **await feed.scrape()}
            body, content_type = merge_workers(texts)
        response = web.Response(body=body)
        response.headers["Content-Type"] = content_type
        return response

    # ---- what the other handlers use (groups_api.py) --------------------------------------

    async def json_body(self, request: web.Request) -> Any:
        """The request's JSON body (415 unless `application/json`, 400 unless JSON)."""
        return await self._json(request)

    async def partition_of(self, request: web.Request) -> tuple[str, int]:
        """The request's `{topic}` and `{partition}`: 400 if malformed, 404 if there is no
        such partition (503 while this broker cannot tell)."""
        return await self._partition(request)

    async def topic_of(self, name: str) -> Topic:
        """Topic `name`: 400 if the name is malformed, 404 if there is no such topic (503
        while this broker cannot tell)."""
        return await self._topic(self._valid_topic_name(name))

    async def leader_elsewhere(self, request: web.Request, group: str) -> ApiError:
        """The redirect (or 503) for a request about Raft `group`, which this broker does not
        host, to the group's leader."""
        return await self._leader_elsewhere(request, group)

    def redirect(self, request: web.Request, node: str | None, what: str) -> ApiError:
        """The redirect of the request to `node`, the leader of `what` (503 if None)."""
        return self._redirect(request, node, what)

    # ---- helpers ---------------------------------------------------------------------------

    async def _json(self, request: web.Request) -> Any:
        if request.content_type != JSON_TYPE:
            raise ApiError(415, "unsupported_media_type", f"send {JSON_TYPE}")
        body = await read_body(request, self.body_timeout_s)
        return await self._decode(parse_json, body, INLINE_JSON_BYTES)

    def _redirect(self, request: web.Request, node: str | None, what: str) -> ApiError:
        address = self.broker.api_address_of(node)
        if node is None or address is None or node == self.broker.id:
            return unavailable(f"no leader known for {what}; retry shortly")
        base = self.broker.api_url(address)
        return ApiError(
            307,
            "not_leader",
            f"{self.broker.id} is not the leader of {what}; the leader is {node}",
            headers={"Location": base + request.path_qs},
            leader=node,
            leader_url=base,
        )

    def _topic_name(self, request: web.Request) -> str:
        return self._valid_topic_name(request.match_info["topic"])

    @staticmethod
    def _valid_topic_name(name: str) -> str:
        if not TOPIC_NAME.fullmatch(name):
            raise ApiError(
                400, "bad_request", f"topic name {name[:50]!r} must match {TOPIC_NAME.pattern}"
            )
        return name

    async def _topic(self, name: str, partition: int = 0) -> Topic:
        """Topic `name`, which must have `partition`. A topic (or partition) this broker does
        not know is 404 only once it has applied every committed metadata change; until it
        can tell, 503 (a restarted or partitioned broker must not deny what exists)."""
        topic = self.broker.core.state.topics.get(name)
        if topic is None or partition >= topic.partitions:
            if not await self.broker.waits.metadata_barrier(METADATA_BARRIER_TIMEOUT_S):
                raise unavailable(
                    f"{self.broker.id} has not caught up with the cluster metadata and cannot "
                    f"tell yet whether topic {name} exists; retry"
                )
            topic = self.broker.core.state.topics.get(name)
        if topic is None:
            raise ApiError(404, "not_found", f"no topic {name}")
        if partition >= topic.partitions:
            raise ApiError(
                404, "not_found", f"topic {name} has partitions 0..{topic.partitions - 1}"
            )
        return topic

    async def _partition(self, request: web.Request) -> tuple[str, int]:
        name = self._topic_name(request)
        text = request.match_info["partition"]
        if not DIGITS.fullmatch(text) or len(text) > 6:
            raise ApiError(400, "bad_request", f"partition {text[:20]!r} is not a number")
        await self._topic(name, int(text))
        return name, int(text)

    def _meta_error(self, e: MetadataError) -> ApiError:
        status, code = STATUS_CODES.get(e.code, (400, "bad_request"))
        return ApiError(status, code, str(e))

    async def propose_metadata(self, request: web.Request, command: Any) -> int:
        """Commit `command` through the metadata group: here when this broker leads it, else
        forwarded to the leader (server/forward.py, never a 307); its index once applied
        here; its refusals and timeouts as HTTP errors."""
        return await self._metadata(request, command)

    async def _metadata(self, _: web.Request, command: Any) -> int:
        """`propose_metadata`. Between two metadata leaders (an election, or a leadership
        being handed over, as a drained or stopping leader does) the write waits for the next
        one, up to `METADATA_WAIT_S`, rather than answering 503 at once. So does a write the
        leader answered 503 (it lost the leadership meanwhile): a 503 means nothing was done,
        so the write goes to the next leader. 503 if none takes it by then."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(METADATA_WAIT_S, self.timeout_s)
        refused: ApiError | None = None
        while True:
            try:
                return await self.propose_here(command)
            except NotLeader as e:
                leader = e.leader
            if leader is not None and leader != self.broker.id:
                try:
                    return await self.forwarding.forward(command, leader)
                except ApiError as e:
                    if e.status != 503:  # (503: nothing was done)
                        raise
                    refused = e
            if not await self._metadata_leader_moved(leader, deadline):
                raise refused or unavailable(
                    "no leader known for the cluster metadata; retry shortly"
                )

    async def _metadata_leader_moved(self, leader: str | None, deadline: float) -> bool:
        """Wait until this broker knows a metadata leader other than `leader` (the one that
        could not take a write: none, this broker handing it over, or one that refused), or
        leads itself; False at `deadline` (loop time). Woken by the metadata applied (a new
        leader commits an entry of its term at once), and looks again every
        LEADER_POLL_S meanwhile."""
        core = self.broker.core
        waits = self.broker.waits
        loop = asyncio.get_running_loop()
        while (remaining := deadline - loop.time()) > 0:
            await waits.meta_advanced.wait(min(remaining, LEADER_POLL_S))
            now = core.metadata_leader
            if now is not None and now != leader:
                return True
            raft = core.meta.raft if core.meta is not None else None
            if raft is not None and raft.role is Role.LEADER and raft.transferee is None:
                return True  # (leading again: the handover did not happen)
        return False

    async def propose_here(self, command: Any) -> int:
        """Commit `command` through the metadata group, which this broker must lead (else
        NotLeader): its index once applied; its refusals and timeouts as HTTP errors."""
        try:
            return await self.broker.waits.propose_metadata(command, self.timeout_s)
        except MetadataError as e:
            raise self._meta_error(e) from e
        except TimeoutError as e:
            raise outcome_unknown(
                "timeout",
                f"the metadata change did not commit within {self.timeout_s:g} s; it may still "
                "be applied: look before repeating it",
            ) from e

    # ---- cluster ---------------------------------------------------------------------------

    async def cluster(self, _: web.Request) -> web.Response:
        broker = self.broker
        members = tuple(
            Member(
                id=node,
                api_url=broker.api_url(api),
                peer_addr=peer,
                state=status.name.lower(),
                weight=broker.core.state.weight(node),
                draining=node in broker.core.state.draining,
            )
            for node, (status, api, peer) in sorted(broker.members().items())
        )
        leader = broker.core.metadata_leader
        info = ClusterInfo(broker.config.cluster_id, broker.id, leader, members)
        return json_response(info.to_json())

    async def node_partitions(self, request: web.Request) -> web.Response:
        """What node `{node}` hosts. A broker's id names its worker 0 and the broker: worker 0
        adds what each of its other workers hosts (asked at each), so that a broker that
        hosts nothing (a drained one the operator removes) is one none of whose workers
        does; a worker that cannot be asked makes it 503, never an answer that leaves it out."""
        node = request.match_info["node"]
        broker = self.broker
        if node == broker.id:
            hosted = list(broker.core.hosted_partitions())
            if broker.config.worker == 0:
                for worker in worker_ids(node, broker.config.workers)[1:]:
                    if broker.api_address_of(worker) is None:
                        raise unavailable(f"worker {worker} is not running")
                    hosted += (await self._node_partitions_at(worker)).partitions
            return json_response(NodePartitions(node, tuple(hosted)).to_json())
        return json_response((await self._node_partitions_at(node)).to_json())

    async def _node_partitions_at(self, node: str) -> NodePartitions:
        """Node `node`'s answer to GET /v1/nodes/{node}/partitions (404 unknown, 503 not
        answering)."""
        address = self.broker.api_address_of(node)
        if address is None:
            raise ApiError(404, "not_found", f"no member {node[:60]!r}")
        answer = await self._fetch(address, f"/v1/nodes/{node}/partitions", NodePartitions)
        if answer is None:
            raise unavailable(f"{node} did not answer")
        return dataclasses.replace(answer, node_id=node)

    def _tls(self) -> NodeTls:
        tls = self.broker.tls
        if tls is None:
            return NodeTls(self.broker.id, enabled=False)
        expires = datetime.datetime.fromtimestamp(tls.not_after, datetime.UTC)
        return NodeTls(
            self.broker.id,
            enabled=True,
            fingerprint=tls.fingerprint,
            not_after=expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
            trusted_cas=tuple(tls.trusted),
            reloads=tls.reloads,
            reload_error=tls.error,
        )

    async def node_tls(self, request: web.Request) -> web.Response:
        """The certificate node `{id}` serves and the CAs it trusts, as it loaded them (the
        operator's CA rotation waits on these)."""
        node = request.match_info["node"]
        if node == self.broker.id:
            return json_response(self._tls().to_json())
        address = self.broker.api_address_of(node)
        if address is None:
            raise ApiError(404, "not_found", f"no member {node[:60]!r}")
        answer = await self._fetch(address, f"/v1/nodes/{node}/tls", NodeTls)
        if answer is None or answer.node_id != node:
            raise unavailable(f"{node} did not answer")
        return json_response(answer.to_json())

    async def _fetch(self, address: str, path: str, model: type[M]) -> M | None:
        """GET `path` of the broker at API `address`, as this broker, as `model` (None: no
        answer, or not one)."""
        if self._session is None:
            self._session = ClientSession(timeout=ClientTimeout(total=2))
        headers = {"Authorization": f"Bearer {self.auth.internal_token}"}
        tls = self.broker.tls
        try:
            async with self._session.get(
                f"{self.broker.api_url(address)}{path}",
                headers=headers,
                # the cluster's CA (the current bundle: a new context, new connections)
                ssl=True if tls is None else tls.client(),
            ) as response:
                if response.status != 200:
                    return None
                body = await response.json()
        except (OSError, TimeoutError, ValueError):
            return None
        try:
            return model.from_json(body)
        except ModelError:
            return None

    def cluster_view(self) -> View:
        """Every alive member's hosted replicas, from the partition status table (this
        broker's live, the others' as they last reported: server/status_gossip.py)."""
        return self.broker.status.view()

    def _node(self, request: web.Request) -> str:
        node = request.match_info["node"]
        state = self.broker.core.state
        known = set(self.broker.members()) | set(state.weights) | state.draining
        if not WORKER_NODE_ID.fullmatch(node) or node not in known:
            raise ApiError(404, "not_found", f"no member {node[:60]!r}")
        return node

    def _node_body(self, node: str) -> dict[str, Any]:
        state = self.broker.core.state
        return NodeAdminState(node, node in state.draining, state.weight(node)).to_json()

    async def drain(self, request: web.Request) -> web.Response:
        node = self._node(request)
        await self._metadata(request, SetDraining(node, True))
        return json_response(self._node_body(node))

    async def undrain(self, request: web.Request) -> web.Response:
        node = self._node(request)
        await self._metadata(request, SetDraining(node, False))
        return json_response(self._node_body(node))

    async def handoff(self, request: web.Request) -> web.Response:
        """The node hands its leaderships to caught-up replicas (served by that node itself:
        others redirect to it); a broker's id (its worker 0) does so for each of its
        workers."""
        node = self._node(request)
        if node != self.broker.id:
            raise self._redirect(request, node, f"node {node}")
        hold_s = self.broker.config.leaving_hold_ms / 1000
        leading = await self.broker.hand_off_broker(HANDOFF_TIMEOUT_S, hold_s=hold_s)
        return json_response(Handoff(node, leading).to_json())

    async def weight(self, request: web.Request) -> web.Response:
        node = self._node(request)
        wanted = parsed(WeightRequest, await self._json(request))
        await self._metadata(request, SetWeight(node, wanted.weight))
        return json_response(self._node_body(node))

    # ---- topics ----------------------------------------------------------------------------

    def _topic_info(self, name: str) -> TopicInfo:
        topic = self.broker.core.state.topics[name]
        return TopicInfo(topic.name, topic.partitions, topic.replication_factor, topic.config)

    async def list_topics(self, request: web.Request) -> web.Response:
        """Every topic for an admin; for others, the topics in their scope."""
        principal = request[PRINCIPAL_KEY]
        names = sorted(n for n in self.broker.core.state.topics if principal.in_scope(n))
        return json_response(TopicList(tuple(self._topic_info(n) for n in names)).to_json())

    async def create_topic(self, request: web.Request) -> web.Response:
        """Create the topic; answer 201 once every partition has a leader known here (at most
        the request timeout after the commit: then 201 all the same, the partitions still
        electing without one), or, with `?wait_for_leaders=false`, as soon as it is created
        (as Kafka's CreateTopics, whose leaders are elected after it answers)."""
        wait = _query_choice(request.query, WAIT_FOR_LEADERS, ("true", "false")) == "true"
        wanted = parsed(CreateTopicRequest, await self._json(request))
        replication_factor = wanted.replication_factor
        if replication_factor is ABSENT:
            eligible = sum(1 for c in self.broker.core.candidates() if c.eligible)
            replication_factor = max(1, min(3, eligible))
        command = CreateTopic(
            wanted.name,
            1 if wanted.partitions is ABSENT else wanted.partitions,
            replication_factor,
            {} if wanted.config is ABSENT else wanted.config,
        )
        await self._metadata(request, command)
        if wait:
            await self._leaders_known(command.name, self.timeout_s)
        return json_response((await self.describe(command.name)).to_json(), status=201)

    async def _leaders_known(self, name: str, timeout_s: float) -> bool:
        """Wait until every partition of topic `name` has a leader in this broker's partition
        status table (a leader's report goes out the moment it is elected; this broker's own
        elections show at its next look, every LEADER_POLL_S); False if not within
        `timeout_s` (or the topic went meanwhile)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (topic := self.broker.core.state.topics.get(name)) is not None:
            leaders = view_leaders(self.cluster_view())
            if all(f"{name}/{p}" in leaders for p in range(topic.partitions)):
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            await self.broker.status.merged(min(remaining, LEADER_POLL_S))
        return False

    async def describe_topic(self, request: web.Request) -> web.Response:
        name = self._topic_name(request)
        await self._topic(name)
        return json_response((await self.describe(name)).to_json())

    async def describe(self, name: str, view: View | None = None) -> TopicDescription:
        """A topic as `GET /v1/topics/{name}` answers it (ApiError 404 if there is none),
        from `view` (default: the partition status table's, every peer's report refreshed)."""
        topic = self.broker.core.state.topics.get(name)
        if topic is None:
            raise ApiError(404, "not_found", f"no topic {name}")
        if view is None:
            await self.broker.status.refresh(STATUS_REFRESH_S)
            view = self.cluster_view()
        info = self._topic_info(name)
        states = self._states(name, view)
        return TopicDescription(
            info.name, info.partitions, info.replication_factor, info.config, states
        )

    def _states(self, name: str, view: View) -> tuple[PartitionState, ...]:
        """Topic `name`'s partition states, from `view` (the status table's)."""
        topic = self.broker.core.state.topics[name]
        leaders = view_leaders(view)
        reports: dict[int, dict[str, Any]] = {}  # any replica's report, when no leader's
        for hosted in view.values():
            for item in hosted:
                if item.get("topic") == name:
                    reports.setdefault(int(item["partition"]), item)
        states = []
        for partition in range(topic.partitions):
            best = leaders.get(f"{name}/{partition}")
            leader = best["leader"] if best is not None else None
            source = best or reports.get(partition)
            address = self.broker.api_address_of(leader)
            states.append(
                PartitionState(
                    partition=partition,
                    leader=leader,
                    term=int(best["term"]) if best is not None else None,
                    leader_url=self.broker.api_url(address) if address else None,
                    replicas=tuple(source["voters"] if source else topic.assignment[partition]),
                    learners=tuple(source["learners"]) if source else (),
                    in_sync=tuple(best["in_sync"]) if best else (),
                    log_start=source["log_start"] if source else 0,
                    commit_index=source["commit_index"] if source else -1,
                    log_end=source["log_end"] if source else 0,
                )
            )
        return tuple(states)

    async def list_partitions(self, request: web.Request) -> web.Response:
        """`GET /v1/partitions[?topic=t]`: the partition status table, every topic's (in the
        principal's scope) or one's, refreshed as a description is."""
        principal = request[PRINCIPAL_KEY]
        wanted = request.query.get("topic")
        if wanted is not None:
            if not principal.in_scope(self._valid_topic_name(wanted)):
                raise ApiError(403, "forbidden", f"topic {wanted} is not in your scope")
            await self._topic(wanted)
            names = [wanted]
        else:
            names = sorted(n for n in self.broker.core.state.topics if principal.in_scope(n))
        await self.broker.status.refresh(STATUS_REFRESH_S)
        view = self.cluster_view()
        rows = tuple(
            dataclasses.replace(state, topic=name)
            for name in names
            if name in self.broker.core.state.topics  # (deleted meanwhile)
            for state in self._states(name, view)
        )
        return json_response(PartitionList(rows).to_json())

    async def alter_topic(self, request: web.Request) -> web.Response:
        """Grow the partitions and/or change the config; with new partitions, answer once
        each has a leader, as a creation does (`?wait_for_leaders=false`: at once)."""
        name = self._topic_name(request)
        wait = _query_choice(request.query, WAIT_FOR_LEADERS, ("true", "false")) == "true"
        await self._topic(name)
        wanted = parsed(AlterTopicRequest, await self._json(request))
        await self._metadata(request, AlterTopic(name, wanted.partitions, wanted.config))
        if wait and wanted.partitions is not None:
            await self._leaders_known(name, self.timeout_s)
        return json_response((await self.describe(name)).to_json())

    async def delete_topic(self, request: web.Request) -> web.Response:
        name = self._topic_name(request)
        await self._topic(name)
        await self._metadata(request, DeleteTopic(name))
        return web.Response(status=204)

    # ---- records ---------------------------------------------------------------------------

    async def _leader_elsewhere(self, request: web.Request, group: str) -> ApiError:
        """Where to send a request for a partition this broker does not host: its leader in
        the status table. When the table knows none (a partition just made, a leader just
        elected), fresh reports are asked for, then the next ones awaited (a leader's report
        goes out the moment it is elected), for up to LEADER_LOOKUP_S, before 503."""
        status = self.broker.status
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LEADER_LOOKUP_S
        best = view_leaders(self.cluster_view()).get(group)
        if best is None:
            await status.refresh(STATUS_REFRESH_S)
            best = view_leaders(self.cluster_view()).get(group)
        while best is None and (remaining := deadline - loop.time()) > 0:
            if not await status.merged(remaining):
                break
            best = view_leaders(self.cluster_view()).get(group)
        return self._redirect(request, best["leader"] if best else None, group)

    async def to_leader(self, request: web.Request, replica: Replica) -> ApiError:
        """A follower's answer: a 307 to the leader its Raft follows. A follower that knows
        none yet (a leader just elected reaches it with its first append a moment later, and
        later still on a loaded machine) asks the partition status table, as a broker that
        does not host the partition does, rather than answer 503 to a client that was just
        told the leader exists."""
        if replica.raft.lead is not None:
            return self._redirect(request, replica.raft.lead, replica.group)
        return await self._leader_elsewhere(request, replica.group)

    async def append(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        topic, partition = await self._partition(request)
        replica = self.broker.core.replica(topic, partition)
        if replica is None:
            raise await self._leader_elsewhere(request, f"{topic}/{partition}")
        if not replica.is_leader:
            raise await self.to_leader(request, replica)
        if request.content_type not in (BATCH_TYPE, JSON_TYPE):
            raise ApiError(415, "unsupported_media_type", f"send {JSON_TYPE} or {BATCH_TYPE}")
        # a body declared over --max-request-bytes was answered 413 already (the middleware)
        declared = request.content_length or 0
        if replica.pending_bytes + declared > replica.max_pending_bytes:
            # refuse before reading the body: memory stays bounded under overload
            raise ApiError(
                429,
                "overloaded",
                f"{replica.group}: {replica.pending_bytes} bytes already await their commit",
                headers={"Retry-After": "1"},
            )
        # (the spans of an append's steps: laminar.server.tracing; None while it is off)
        with tracing.span(tracing.DECODE, topic, partition) as span:
            body = await read_body(request, self.body_timeout_s)
            limit = replica.log.config.batch_limit_bytes
            digest: int | None = None
            if request.content_type == BATCH_TYPE:
                header, digest = await self.checked_batch(body, limit)
                batch = body
            else:
                batch = await self._decode(self.json_batch, body, INLINE_APPEND_BYTES)
                if len(batch) > limit:
                    raise ApiError(413, "payload_too_large", f"batch exceeds {limit} bytes")
                header = parse_header(batch)
            if span is not None:
                span.set_attribute(tracing.RECORD_COUNT, header.record_count)
        if header.is_transactional:
            check_transactional(self, topic, partition, header.producer_id)
        try:
            with tracing.span(tracing.PROPOSE, topic, partition, header.record_count):
                future, duplicate = replica.propose(batch, header, digest)
        except NotLeader as e:
            raise self._redirect(request, e.leader, replica.group) from e
        except Overloaded as e:
            raise ApiError(429, "overloaded", str(e), headers={"Retry-After": "1"}) from e
        except SequenceConflict as e:
            raise ApiError(409, "conflict", str(e)) from e
        self.broker.wake()
        try:
            with tracing.span(tracing.COMMIT, topic, partition, header.record_count) as span:
                base = await self.commits.wait(future)
                if span is not None:
                    span.set_attributes({tracing.FIRST_INDEX: base, tracing.DUPLICATE: duplicate})
        except (TimeoutError, CommitUnknown, CommitLost) as e:
            raise self.commit_error(e) from e
        self.metrics.append_latency.observe(time.perf_counter() - started)
        self.metrics.appended(topic, header.record_count, len(body))
        return json_response(AppendResult(base, header.record_count, duplicate).to_json())

    def commit_error(self, e: TimeoutError | CommitUnknown | CommitLost) -> ApiError:
        """The answer to an append whose commit timed out, became unknown or was lost."""
        if isinstance(e, TimeoutError):
            return outcome_unknown(
                "timeout", f"not committed within {self.timeout_s:g} s; {APPEND_MAY_COMMIT}"
            )
        if isinstance(e, CommitUnknown):
            return outcome_unknown("outcome_unknown", f"{e}; {APPEND_MAY_COMMIT}")
        return unavailable(f"{e}: the append was not written; retry")

    async def append_stream(self, request: web.Request) -> web.StreamResponse:
        """Streaming appends over a WebSocket (laminar.server.streams)."""
        topic, partition = await self._partition(request)
        replica = self.broker.core.replica(topic, partition)
        if replica is None:
            raise await self._leader_elsewhere(request, f"{topic}/{partition}")
        if not replica.is_leader:
            raise await self.to_leader(request, replica)
        return await serve_stream(self, request, replica, lambda: self.auth.authorize(request))

    def json_batch(self, body: bytes) -> bytes:
        """A JSON append's body as one batch (ApiError when it is not a valid one). Runs in a
        worker thread for all but small bodies (`_decode`): it touches no shared state."""
        append = parsed(AppendRequest, parse_json(body))
        try:
            return encode_batch(
                append.records,
                producer_id=append.producer_id or 0,
                producer_seq=append.sequence or 0,
                transactional=append.transactional,
            )
        except BatchError as e:  # timestamps too far apart for one batch (2^31-1 ms)
            raise ApiError(400, "bad_request", f"the records do not fit one batch: {e}") from e

    async def read(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        topic, partition = await self._partition(request)
        query = request.query
        replica = self.broker.core.replica(topic, partition)
        if replica is None:
            raise await self._leader_elsewhere(request, f"{topic}/{partition}")
        from_index = _query_int(query, "from", replica.log_start, 0, MAX_INDEX)
        max_records = _query_int(query, "max_records", DEFAULT_READ_RECORDS, 1, MAX_READ_RECORDS)
        max_bytes = _query_int(query, "max_bytes", DEFAULT_READ_BYTES, 1, MAX_READ_BYTES)
        wait_ms = _query_int(query, "wait_ms", 0, 0, MAX_WAIT_MS)
        committed = _query_choice(query, "isolation", ISOLATIONS) == ISOLATIONS[0]
        if from_index < replica.log_start:
            raise ApiError(
                416,
                "out_of_range",
                f"index {from_index} is below the log start {replica.log_start}",
                log_start=replica.log_start,
            )
        await replica.fresh()
        await self._committed_through(request, replica)
        if wait_ms and from_index >= replica.readable_end(committed=committed):
            await replica.wait_for(from_index, wait_ms / 1000, committed=committed)
        try:
            result = replica.read(from_index, max_bytes, committed=committed)
        except IndexOutOfRangeError as e:
            raise ApiError(416, "out_of_range", str(e), log_start=replica.log_start) from e
        except CorruptBatchError as e:
            raise damaged(replica, e) from e
        self.metrics.read_latency.observe(time.perf_counter() - started)
        try:
            # (result.next_index: past the batches of aborted transactions a read_committed
            # read left out, so that a reader never stops before them)
            if accepts(request, BATCH_TYPE):
                return self._binary_read(
                    replica, result.data, from_index, max_records, result.next_index
                )
            return self._json_read(replica, result.data, from_index, max_records, result.next_index)
        except MalformedRecordsError as e:
            # stored before appends checked records: the answer stops before such a batch,
            # and a read that starts at one is told where to go on (never a 500)
            self.broker.core.report_malformed(
                replica.group, "read", e.base_index, e.next_index, str(e)
            )
            raise malformed(replica, e) from e

    async def _committed_through(self, request: web.Request, replica: Replica) -> None:
        """Read-your-writes for records (laminar.contract): with `ACKED_INDEX_HEADER`, serve
        the read only once `replica` has committed through that index. A follower a message
        behind waits for it; one still behind after `ACKED_WAIT_S` sends the reader to the
        leader (307), or, knowing none, answers 503. A leader whose log ends before the index
        never had it (a topic of the same name, deleted since): the header is ignored."""
        value = request.headers.get(ACKED_INDEX_HEADER)
        if value is None:
            return
        if not (DIGITS.fullmatch(value) and len(value) <= 19 and int(value) <= MAX_INDEX):
            raise ApiError(
                400, "bad_request", f"{ACKED_INDEX_HEADER} must be an integer in [0, {MAX_INDEX}]"
            )
        index = int(value)
        if index <= replica.commit_index or (replica.is_leader and index >= replica.log_end):
            return
        await replica.wait_for(index, min(ACKED_WAIT_S, self.timeout_s))
        if index <= replica.commit_index:
            return
        if not replica.is_leader:
            raise await self.to_leader(request, replica)
        raise unavailable(
            f"the leader of {replica.group} has committed through index {replica.commit_index}, "
            f"behind index {index} that the client saw acknowledged; retry shortly"
        )

    def _position_headers(self, replica: Replica, next_index: int) -> dict[str, str]:
        return {
            NEXT_INDEX_HEADER: str(next_index),
            COMMIT_INDEX_HEADER: str(replica.commit_index),
            LOG_START_HEADER: str(replica.log_start),
        }

    def _binary_read(
        self, replica: Replica, data: bytes, from_index: int, max_records: int, data_end: int
    ) -> web.Response:
        """`data`: whole batches, the read's window ending at `data_end` (some batches of it
        may have been left out: aborted transactions')."""
        end = 0
        count = 0
        records = 0  # (count, but for control batches: what laminar_topic_records_out counts)
        next_index = from_index
        cut = False
        for batch in split_batches(data):
            header = parse_header(batch)
            if not (header.is_control or header.is_compressed):
                # one C walk per batch: a binary reader must not be handed records it cannot
                # decode (stored before appends checked them). A compressed batch is served as
                # stored, never decompressed here: appends have checked records since before
                # batches could be compressed, so its leader checked it
                try:
                    verify_records(header, batch[BATCH_HEADER_BYTES:])
                except MalformedRecordsError:
                    if count:
                        cut = True
                        break  # the batches before it; reading on from it meets it first
                    raise
            end += len(batch)
            next_index = header.next_index
            count += header.next_index - max(from_index, header.base_index)
            if not header.is_control:
                records += header.next_index - max(from_index, header.base_index)
            if count >= max_records:
                cut = True
                break
        if not cut:
            next_index = max(next_index, data_end)
        body = data[:end] if end < len(data) else data
        self.metrics.served(replica.topic, records, len(body))
        return web.Response(
            body=body,
            content_type=BATCH_TYPE,
            headers=self._position_headers(replica, max(next_index, from_index)),
        )

    def _json_read(
        self, replica: Replica, data: bytes, from_index: int, max_records: int, data_end: int
    ) -> web.Response:
        stored, end, cut = records_from(data, from_index, max_records)
        next_index = from_index if end is None else max(end, from_index)
        if not cut:
            next_index = max(next_index, data_end)
        body = ReadResult(stored, next_index, replica.commit_index, replica.log_start).to_json()
        response = json_response(body, headers=self._position_headers(replica, next_index))
        self.metrics.served(replica.topic, len(stored), response.content_length or 0)
        return response


# ---- query parameters ----------------------------------------------------------------------


def _query_choice(query: Any, name: str, choices: tuple[str, ...]) -> str:
    """One of `choices` (the first by default)."""
    text = query.get(name)
    if text is None or text == "":
        return choices[0]
    if text not in choices:
        raise ApiError(400, "bad_request", f"{name}={text[:30]!r} must be one of {list(choices)}")
    return str(text)


def _query_int(query: Any, name: str, default: int, low: int, high: int) -> int:
    text = query.get(name)
    if text is None or text == "":
        return default
    if not INTEGER.fullmatch(text) or len(text) > 25:
        raise ApiError(400, "bad_request", f"{name}={text[:30]!r} is not an integer")
    value = int(text)
    if not low <= value <= high:
        raise ApiError(400, "bad_request", f"{name}={value} must be in [{low}, {high}]")
    return value
