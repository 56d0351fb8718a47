"""`AsyncClient`: the asyncio client of the broker's HTTP API v1 (docs/api.md).

What it does for every call:

* **Redirects.** It follows 307/308 itself (laminar.client.h1 follows none),
  sending the same method and body to `Location`, at most `MAX_REDIRECTS` hops per attempt.
* **Retries.** 503 `unavailable` (the broker did nothing), 429 `overloaded` and connection
  failures are retried with capped exponential backoff (`INITIAL_BACKOFF_S` doubling up to
  `MAX_BACKOFF_S`, with jitter; a 429's `Retry-After` is honoured up to the cap) until the
  call's deadline (`timeout_s`, plus `wait_ms` for long-polling reads) passes; then the last
  error is raised. A broker that cannot be connected to is skipped for the next one at once.
  A 504 (`timeout`, `outcome_unknown`: the write was proposed and may or may not commit) and
  a connection that broke after the request was sent are *ambiguous*: the write may have
  happened. Such calls are retried only when repeating them is safe: reads, admin calls,
  idempotent appends (with a producer id; the broker deduplicates the retry), queue commands
  (repeating an accept, release, reject or renew is harmless; a repeated acquire may leave
  what a lost one took held until its lease ends), topic creation (a 409 after an ambiguous
  attempt returns the topic's description) and deletion (a 404 after an ambiguous attempt
  counts as done). A plain append without a producer id is never repeated then: it raises
  the `Timeout` (or `Unavailable`, for a broken connection) with `error.ambiguous = True`,
  and whether it was written is for the caller to find out.
* **Routing.** Partition leaders (`leader_url` of `describe_topic`) are cached and appends go
  straight to the leader. Reads go to the in-sync replicas of the partition ranked by weighted
  rendezvous hashing (`rank(partition_key(topic, p), ...)`, the brokers' own placement
  function), so that the read load of many partitions spreads over all replicas, the leader and
  then any broker being the fallbacks. Metadata writes go to the last known metadata leader
  (any other broker forwards them to it, which costs a hop).
  The cache is corrected by every 307 (`Location`), and dropped on 503 and on connection
  failures, to be fetched again (at most every `ROUTE_REFRESH_S` per topic). Routing is only an
  optimisation: every broker answers every call, by redirect if need be.
* **Read-your-writes.** It remembers, per partition, the highest index acknowledged to it
  (appends and streams) and names it on every read of that partition (`ACKED_INDEX_HEADER`):
  a follower that has not yet learned of the commit waits for it or sends the read to the
  leader, so a read right after an append returns it. Likewise for the cluster metadata
  (`METADATA_INDEX_HEADER`).
"""

from __future__ import annotations

import asyncio
import os
import random
import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, TypeVar
from urllib.parse import urlencode

import aiohttp
import orjson
from yarl import URL

from laminar import contract
from laminar.contract import (
    ACKED_INDEX_HEADER,
    ACQUIRED_TYPE,
    BATCH_TYPE,
    COMMIT_INDEX_HEADER,
    CONSUMER_ID,
    DEFAULT_ACQUIRE,
    DEFAULT_LEASE_MS,
    DEFAULT_READ_BYTES,
    DEFAULT_READ_RECORDS,
    GROUP_NAME,
    ISOLATIONS,
    JSON_TYPE,
    LOG_START_HEADER,
    MAX_ACQUIRE,
    MAX_ACQUIRE_BYTES,
    MAX_INDEX,
    MAX_LEASE_MS,
    MAX_REASON_CHARS,
    MAX_SETTLE_INDEXES,
    MAX_WAIT_MS,
    METADATA_INDEX_HEADER,
    NEXT_INDEX_HEADER,
)
from laminar.log.batch import (
    Record,
    encode_batch,
    parse_header,
    records_from,
)
from laminar.log.errors import BatchError, MalformedRecordsError
from laminar.log.records import MAX_TIMESTAMP_MS, MIN_TIMESTAMP_MS
from laminar.models import (
    ABSENT,
    AcquireRequest,
    AlterTopicRequest,
    CreateTopicRequest,
    ErrorBody,
    Handoff,
    JsonModel,
    ModelError,
    PartitionList,
    RejectRequest,
    RenewRequest,
    SettleRequest,
    TopicList,
    TxnDescription,
    TxnEnded,
    TxnEndRequest,
    TxnInitRequest,
    TxnMarkerRequest,
    TxnPartitionsRequest,
    TxnProducerInfo,
    WeightRequest,
)
from laminar.models.group_admin import (
    GroupReset,
    PartitionGroups,
    PartitionOffsets,
    ResetGroupRequest,
    TopicGroupDescription,
    TopicGroupReset,
    TopicGroups,
    TopicOffsets,
)
from laminar.placement import Candidate, partition_key, rank
from laminar.tls import client_context

from . import h1
from .config import DEFAULT_BROKERS, resolve, resolve_token
from .errors import (
    Conflict,
    CorruptData,
    LaminarError,
    NotFound,
    Overloaded,
    Timeout,
    Unavailable,
    error_from_response,
)
from .models import (
    Acquired,
    AppendResult,
    ClusterInfo,
    GroupDescription,
    Member,
    NodeAdminState,
    NodePartitions,
    NodeTls,
    PartitionState,
    RawRead,
    ReadResult,
    Settled,
    TopicDescription,
    TopicInfo,
)
from .stream import AppendStream
from .transactions import Transaction, TransactionalProducer

DEFAULT_TIMEOUT_S = 30.0
MAX_REDIRECTS = 5
INITIAL_BACKOFF_S = 0.05
MAX_BACKOFF_S = 1.0
CONNECT_TIMEOUT_S = 3.0
#: A handoff's deadline beyond the broker's own budget (contract.HANDOFF_TIMEOUT_S)
HANDOFF_ANSWER_S = 10.0
ROUTE_REFRESH_S = 0.2
CLUSTER_TTL_S = 10.0

RecordsOrBatch = Sequence[Record] | bytes | bytearray | memoryview
M = TypeVar("M", bound=JsonModel)

_CONNECT_ERRORS: tuple[type[BaseException], ...] = (
    aiohttp.ClientConnectorError,
    *(getattr(aiohttp, n) for n in ("ConnectionTimeoutError",) if hasattr(aiohttp, n)),
)


@dataclass(frozen=True, slots=True)
class _Target:
    """Where a call should go first."""

    kind: Literal["any", "meta", "leader", "replica"]
    topic: str = ""
    partition: int = 0

    @property
    def key(self) -> tuple[str, int]:
        return (self.topic, self.partition)


_ANY = _Target("any")
_META = _Target("meta")


@dataclass(slots=True)
class _Answer:
    status: int
    headers: Mapping[str, str]
    body: bytes
    url: str

    def json(self) -> Any:
        if not self.body:
            return None
        try:
            return orjson.loads(self.body)
        except ValueError:
            return None


class _TooManyRedirects(Exception):
    pass


def _origin(url: str) -> str:
    return str(URL(url).origin()).rstrip("/")


def _not_reached(base: str, origin: str | None, error: BaseException) -> str:
    """Why the broker at `base` (or the one it redirected to, `origin`) was not reached."""
    if origin is None or origin == _origin(base):
        return f"cannot connect to {base}: {error}"
    return f"cannot connect to {origin} (where {base} redirected): {error}"


def _dedupe(urls: Sequence[str]) -> list[str]:
    """Non-empty URLs in order, each once."""
    return list(dict.fromkeys(u for u in urls if u))


def read_replicas(
    topic: str, partition: int, state: PartitionState, members: Sequence[Member]
) -> list[str]:
    """API URLs of the partition's in-sync replicas that may serve reads, best first.

    The order is weighted rendezvous (`laminar.placement.rank`) on the partition key: every
    client picks the same replica for a partition, and different partitions pick different
    replicas, so reads spread over the cluster in proportion to the brokers' weights. Members
    that are not alive, are draining or weigh 0 are left out.
    """
    by_id = {m.id: m for m in members if m.api_url}
    candidates = [
        Candidate(m.id, max(m.weight, 0), alive=m.state == "alive", draining=m.draining)
        for node in state.in_sync
        if (m := by_id.get(node)) is not None
    ]
    return [
        by_id[node].api_url.rstrip("/")
        for node in rank(partition_key(topic, partition), candidates)
    ]


def decode_read_body(
    data: bytes,
    *,
    from_index: int | None,
    max_records: int,
    next_index: int | None,
    commit_index: int,
    log_start: int,
) -> ReadResult:
    """Decode a binary read answer (whole batches back to back) into a `ReadResult`.

    Records below `from_index` (the first batch may start before it) and control batches are
    skipped; at most `max_records` records are kept, and `next_index` then points just after
    the last one kept. Raises `BatchError` on a damaged batch.
    """
    records, end, full = records_from(data, from_index or 0, max_records)
    if full:
        assert end is not None
        nxt = end
    elif next_index is not None:
        nxt = next_index
    elif end is not None:
        nxt = max(end, from_index or 0)
    else:
        nxt = from_index if from_index is not None else log_start
    return ReadResult(records, nxt, commit_index, log_start)


def decode_read_json(data: Any, *, max_records: int) -> ReadResult:
    """Decode a JSON read answer (for brokers that did not honour the binary Accept), kept to
    `max_records` records (ModelError, a ValueError, if it is not a read answer)."""
    read = ReadResult.from_json(data)
    records = read.records[:max_records]
    next_index = read.next_index
    if len(records) == max_records and records:
        next_index = min(next_index, records[-1].index + 1) if next_index else records[-1].index + 1
    return ReadResult(records, next_index, read.commit_index, read.log_start)


def _int_header(headers: Mapping[str, str], name: str) -> int | None:
    value = headers.get(name)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _header_or(headers: Mapping[str, str], name: str, default: int) -> int:
    value = _int_header(headers, name)
    return default if value is None else value


def _check_producer(producer_id: int | None, sequence: int | None) -> None:
    if producer_id is None:
        if sequence is not None:
            raise ValueError("sequence needs a producer_id")
        return
    if not 1 <= producer_id <= MAX_INDEX:
        raise ValueError(f"producer_id {producer_id} is not in 1..2^63-1")
    if sequence is None or not 0 <= sequence <= MAX_INDEX:
        raise ValueError(f"an idempotent append needs a sequence in 0..2^63-1, got {sequence}")


def check_group(group: str) -> None:
    """Raise ValueError unless `group` is a valid consumer group name."""
    if not isinstance(group, str) or not GROUP_NAME.fullmatch(group):
        raise ValueError(f"bad group name {group!r}: want {GROUP_NAME.pattern}")


def check_consumer(consumer: str) -> None:
    """Raise ValueError unless `consumer` is a valid consumer id."""
    if not isinstance(consumer, str) or not CONSUMER_ID.fullmatch(consumer):
        raise ValueError(f"bad consumer id {consumer!r}: want {CONSUMER_ID.pattern}")


def _check_range(name: str, value: int, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name}={value!r} is not an integer in {low}..{high}")


def _check_indexes(indexes: Sequence[int]) -> tuple[int, ...]:
    checked = tuple(indexes)
    if not 1 <= len(checked) <= MAX_SETTLE_INDEXES:
        raise ValueError(f"give 1..{MAX_SETTLE_INDEXES} indexes, not {len(checked)}")
    for index in checked:
        _check_range("index", index, 0, MAX_INDEX)
    return checked


def _reset_request(
    to: str | None,
    index: int | None,
    timestamp_ms: int | None,
    force: bool,
    partitions: Sequence[int] | None,
) -> ResetGroupRequest:
    """The body of a reset, checked as the broker checks it (ValueError)."""
    wanted = ResetGroupRequest(
        to, index, timestamp_ms, force, None if partitions is None else tuple(partitions)
    )
    try:
        return ResetGroupRequest.from_json(wanted.to_json())
    except ModelError as e:
        raise ValueError(str(e)) from e


def _offsets_query(timestamp_ms: int | None, isolation: str | None) -> dict[str, int | str]:
    query: dict[str, int | str] = {}
    if timestamp_ms is not None:
        _check_range("timestamp_ms", timestamp_ms, MIN_TIMESTAMP_MS, MAX_TIMESTAMP_MS)
        query["timestamp_ms"] = timestamp_ms
    if isolation is not None:
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {list(ISOLATIONS)}")
        query["isolation"] = isolation
    return query


def _json_object(answer: _Answer) -> Mapping[str, Any]:
    data = answer.json()
    if not isinstance(data, Mapping):
        raise LaminarError(
            answer.status, "corrupt_response", f"no JSON object in the answer from {answer.url}"
        )
    return data


def _answer_as(answer: _Answer, model: type[M]) -> M:
    """The answer's JSON as `model` (LaminarError `corrupt_response` if it is not one)."""
    try:
        return model.from_json(answer.json())
    except ModelError as e:
        raise _corrupt(answer, e) from e


def malformed_records(topic: str, partition: int, error: MalformedRecordsError) -> CorruptData:
    """A read answer holding a batch whose records are malformed, with nothing before it to
    return: CorruptData with `next_index`, where reading goes on, as a broker answers it."""
    message = f"{topic}/{partition}: {error}; read on from {error.next_index}"
    body = ErrorBody("corrupt_data", message, next_index=error.next_index).to_json()
    return CorruptData(200, "corrupt_data", message, body)


def _corrupt(answer: _Answer, error: Exception) -> LaminarError:
    return LaminarError(
        answer.status, "corrupt_response", f"undecodable answer from {answer.url}: {error}"
    )


class AsyncClient:
    """Client of a Laminar cluster. `brokers`: base URLs of some brokers (any will do); None:
    found as the `laminar` commands find them, in `context=`'s, $LAMINAR_BROKERS, the current
    context, else local-cluster's defaults (DEFAULT_BROKERS), with the CA file likewise
    (`context=`'s, $LAMINAR_CA_FILE, the current context's) unless `ca_file` or `ssl_context`.

    Use as `async with AsyncClient([...]) as client:` or call `close()`. One instance serves
    many concurrent calls (it keeps a pool of keep-alive connections) but belongs to the event
    loop that first used it.

    Credentials: `token=`, else `token_file=`, else `context=` (a context of the client
    configuration file), else $LAMINAR_TOKEN, $LAMINAR_TOKEN_FILE, the current context
    (laminar.client.config). The token goes with every request, redirects included.
    """

    def __init__(
        self,
        brokers: Sequence[str] | str | None = None,
        *,
        token: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_connections: int = 256,
        ca_file: str | os.PathLike[str] | None = None,
        ssl_context: ssl.SSLContext | Callable[[], ssl.SSLContext] | None = None,
        token_file: str | os.PathLike[str] | None = None,
        context: str | None = None,
    ) -> None:
        if ca_file is not None and ssl_context is not None:
            raise ValueError("give ca_file or ssl_context, not both")
        #: the bearer token: `token`, else `token_file`'s, else `context`'s, else $LAMINAR_TOKEN,
        #: $LAMINAR_TOKEN_FILE, the current context of ~/.config/laminar/config.yaml
        #: (laminar.client.config; ClientConfigError, a ValueError, if one is unreadable)
        if context or brokers is None:
            settings = resolve(token=token, token_file=token_file, context=context)
            token = settings.token
            if ca_file is None and ssl_context is None and settings.ca_file:
                ca_file = settings.ca_file
            if brokers is None:
                brokers = settings.brokers or DEFAULT_BROKERS
        else:
            token = resolve_token(token, token_file)
        #: TLS for https:// brokers: their certificates verified against `ca_file`'s CAs (else
        #: the system's), host names checked; or `ssl_context`, or a function giving the
        #: context for each new connection (a broker's own client: reloaded certificates)
        self._ssl = client_context(ca_file) if ca_file is not None else ssl_context
        if isinstance(brokers, str):
            brokers = [brokers]
        self._brokers = _dedupe([b.strip().rstrip("/") for b in brokers])
        if not self._brokers:
            raise ValueError("at least one broker URL is needed")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s={timeout_s} must be positive")
        self._token = token
        #: the highest cluster-metadata index answers showed (read-your-writes)
        self._metadata_index = -1
        self._timeout_s = timeout_s
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None  # (WebSockets: streaming appends)
        self._pool: h1.Pool | None = None  # (every other request)
        self._closed = False
        self._first = 0  # the bootstrap broker tried first (the last one that answered)
        self._meta_url: str | None = None
        self._leaders: dict[tuple[str, int], str] = {}
        #: per partition, the highest index acknowledged to this client (read-your-writes)
        self._acked: dict[tuple[str, int], int] = {}
        self._descriptions: dict[str, TopicDescription] = {}
        self._described_at: dict[str, float] = {}
        self._stale: set[str] = set()  # topics whose routing went wrong since described
        self._refreshing: dict[str, asyncio.Task[TopicDescription | None]] = {}
        self._cluster: ClusterInfo | None = None
        self._cluster_at = float("-inf")
        #: HTTP requests sent, and how many of them were answered by a redirect (a broker,
        #: or a broker's worker, that was not the one to ask: docs/workers.md, routing)
        self.requests_sent = 0
        self.redirects = 0

    # ------------------------------------------------------------------ lifecycle

    @property
    def brokers(self) -> list[str]:
        return list(self._brokers)

    @property
    def timeout_s(self) -> float:
        return self._timeout_s

    @property
    def metadata_index(self) -> int:
        """The highest cluster-metadata index the brokers' answers showed (-1: none yet); sent
        with every request, so that each broker serves it only once it has applied that far
        (read-your-writes: docs/api.md)."""
        return self._metadata_index

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connections. Calls after `close()` raise RuntimeError."""
        self._closed = True
        for task in self._refreshing.values():
            task.cancel()
        self._refreshing.clear()
        if self._pool is not None:
            self._pool.close()
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    def _get_pool(self) -> h1.Pool:
        if self._closed:
            raise RuntimeError("the client is closed")
        if self._pool is None:
            self._pool = h1.Pool(self._max_connections, CONNECT_TIMEOUT_S)
        return self._pool

    def _get_session(self) -> aiohttp.ClientSession:
        if self._closed:
            raise RuntimeError("the client is closed")
        if self._session is None:
            # no DNS cache: aiohttp resolves a cached host in a task of its own, which outlives
            # a cancelled call and ends with nobody to take its error (kopf re-raises such
            # orphans when the operator stops); pooled connections resolve once anyway
            connector = aiohttp.TCPConnector(
                limit=self._max_connections, limit_per_host=0, use_dns_cache=False
            )
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    # ------------------------------------------------------------------ cluster and admin

    async def cluster(self) -> ClusterInfo:
        """`GET /v1/cluster`: members, this node, the metadata leader."""
        answer = await self._call(*contract.GET_CLUSTER.at())
        info = _answer_as(answer, ClusterInfo)
        self._remember_cluster(info)
        return info

    async def node_partitions(self, node: str) -> NodePartitions:
        """`GET /v1/nodes/{node}/partitions`: the partition replicas `node` hosts."""
        answer = await self._call(*contract.GET_NODE_PARTITIONS.at(node=node))
        return _answer_as(answer, NodePartitions)

    async def node_tls(self, node: str) -> NodeTls:
        """`GET /v1/nodes/{node}/tls`: the certificate `node` serves and the CAs it trusts."""
        answer = await self._call(*contract.GET_NODE_TLS.at(node=node))
        return _answer_as(answer, NodeTls)

    async def drain(self, node: str) -> NodeAdminState:
        """`POST /v1/nodes/{node}/drain`: move every replica off `node`."""
        answer = await self._call(*contract.DRAIN_NODE.at(node=node), target=_META)
        return _answer_as(answer, NodeAdminState)

    async def undrain(self, node: str) -> NodeAdminState:
        """`DELETE /v1/nodes/{node}/drain`."""
        answer = await self._call(*contract.UNDRAIN_NODE.at(node=node), target=_META)
        return _answer_as(answer, NodeAdminState)

    async def handoff(self, node: str) -> int:
        """`POST /v1/nodes/{node}/handoff`: `node` hands its leaderships to caught-up replicas
        (before it stops); returns how many groups it still leads."""
        # the broker answers once the leaderships moved or HANDOFF_TIMEOUT_S passed: a deadline
        # of the same length could pass first on a loaded machine, and fail a pod's preStop
        budget_s = max(self._timeout_s, contract.HANDOFF_TIMEOUT_S + HANDOFF_ANSWER_S)
        answer = await self._call(*contract.HANDOFF_NODE.at(node=node), timeout_s=budget_s)
        return _answer_as(answer, Handoff).leading

    async def set_weight(self, node: str, weight: int) -> NodeAdminState:
        """`PUT /v1/nodes/{node}/weight` (0..1000000; 0 = hosts nothing)."""
        call = contract.SET_NODE_WEIGHT.at(node=node)
        body = WeightRequest(weight).to_json()
        answer = await self._call(*call, json_body=body, target=_META)
        return _answer_as(answer, NodeAdminState)

    # ------------------------------------------------------------------ topics

    async def topics(self) -> list[TopicInfo]:
        """`GET /v1/topics`."""
        answer = await self._call(*contract.LIST_TOPICS.at())
        return list(_answer_as(answer, TopicList).topics)

    async def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int | None = None,
        config: Mapping[str, Any] | None = None,
        *,
        wait_for_leaders: bool = True,
    ) -> TopicDescription:
        """`POST /v1/topics` → the new topic's description. Raises Conflict if it exists.

        The broker answers once every partition has a leader (at most its request timeout
        after the commit: a partition still electing then has `leader` None), so that the
        first append finds one; `wait_for_leaders=False` has it answer as soon as the topic is
        created, as Kafka's CreateTopics does (`wait_for_leaders()` waits later)."""
        body = CreateTopicRequest(
            name,
            partitions,
            ABSENT if replication_factor is None else replication_factor,
            ABSENT if config is None else dict(config),
        ).to_json()
        query = None if wait_for_leaders else {contract.WAIT_FOR_LEADERS: "false"}
        try:
            answer = await self._call(
                *contract.CREATE_TOPIC.at(), query=query, json_body=body, target=_META
            )
        except Conflict as e:
            if e.ambiguous:  # an earlier attempt of ours created it
                return await self.describe_topic(name)
            raise
        return self._remember_topic(_answer_as(answer, TopicDescription))

    async def describe_topic(self, name: str) -> TopicDescription:
        """`GET /v1/topics/{name}`: partitions with leader, replicas, in-sync set, indexes."""
        answer = await self._call(*contract.DESCRIBE_TOPIC.at(topic=name))
        return self._remember_topic(_answer_as(answer, TopicDescription))

    async def partitions(self, topic: str | None = None) -> list[PartitionState]:
        """`GET /v1/partitions`: the partition status table, every topic's in this client's
        scope (or `topic`'s): each partition with its topic, leader, term, replicas, in-sync
        set and indexes."""
        query = None if topic is None else {"topic": topic}
        answer = await self._call(*contract.LIST_PARTITIONS.at(), query=query)
        return list(_answer_as(answer, PartitionList).partitions)

    async def wait_for_leaders(self, name: str, timeout_s: float = 60) -> TopicDescription:
        """Describe `name` until every partition has a leader (a new topic's elections take a
        moment: `create_topic` waits for them itself, unless told not to or its wait ran out);
        raises `Unavailable` after `timeout_s`."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            described = await self.describe_topic(name)
            if all(p.leader for p in described.partition_states):
                return described
            if asyncio.get_running_loop().time() > deadline:
                raise Unavailable(
                    503,
                    "unavailable",
                    f"{name} has partitions without a leader after {timeout_s} s",
                )
            await asyncio.sleep(0.1)

    async def alter_topic(
        self,
        name: str,
        partitions: int | None = None,
        config: Mapping[str, Any] | None = None,
        *,
        wait_for_leaders: bool = True,
    ) -> TopicDescription:
        """`PATCH /v1/topics/{name}`: grow the partition count and/or change the config. New
        partitions have their leaders when it returns, as `create_topic`'s do (unless
        `wait_for_leaders=False`)."""
        wanted = AlterTopicRequest(partitions, None if config is None else dict(config))
        call = contract.ALTER_TOPIC.at(topic=name)
        query = None if wait_for_leaders else {contract.WAIT_FOR_LEADERS: "false"}
        answer = await self._call(*call, query=query, json_body=wanted.to_json(), target=_META)
        return self._remember_topic(_answer_as(answer, TopicDescription))

    async def delete_topic(self, name: str) -> None:
        """`DELETE /v1/topics/{name}`. Raises NotFound if there is no such topic."""
        try:
            await self._call(*contract.DELETE_TOPIC.at(topic=name), target=_META)
        except NotFound as e:
            if not e.ambiguous:  # else an earlier attempt of ours deleted it
                raise
        finally:
            self._forget_topic(name)

    async def partition_count(self, topic: str) -> int:
        """The topic's partition count (cached; `describe_topic` refreshes it)."""
        description = self._descriptions.get(topic)
        if description is None:
            description = await self.describe_topic(topic)
        return description.partitions

    # ------------------------------------------------------------------ records

    async def append(
        self,
        topic: str,
        partition: int,
        records: RecordsOrBatch,
        *,
        producer_id: int | None = None,
        sequence: int | None = None,
        timeout_s: float | None = None,
        compression: str | None = None,
    ) -> AppendResult:
        """Append one batch and return once it is committed.

        `records` is a sequence of `Record`s (encoded here as one binary batch carrying
        `producer_id`/`sequence`) or an already encoded batch (`encode_batch`), whose header
        then carries the producer id and sequence (if given here too, they must match).
        With a producer id the append is idempotent and retried after any retryable failure,
        504 included (a retry of a batch that was written is answered as a duplicate, with
        the original index). Without one it is retried only when the broker certainly did not
        take it (503, 429, no connection): a 504 (`timeout` or `outcome_unknown`: it may or may
        not be written) or a connection lost after sending raises at once, with
        `error.ambiguous = True` (see the module doc). `compression` ("zstd", "lz4") compresses
        the records encoded here; an encoded batch carries its own codec
        (`encode_batch(..., compression=...)`).
        """
        if isinstance(records, bytes | bytearray | memoryview):
            if compression not in (None, "none"):
                raise ValueError("an encoded batch carries its own codec: encode it compressed")
            data = bytes(records)
            header = parse_header(data)
            if producer_id is not None and producer_id != header.producer_id:
                raise ValueError(f"producer_id {producer_id} differs from the batch header's")
            if sequence is not None and sequence != header.producer_seq:
                raise ValueError(f"sequence {sequence} differs from the batch header's")
            idempotent = header.producer_id != 0
        else:
            if not records:
                raise ValueError("an append needs at least one record")
            _check_producer(producer_id, sequence)
            data = encode_batch(
                records,
                producer_id=producer_id or 0,
                producer_seq=sequence or 0,
                compression=compression,
            )
            idempotent = producer_id is not None
        answer = await self._call(
            *contract.APPEND_RECORDS.at(topic=topic, partition=int(partition)),
            body=data,
            content_type=BATCH_TYPE,
            target=_Target("leader", topic, partition),
            idempotent=idempotent,
            timeout_s=timeout_s,
        )
        result = _answer_as(answer, AppendResult)
        self._note_acked(topic, partition, result)
        return result

    async def append_stream(
        self, topic: str, partition: int, *, max_in_flight: int = 1024
    ) -> AppendStream:
        """Open a streaming append to the partition's leader (laminar.client.stream): batches
        over one WebSocket, acknowledged in order, at most `max_in_flight` unacknowledged."""
        target = _Target("leader", topic, int(partition))
        path = contract.STREAM_APPEND.url(topic=topic, partition=int(partition))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout_s
        headers = {} if self._token is None else {"Authorization": f"Bearer {self._token}"}
        if self._metadata_index >= 0:
            headers[METADATA_INDEX_HEADER] = str(self._metadata_index)
        last: LaminarError = Unavailable(0, "unreachable", "no broker to stream to")
        attempt = 0
        while True:  # as `_call`: retryable refusals (e.g. 503 mid-election) until the deadline
            for base in await self._candidates(target, attempt, deadline):
                url = base + path
                for _ in range(MAX_REDIRECTS + 1):
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        raise Timeout(0, "timeout", f"no stream to {topic}/{partition} in time")
                    tls = self._ssl() if callable(self._ssl) else self._ssl
                    try:
                        ws = await self._get_session().ws_connect(
                            URL(url, encoded=True),
                            headers=headers,
                            ssl=True if tls is None else tls,
                            timeout=aiohttp.ClientWSTimeout(ws_close=min(remaining, 10.0)),
                            max_msg_size=0,
                            heartbeat=30.0,
                        )
                    except aiohttp.WSServerHandshakeError as e:
                        # aiohttp follows a 307 itself, without the Authorization header on
                        # another origin: go to the leader it named ourselves, with the token
                        redirect = e.history[-1].headers if e.history else e.headers
                        location = redirect.get("Location") if redirect is not None else None
                        if (e.history or e.status in (307, 308)) and location:
                            url = str(URL(url).join(URL(location)))
                            self._redirected(target, url)
                            continue
                        body = {"error": {"code": "unknown", "message": e.message}}
                        error = error_from_response(e.status, body)
                        if not error.retryable:
                            raise error from e
                        self._forget(target)
                        last = error
                        break
                    except _CONNECT_ERRORS as e:
                        self._unreachable(_origin(url), target)  # where a redirect pointed
                        reached = _not_reached(base, _origin(url), e)
                        last = Unavailable(0, "unreachable", reached)
                        break
                    self._answered(base)
                    return AppendStream(
                        ws, topic, int(partition), max_in_flight,
                        on_ack=lambda result: self._note_acked(topic, partition, result),
                    )  # fmt: skip
            delay = min(MAX_BACKOFF_S, INITIAL_BACKOFF_S * 2**attempt) * random.uniform(0.5, 1)
            if loop.time() + delay >= deadline:
                raise last
            await asyncio.sleep(delay)
            attempt += 1

    async def read(
        self,
        topic: str,
        partition: int,
        from_index: int | None = None,
        *,
        max_records: int = DEFAULT_READ_RECORDS,
        max_bytes: int = DEFAULT_READ_BYTES,
        wait_ms: int = 0,
        timeout_s: float | None = None,
        isolation: str = ISOLATIONS[0],
    ) -> ReadResult:
        """Read committed records from index `from_index` (default: the log start).

        Served by an in-sync replica (see the module doc). With `wait_ms` the broker waits up to
        that long for a record at or after `from_index` to be readable (long poll). Raises
        `OutOfRange` (with `log_start`) when `from_index` is below the log start. `isolation`
        "read_committed" (the default) stops at the first record of a transaction still open
        and leaves out those of aborted ones; "read_uncommitted" reads every committed batch
        (docs/transactions.md).
        """
        raw = await self.read_batches(
            topic, partition, from_index, max_records=max_records, max_bytes=max_bytes,
            wait_ms=wait_ms, timeout_s=timeout_s, isolation=isolation,
        )  # fmt: skip
        if isinstance(raw, ReadResult):
            return raw
        try:
            return decode_read_body(
                raw.body,
                from_index=from_index,
                max_records=max_records,
                next_index=raw.next_index,
                commit_index=raw.commit_index,
                log_start=raw.log_start,
            )
        except MalformedRecordsError as e:
            # (a broker that served records it cannot check: as a broker that checks answers)
            raise malformed_records(topic, partition, e) from e
        except (BatchError, KeyError, TypeError, ValueError) as e:
            raise LaminarError(
                200, "corrupt_response", f"undecodable read answer for {topic}/{partition}: {e}"
            ) from e

    async def read_batches(
        self,
        topic: str,
        partition: int,
        from_index: int | None = None,
        *,
        max_records: int = DEFAULT_READ_RECORDS,
        max_bytes: int = DEFAULT_READ_BYTES,
        wait_ms: int = 0,
        timeout_s: float | None = None,
        isolation: str = ISOLATIONS[0],
    ) -> RawRead | ReadResult:
        """`read`, but the stored batches as they came (`RawRead`), for callers that decode
        them their own way (the Spark source builds Arrow columns). A broker that answered in
        JSON gives a decoded `ReadResult` instead."""
        query: dict[str, int | str] = {"max_records": max_records, "max_bytes": max_bytes}
        if from_index is not None:
            query["from"] = from_index
        if wait_ms:
            query["wait_ms"] = wait_ms
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation={isolation!r} must be one of {list(ISOLATIONS)}")
        if isolation != ISOLATIONS[0]:
            query["isolation"] = isolation
        timeout = (self._timeout_s if timeout_s is None else timeout_s) + max(wait_ms, 0) / 1000
        acked = self._acked.get((topic, int(partition)))
        answer = await self._call(
            *contract.READ_RECORDS.at(topic=topic, partition=int(partition)),
            query=query,
            accept=BATCH_TYPE,
            extra_headers=None if acked is None else {ACKED_INDEX_HEADER: str(acked)},
            target=_Target("replica", topic, partition),
            timeout_s=timeout,
        )
        content_type = answer.headers.get("Content-Type", "")
        try:
            if content_type.startswith(JSON_TYPE):
                return decode_read_json(answer.json() or {}, max_records=max_records)
            return RawRead(
                answer.body,
                _int_header(answer.headers, NEXT_INDEX_HEADER),
                _header_or(answer.headers, COMMIT_INDEX_HEADER, -1),
                _header_or(answer.headers, LOG_START_HEADER, 0),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise LaminarError(
                answer.status, "corrupt_response", f"undecodable read answer from {answer.url}: {e}"
            ) from e

    # ------------------------------------------------------------------ transactions

    def transaction(self, txn_id: str, *, timeout_ms: int | None = None) -> Transaction:
        """One transaction of the transactional producer `txn_id` (docs/transactions.md):

            async with client.transaction("billing-7") as tx:
                await tx.append("orders", 0, [Record(b"...")])
                await tx.append("audit", 0, [Record(b"...")])
            # committed here (aborted if the block raised)

        Entering it starts the id's producer (a new epoch, fencing any other instance).
        `transactional_producer` runs many transactions with one start."""
        return Transaction(self, txn_id, timeout_ms=timeout_ms)

    async def transactional_producer(
        self, txn_id: str, *, timeout_ms: int | None = None
    ) -> TransactionalProducer:
        """Start the transactional producer `txn_id` (fencing every other instance of it);
        its `transaction()`s then follow one another."""
        info = await self.init_transactions(txn_id, timeout_ms=timeout_ms)
        return TransactionalProducer(self, txn_id, info.producer_id)

    async def init_transactions(
        self, txn_id: str, *, timeout_ms: int | None = None, expiry_ms: int | None = None
    ) -> TxnProducerInfo:
        """`POST /v1/transactions/{id}`: a new epoch for the id (a 503 while the transaction
        an old instance left open is aborted is retried). `expiry_ms`: how long the id is
        kept once unused (the broker's default: 7 days)."""
        answer = await self._call(
            *contract.INIT_TXN.at(txn_id=txn_id),
            json_body=TxnInitRequest(timeout_ms, expiry_ms).to_json(),
            target=_META,
        )
        return _answer_as(answer, TxnProducerInfo)

    async def describe_transaction(self, txn_id: str) -> TxnDescription:
        """`GET /v1/transactions/{id}`."""
        answer = await self._call(*contract.DESCRIBE_TXN.at(txn_id=txn_id))
        return _answer_as(answer, TxnDescription)

    async def add_transaction_partitions(
        self, txn_id: str, producer_id: int, partitions: Sequence[tuple[str, int]]
    ) -> TxnDescription:
        """`POST /v1/transactions/{id}/partitions`."""
        body = TxnPartitionsRequest(producer_id, tuple((t, int(p)) for t, p in partitions))
        answer = await self._call(
            *contract.ADD_TXN_PARTITIONS.at(txn_id=txn_id), json_body=body.to_json(), target=_META
        )
        return _answer_as(answer, TxnDescription)

    async def end_transaction(
        self,
        txn_id: str,
        producer_id: int,
        *,
        commit: bool,
        also: Sequence[tuple[str, int]] = (),
        tag: str | None = None,
    ) -> TxnEnded:
        """`POST /v1/transactions/{id}/end`: commit or abort, and with it, all or none, the
        transactions of `also`'s (transactional id, producer id); `tag` is kept with how
        they ended. Sent again after an ambiguous failure, the same end is answered alike."""
        body = TxnEndRequest(producer_id, commit, tuple(also), tag)
        answer = await self._call(
            *contract.END_TXN.at(txn_id=txn_id), json_body=body.to_json(), target=_META
        )
        return _answer_as(answer, TxnEnded)

    async def write_marker(
        self, topic: str, partition: int, producer_id: int, *, commit: bool
    ) -> AppendResult:
        """(Brokers only) `POST .../partitions/{p}/markers`: a transaction marker."""
        answer = await self._call(
            *contract.WRITE_TXN_MARKER.at(topic=topic, partition=int(partition)),
            json_body=TxnMarkerRequest(producer_id, commit).to_json(),
            target=_Target("leader", topic, int(partition)),
        )
        return _answer_as(answer, AppendResult)

    # ------------------------------------------------------------------ shared queues

    async def acquire(
        self,
        topic: str,
        partition: int,
        group: str,
        *,
        consumer: str | None = None,
        max_messages: int = DEFAULT_ACQUIRE,
        lease_ms: int = DEFAULT_LEASE_MS,
        wait_ms: int = 0,
        max_bytes: int | None = None,
        timeout_s: float | None = None,
    ) -> Acquired:
        """Acquire up to `max_messages` free messages of `group` on the partition, oldest
        first, each held for `lease_ms`; long-polls up to `wait_ms` while none is free.

        Without `consumer` the broker makes an id up (`Acquired.consumer`): settle and renew
        with it. Served by the partition leader. The call is retried like a read, 504 included;
        a retry after a 504 or a connection that broke mid-call can leave what the lost
        attempt acquired held, hidden from the group, until its lease ends (then it is
        delivered again).
        """
        check_group(group)
        if consumer is not None:
            check_consumer(consumer)
        _check_range("max_messages", max_messages, 1, MAX_ACQUIRE)
        _check_range("lease_ms", lease_ms, 1, MAX_LEASE_MS)
        _check_range("wait_ms", wait_ms, 0, MAX_WAIT_MS)
        if max_bytes is not None:
            _check_range("max_bytes", max_bytes, 1, MAX_ACQUIRE_BYTES)
        body = AcquireRequest(consumer, max_messages, lease_ms, wait_ms or None, max_bytes)
        timeout = (self._timeout_s if timeout_s is None else timeout_s) + wait_ms / 1000
        answer = await self._call(
            *contract.ACQUIRE.at(topic=topic, partition=int(partition), group=group),
            json_body=body.to_json(),
            accept=f"{ACQUIRED_TYPE}, {JSON_TYPE}",
            target=_Target("leader", topic, partition),
            timeout_s=timeout,
        )
        if answer.headers.get("Content-Type", "").startswith(ACQUIRED_TYPE):
            try:
                return Acquired.from_binary(answer.body, topic=topic, partition=partition)
            except BatchError as e:
                raise _corrupt(answer, e) from e
        data = _json_object(answer)
        try:
            return Acquired.from_json(data, topic=topic, partition=partition, consumer=consumer)
        except (KeyError, TypeError, ValueError) as e:
            raise _corrupt(answer, e) from e

    async def accept(
        self,
        topic: str,
        partition: int,
        group: str,
        consumer: str,
        indexes: Sequence[int],
        *,
        txn_producer_id: int | None = None,
    ) -> Settled:
        """Accept messages `consumer` holds: the group forgets them (never delivered again).
        A repeat of its accept is `done` again (retrying is safe, so it is retried after a 504
        too); indexes it does not hold under a current lease (its lease ended) are `refused`
        (docs/api.md). With `txn_producer_id`, as part of that producer's transaction
        (`Transaction.accept` sends it): settled by its commit or abort."""
        return await self._settle(
            "accept", topic, partition, group, consumer, indexes, txn_producer_id=txn_producer_id
        )

    async def release(
        self, topic: str, partition: int, group: str, consumer: str, indexes: Sequence[int]
    ) -> Settled:
        """Give held messages back: they are delivered again (deliveries + 1)."""
        return await self._settle("release", topic, partition, group, consumer, indexes)

    async def reject(
        self,
        topic: str,
        partition: int,
        group: str,
        consumer: str,
        indexes: Sequence[int],
        reason: str | None = None,
    ) -> Settled:
        """Dead-letter held messages: appended once to `<topic>.dlq` (same partition) with
        `laminar.dlq.reason` = `reason` (1..200 characters; broker default "rejected")."""
        if reason is not None and not 1 <= len(reason) <= MAX_REASON_CHARS:
            raise ValueError(f"reason must be 1..{MAX_REASON_CHARS} characters")
        call = (topic, partition, group, consumer, indexes)
        return await self._settle("reject", *call, reason=reason)

    async def renew(
        self,
        topic: str,
        partition: int,
        group: str,
        consumer: str,
        indexes: Sequence[int],
        lease_ms: int,
    ) -> Settled:
        """Extend the leases of held messages to `lease_ms` from now (`lease_deadline_ms`);
        indexes `consumer` no longer holds are `refused`."""
        _check_range("lease_ms", lease_ms, 1, MAX_LEASE_MS)
        call = (topic, partition, group, consumer, indexes)
        return await self._settle("renew", *call, lease_ms=lease_ms)

    async def describe_group(self, topic: str, partition: int, group: str) -> GroupDescription:
        """`GET .../groups/{group}`: the group's cursor and message counts on the partition."""
        check_group(group)
        answer = await self._call(
            *contract.DESCRIBE_GROUP.at(topic=topic, partition=int(partition), group=group),
            target=_Target("leader", topic, partition),
        )
        data = _json_object(answer)
        try:
            return GroupDescription.from_json(
                {"topic": topic, "partition": partition, "group": group, **data}
            )
        except (KeyError, TypeError, ValueError) as e:
            raise _corrupt(answer, e) from e

    # ------------------------------------------------------------------ consumer group admin

    async def list_groups(self, topic: str) -> TopicGroups:
        """`GET /v1/topics/{topic}/groups`: the consumer groups of the topic, each with the
        partitions it is on and its lag over them (Kafka's list groups)."""
        answer = await self._call(*contract.LIST_GROUPS.at(topic=topic))
        return _answer_as(answer, TopicGroups)

    async def describe_topic_group(self, topic: str, group: str) -> TopicGroupDescription:
        """`GET /v1/topics/{topic}/groups/{group}`: the group on every partition it is on
        (cursor, acquired, pending, dead-lettered, lag), and its lag over them; NotFound when
        it is on none."""
        check_group(group)
        answer = await self._call(*contract.DESCRIBE_TOPIC_GROUP.at(topic=topic, group=group))
        return _answer_as(answer, TopicGroupDescription)

    async def reset_group(
        self,
        topic: str,
        group: str,
        *,
        to: Literal["earliest", "latest"] | None = None,
        index: int | None = None,
        timestamp_ms: int | None = None,
        force: bool = False,
        partitions: Sequence[int] | None = None,
    ) -> TopicGroupReset:
        """Move the group's cursor on `partitions` (None: every one) to exactly one of: `to`
        ("earliest": the log start, "latest": the end), `index`, `timestamp_ms` (the first
        record at or after it, else the end). Refused (Conflict) while the group holds
        messages or moves dead letters, unless `force` (they are dropped). Admin only.
        Repeating it is harmless, so it is retried like a read."""
        check_group(group)
        wanted = _reset_request(to, index, timestamp_ms, force, partitions)
        answer = await self._call(
            *contract.RESET_GROUP.at(topic=topic, group=group), json_body=wanted.to_json()
        )
        return _answer_as(answer, TopicGroupReset)

    async def delete_group(self, topic: str, group: str, *, force: bool = False) -> None:
        """Delete the group on every partition of the topic (NotFound when it is on none);
        refused (Conflict) while it is busy unless `force`. Admin only."""
        check_group(group)
        query = {"force": "true"} if force else None
        await self._call(*contract.DELETE_GROUP.at(topic=topic, group=group), query=query)

    async def partition_groups(self, topic: str, partition: int) -> PartitionGroups:
        """`GET .../partitions/{p}/groups`: every group on one partition, described."""
        answer = await self._call(
            *contract.LIST_PARTITION_GROUPS.at(topic=topic, partition=int(partition)),
            target=_Target("leader", topic, partition),
        )
        return _answer_as(answer, PartitionGroups)

    async def reset_partition_group(
        self, topic: str, partition: int, group: str, wanted: ResetGroupRequest
    ) -> GroupReset:
        """`POST .../partitions/{p}/groups/{group}/reset`: `reset_group` on one partition."""
        check_group(group)
        answer = await self._call(
            *contract.RESET_PARTITION_GROUP.at(topic=topic, partition=int(partition), group=group),
            json_body=wanted.to_json(),
            target=_Target("leader", topic, partition),
        )
        return _answer_as(answer, GroupReset)

    async def delete_partition_group(
        self, topic: str, partition: int, group: str, *, force: bool = False
    ) -> None:
        """`DELETE .../partitions/{p}/groups/{group}`: `delete_group` on one partition."""
        check_group(group)
        await self._call(
            *contract.DELETE_PARTITION_GROUP.at(topic=topic, partition=int(partition), group=group),
            query={"force": "true"} if force else None,
            target=_Target("leader", topic, partition),
        )

    # ------------------------------------------------------------------ offsets for times

    async def partition_offsets(
        self,
        topic: str,
        partition: int,
        *,
        timestamp_ms: int | None = None,
        isolation: str | None = None,
    ) -> PartitionOffsets:
        """The partition's log start and end and, with `timestamp_ms`, the index of its first
        record whose timestamp is at or after it (`index` None: no record that late)."""
        query = _offsets_query(timestamp_ms, isolation)
        answer = await self._call(
            *contract.PARTITION_OFFSETS.at(topic=topic, partition=int(partition)),
            query=query or None,
            target=_Target("leader", topic, partition),
        )
        return _answer_as(answer, PartitionOffsets)

    async def topic_offsets(
        self, topic: str, *, timestamp_ms: int | None = None, isolation: str | None = None
    ) -> TopicOffsets:
        """`partition_offsets` of every partition of the topic, in one call."""
        query = _offsets_query(timestamp_ms, isolation)
        answer = await self._call(*contract.TOPIC_OFFSETS.at(topic=topic), query=query or None)
        return _answer_as(answer, TopicOffsets)

    async def offsets_for_times(
        self, topic: str, timestamp_ms: int, *, isolation: str | None = None
    ) -> dict[int, tuple[int, int] | None]:
        """As Kafka's `offsets_for_times`: per partition, (index, timestamp) of the first
        record whose timestamp is at or after `timestamp_ms` (ms since the epoch), or None
        when the partition has no record that late."""
        found = await self.topic_offsets(topic, timestamp_ms=timestamp_ms, isolation=isolation)
        return {
            p.partition: None
            if p.index is None or p.record_timestamp_ms is None
            else (p.index, p.record_timestamp_ms)
            for p in found.partitions
        }

    async def _settle(
        self,
        action: Literal["accept", "release", "reject", "renew"],
        topic: str,
        partition: int,
        group: str,
        consumer: str,
        indexes: Sequence[int],
        *,
        reason: str | None = None,
        lease_ms: int = 0,
        txn_producer_id: int | None = None,
    ) -> Settled:
        check_group(group)
        check_consumer(consumer)
        checked = _check_indexes(indexes)
        body: SettleRequest | RejectRequest | RenewRequest
        if action == "reject":
            body = RejectRequest(consumer, checked, reason)
        elif action == "renew":
            body = RenewRequest(consumer, checked, lease_ms)
        else:
            body = SettleRequest(consumer, checked, txn_producer_id)
        route = contract.SETTLE_ROUTES[action]
        answer = await self._call(
            *route.at(topic=topic, partition=int(partition), group=group),
            json_body=body.to_json(),
            target=_Target("leader", topic, partition),
        )
        return _answer_as(answer, Settled)

    # ------------------------------------------------------------------ routing cache

    def _remember_cluster(self, info: ClusterInfo) -> None:
        self._cluster = info
        self._cluster_at = asyncio.get_running_loop().time()
        if info.metadata_leader:
            leader = info.member(info.metadata_leader)
            if leader is not None and leader.api_url:
                self._meta_url = leader.api_url.rstrip("/")

    def _remember_topic(self, description: TopicDescription) -> TopicDescription:
        name = description.name
        self._descriptions[name] = description
        self._described_at[name] = asyncio.get_running_loop().time()
        self._stale.discard(name)
        for state in description.partition_states:
            if state.leader_url:
                self._leaders[(name, state.partition)] = state.leader_url.rstrip("/")
            else:
                self._leaders.pop((name, state.partition), None)
        return description

    def _forget_topic(self, name: str) -> None:
        self._descriptions.pop(name, None)
        self._described_at.pop(name, None)
        self._stale.discard(name)
        for key in [k for k in self._leaders if k[0] == name]:
            del self._leaders[key]
        for key in [k for k in self._acked if k[0] == name]:
            del self._acked[key]

    def _note_acked(self, topic: str, partition: int, result: AppendResult) -> None:
        """`result` was acknowledged: reads of the partition are served through it."""
        last = result.base_index + result.count - 1
        key = (topic, int(partition))
        if last > self._acked.get(key, -1):
            self._acked[key] = last

    def _forget(self, target: _Target) -> None:
        """Something went wrong on the way to `target`: fetch its route again next time."""
        if target.kind == "meta":
            self._meta_url = None
        elif target.kind in ("leader", "replica"):
            self._leaders.pop(target.key, None)
            self._stale.add(target.topic)

    def _redirected(self, target: _Target, location: str) -> None:
        origin = _origin(location)
        if target.kind == "meta":
            self._meta_url = origin
        elif target.kind in ("leader", "replica"):
            self._leaders[target.key] = origin
            if target.kind == "replica":  # the broker we chose is no replica: ask again later
                self._stale.add(target.topic)

    async def _routing(self, topic: str, deadline: float) -> TopicDescription | None:
        """The topic's routing information, fetched again when stale (best effort)."""
        loop = asyncio.get_running_loop()
        if topic in self._described_at and topic not in self._stale:
            return self._descriptions.get(topic)  # good until something goes wrong
        if loop.time() - self._described_at.get(topic, float("-inf")) < ROUTE_REFRESH_S:
            return self._descriptions.get(topic)  # refreshed a moment ago: do not hammer
        task = self._refreshing.get(topic)
        if task is None:
            budget = max(0.05, min(deadline - loop.time(), self._timeout_s) / 2)
            task = loop.create_task(self._refresh(topic, budget))
            self._refreshing[topic] = task
            task.add_done_callback(lambda _: self._refreshing.pop(topic, None))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():
                return self._descriptions.get(topic)
            raise

    async def _refresh(self, topic: str, budget_s: float) -> TopicDescription | None:
        loop = asyncio.get_running_loop()
        try:
            answer = await self._call(*contract.DESCRIBE_TOPIC.at(topic=topic), timeout_s=budget_s)
            description = self._remember_topic(_answer_as(answer, TopicDescription))
            known = {m.id for m in self._cluster.members} if self._cluster else set()
            wanted = {n for s in description.partition_states for n in s.in_sync}
            if loop.time() - self._cluster_at > CLUSTER_TTL_S or not wanted <= known:
                info = await self._call(*contract.GET_CLUSTER.at(), timeout_s=budget_s)
                self._remember_cluster(_answer_as(info, ClusterInfo))
            return description
        except (LaminarError, KeyError, TypeError, ValueError):
            # Note the time so that a failing topic is not asked about on every call.
            self._described_at[topic] = loop.time()
            self._stale.add(topic)
            return self._descriptions.get(topic)

    async def _candidates(self, target: _Target, attempt: int, deadline: float) -> list[str]:
        """Base URLs to try for `target`, best first, ending with every bootstrap broker."""
        n = len(self._brokers)
        start = (self._first + (attempt if target.kind == "any" else 0)) % n
        brokers = self._brokers[start:] + self._brokers[:start]
        if target.kind == "any":
            return brokers
        if target.kind == "meta":
            return _dedupe([self._meta_url or "", *brokers])
        description = await self._routing(target.topic, deadline)
        leader = self._leaders.get(target.key, "")
        if target.kind == "leader":
            return _dedupe([leader, *brokers])
        replicas: list[str] = []
        state = description.partition(target.partition) if description else None
        if state is not None and self._cluster is not None:
            replicas = read_replicas(target.topic, target.partition, state, self._cluster.members)
            if replicas:  # retries start at the next replica
                shift = attempt % len(replicas)
                replicas = replicas[shift:] + replicas[:shift]
        return _dedupe([*replicas, leader, *brokers])

    def _answered(self, base: str) -> None:
        if base in self._brokers:
            self._first = self._brokers.index(base)

    def _unreachable(self, base: str, target: _Target) -> None:
        """No connection to `base` (a bootstrap broker, a cached leader, or where a redirect
        pointed): try the next bootstrap broker first, and forget it as a route."""
        if self._brokers[self._first] == base:
            self._first = (self._first + 1) % len(self._brokers)
        if target.kind == "meta" and self._meta_url == base:
            self._meta_url = None
        elif target.kind in ("leader", "replica"):
            if self._leaders.get(target.key) == base:
                self._leaders.pop(target.key, None)
            self._stale.add(target.topic)

    # ------------------------------------------------------------------ HTTP with retries

    async def _call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, int | str] | None = None,
        json_body: Any = None,
        body: bytes | None = None,
        content_type: str | None = None,
        accept: str = JSON_TYPE,
        extra_headers: Mapping[str, str] | None = None,
        target: _Target = _ANY,
        idempotent: bool = True,
        timeout_s: float | None = None,
    ) -> _Answer:
        """One API call with redirects, retries and failover (see the module doc)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self._timeout_s if timeout_s is None else timeout_s)
        if json_body is not None:
            body = orjson.dumps(json_body)
            content_type = JSON_TYPE
        headers = {"Accept": accept, **(extra_headers or {})}
        if content_type is not None:
            headers["Content-Type"] = content_type
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token}"
        if self._metadata_index >= 0:  # read-your-writes (laminar.contract)
            headers[METADATA_INDEX_HEADER] = str(self._metadata_index)
        path_and_query = path + (f"?{urlencode(query)}" if query else "")
        ambiguous = False
        last: LaminarError | None = None
        attempt = 0
        while True:
            answer: _Answer | None = None
            for base in await self._candidates(target, attempt, deadline):
                if loop.time() >= deadline:
                    break
                try:
                    answer = await self._send(
                        method, base + path_and_query, body, headers, deadline, target
                    )
                except h1.NotConnected as e:
                    self._unreachable(e.origin or base, target)  # where a redirect pointed
                    last = Unavailable(0, "unreachable", _not_reached(base, e.origin, e))
                    continue
                except h1.Broken as e:
                    self._unreachable(base, target)
                    ambiguous = ambiguous or method != "GET"
                    kind = Timeout if isinstance(e.cause, TimeoutError) else Unavailable
                    last = kind(0, "connection_lost", f"{method} {base}{path}: {e}")
                    if not idempotent:
                        last.ambiguous = True
                        raise last from e.cause
                    break
                except _TooManyRedirects:
                    self._forget(target)
                    last = Unavailable(0, "redirect_loop", f"over {MAX_REDIRECTS} redirects")
                    break
                self._answered(base)
                break
            if answer is not None:
                if 200 <= answer.status < 300:
                    return answer
                error = error_from_response(answer.status, answer.json())
                if isinstance(error, Timeout):  # proposed: it may still commit
                    ambiguous = ambiguous or method != "GET"
                error.ambiguous = ambiguous
                if not error.retryable or (isinstance(error, Timeout) and not idempotent):
                    raise error
                if not isinstance(error, Overloaded):
                    self._forget(target)
                last = error
            delay = min(MAX_BACKOFF_S, INITIAL_BACKOFF_S * 2**attempt) * random.uniform(0.5, 1)
            if answer is not None and answer.status == 429:
                retry_after = _int_header(answer.headers, "Retry-After")
                if retry_after is not None:
                    delay = max(delay, min(float(retry_after), MAX_BACKOFF_S))
            if loop.time() + delay >= deadline:
                if last is None:
                    last = Timeout(0, "timeout", f"{method} {path}: no answer in time")
                last.ambiguous = ambiguous
                raise last
            await asyncio.sleep(delay)
            attempt += 1

    def _saw_metadata_index(self, value: str | None) -> None:
        if value is not None and value.isascii() and value.isdigit() and len(value) <= 19:
            self._metadata_index = max(self._metadata_index, int(value))

    async def _send(
        self,
        method: str,
        url: str,
        body: bytes | None,
        headers: Mapping[str, str],
        deadline: float,
        target: _Target,
    ) -> _Answer:
        """One attempt: the request and the 307/308 redirects that follow it."""
        for _ in range(MAX_REDIRECTS + 1):
            answer = await self._http(method, url, body, headers, deadline)
            self.requests_sent += 1
            location = answer.headers.get("Location")
            if answer.status not in (307, 308) or not location:
                return answer
            self.redirects += 1
            url = str(URL(url).join(URL(location)))
            self._redirected(target, url)
        raise _TooManyRedirects

    async def _http(
        self,
        method: str,
        url: str,
        body: bytes | None,
        headers: Mapping[str, str],
        deadline: float,
    ) -> _Answer:
        if deadline - asyncio.get_running_loop().time() <= 0:
            raise h1.Broken(TimeoutError("the call's deadline passed"))
        try:
            status, answer_headers, data = await self._get_pool().request(
                method, url, headers, body, deadline, self._ssl
            )
        except h1.NotConnected as e:
            if isinstance(e.cause, ssl.SSLCertVerificationError):  # no retry can cure it
                raise LaminarError(
                    0,
                    "tls_error",
                    f"{_origin(url)}'s certificate is not valid for it or not trusted: "
                    f"{e.cause} (give the cluster's CA: ca_file=, --ca-file or "
                    "LAMINAR_CA_FILE)",
                ) from e.cause
            if isinstance(e.cause, ssl.SSLError):
                raise LaminarError(
                    0, "tls_error", f"TLS with {_origin(url)} failed (a plain-HTTP broker?): {e}"
                ) from e.cause
            e.origin = _origin(url)
            raise
        self._saw_metadata_index(answer_headers.get(METADATA_INDEX_HEADER))
        return _Answer(status, answer_headers, data, url)
