"""What the HTTP API's two ends agree on (docs/api.md, `server/openapi.yaml`), declared once
and imported by the broker's server, the async client and the `laminar` CLI.

* **Routes** (`ROUTES`): every operation's method, path, OpenAPI operationId, server handler
  and authorization action. The broker registers exactly these (`server/api.py`, `Api.app`)
  and authorizes each by its `access` (`server/auth.py`); the client builds its paths with
  `Route.url`; tests/server/test_openapi.py checks them against the spec and the app's router.
* **Media types, headers, name rules and limits**: the values both ends check a request
  against (the spec states them too, and the same test compares).
* **Read-your-writes for cluster metadata** (`METADATA_INDEX_HEADER`): every `/v1` answer
  carries the index up to which the answering broker has applied the cluster metadata
  (topics, members' weights and drains: the `__cluster` Raft group). A client sends back the
  highest index it has seen; a broker behind it waits (up to `METADATA_WAIT_S`) until it has
  applied that far before it serves the request, or answers 503 (nothing done; another
  broker may be ahead). So a client that changed the metadata, on any broker, reads its
  change back from every broker.
* **Read-your-writes for records** (`ACKED_INDEX_HEADER`): a follower learns that a record
  is committed a message after the leader acknowledged it. A read that names the highest
  index the client saw acknowledged is served only through it: by the replica once it has
  committed that far, else by the leader.

The JSON bodies of requests and answers are declared once as well, in `laminar.models` (code,
not constants: each model checks its JSON), which the same three import.

Adding an endpoint (docs/api.md, "Adding an endpoint"): its `Route` here (and in `ROUTES`),
its models in `laminar.models`, its handler on the server, its `AsyncClient` method, and
openapi.yaml and docs/api.md.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from urllib.parse import quote

from .credentials import Action

# ---- media types and headers ---------------------------------------------------------------

JSON_TYPE = "application/json"
#: record batches as stored (docs/formats.md): appends may send one, reads may answer them
BATCH_TYPE = "application/vnd.laminar.batch"
#: the binary acquire answer (laminar.queue.wire)
ACQUIRED_TYPE = "application/vnd.laminar.acquired"

METADATA_INDEX_HEADER = "Laminar-Metadata-Index"
#: How long a broker behind a client's metadata index waits for it before answering 503.
METADATA_WAIT_S = 5.0
#: A read's position, also in its binary answer: the index to read on from, the partition's
#: commit index and log start.
NEXT_INDEX_HEADER = "Laminar-Next-Index"
#: Read-your-writes for records: a read may carry the highest index of the partition that the
#: client saw acknowledged; a replica serves it only once committed that far (it waits up to
#: `ACKED_WAIT_S`, then a follower answers 307 to the leader, a leader 503).
ACKED_INDEX_HEADER = "Laminar-Acked-Index"
ACKED_WAIT_S = 1.0
COMMIT_INDEX_HEADER = "Laminar-Commit-Index"
LOG_START_HEADER = "Laminar-Log-Start"
#: On the 429 that refuses a connection over a client address's cap (read nothing, closed):
#: the cap, `--max-connections-per-client`. A client learns from it to hold no more
#: connections to that broker than it has open (`laminar.client.h1.Pool`).
CONNECTION_LIMIT_HEADER = "Laminar-Connection-Limit"

# ---- names ---------------------------------------------------------------------------------

TOPIC_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
#: a Raft node: a broker, or worker w (1-63) of one (`laminar.workers`)
WORKER_NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}(~[1-9][0-9]?)?")
GROUP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
CONSUMER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,199}")

# ---- limits --------------------------------------------------------------------------------

#: Record indexes, producer ids and sequences are below 2^63.
MAX_INDEX = 2**63 - 1
#: The metadata index header's value: a Raft index, ASCII digits, below 2**63.
MAX_METADATA_INDEX = MAX_INDEX
MAX_PARTITIONS = 10_000
MAX_REPLICATION_FACTOR = 7
#: A node's placement weight (0: it hosts nothing).
MAX_WEIGHT = 1_000_000
#: Records in one JSON append (a binary batch is bounded by the batch size limit only): the
#: broker's per-record work on JSON is Python, and bounded per request.
MAX_APPEND_RECORDS = 10_000
#: A read: records and bytes (defaults and most), and its long poll (an acquire's too).
#: The longest a transaction may stay open before the coordinator aborts it (its timeout_ms).
MAX_TXN_TIMEOUT_MS = 15 * 60 * 1000
#: A read's isolation, the default first: read_committed stops at the stable end (an open
#: transaction's first index) and leaves out aborted transactions' records.
ISOLATIONS = ("read_committed", "read_uncommitted")
DEFAULT_READ_RECORDS = 1000
MAX_READ_RECORDS = 100_000
DEFAULT_READ_BYTES = 1 << 20
MAX_READ_BYTES = 16 << 20
MAX_WAIT_MS = 60_000
#: How long a handoff (`POST /v1/nodes/{id}/handoff`) waits for the leaderships to move
#: before it answers how many are left; a client's deadline for it must exceed this.
HANDOFF_TIMEOUT_S = 10.0
#: `POST /v1/topics?wait_for_leaders=false`: answered once the topic is created, before its
#: partitions have leaders (by default the answer waits, up to the request timeout, until
#: every partition has one: the first append need not meet a 503).
WAIT_FOR_LEADERS = "wait_for_leaders"
#: Shared queues (docs/api.md, "Shared queues"): an acquire's messages and bytes, the leases,
#: the indexes of one accept, release, reject or renew, and a reject's reason.
DEFAULT_ACQUIRE = 100
MAX_ACQUIRE = 10_000
DEFAULT_ACQUIRE_BYTES = 1 << 20
MAX_ACQUIRE_BYTES = 16 << 20
DEFAULT_LEASE_MS = 30_000
MAX_LEASE_MS = 3_600_000
MAX_SETTLE_INDEXES = 100_000
MAX_REASON_CHARS = 200

# ---- routes --------------------------------------------------------------------------------

PATH_PARAM = re.compile(r"\{(\w+)\}")
#: Path parameters the spec names otherwise (`/v1/nodes/{id}`, `.../partitions/{p}`).
SPEC_PARAMS = {"node": "id", "partition": "p", "txn_id": "id"}


@dataclass(frozen=True, slots=True)
class Route:
    """One operation of the API."""

    method: str
    #: as aiohttp routes it: parameters in braces (`/v1/topics/{topic}`)
    path: str
    #: its `operationId` in openapi.yaml
    operation: str
    #: the server's handler: a method of `Api`, or of a part of it ("groups.<name>": of
    #: `GroupsApi`; "topic_groups.": `TopicGroupsApi`; "offsets.": `OffsetsApi`; ...)
    handler: str
    #: what authorization checks (laminar.credentials); None: open, no token needed
    access: Action | None

    @property
    def params(self) -> tuple[str, ...]:
        return tuple(PATH_PARAM.findall(self.path))

    @property
    def spec_path(self) -> str:
        """The path as openapi.yaml spells it."""
        return PATH_PARAM.sub(lambda m: "{" + SPEC_PARAMS.get(m[1], m[1]) + "}", self.path)

    def url(self, **params: str | int) -> str:
        """The path with `params` in it, each percent-encoded (a `/` too)."""
        return _url(self.path, tuple(params.items()))

    def at(self, **params: str | int) -> tuple[str, str]:
        """(method, path with `params`): an `AsyncClient._call`'s first arguments."""
        return self.method, self.url(**params)


@functools.lru_cache(maxsize=4096)
def _url(path: str, items: tuple[tuple[str, str | int], ...]) -> str:
    """`Route.url`, kept for the paths a client calls again and again (a partition's appends)."""
    params = dict(items)
    names = tuple(PATH_PARAM.findall(path))
    if set(params) != set(names):
        raise TypeError(f"{path} takes {names}, not {tuple(params)}")
    return PATH_PARAM.sub(lambda m: quote(str(params[m[1]]), safe=""), path)


_NODE = "/v1/nodes/{node}"
_TOPIC = "/v1/topics/{topic}"
_RECORDS = _TOPIC + "/partitions/{partition}/records"
_GROUP = _TOPIC + "/partitions/{partition}/groups/{group}"
_TOPIC_GROUP = _TOPIC + "/groups/{group}"
_TXN = "/v1/transactions/{txn_id}"

HEALTHZ = Route("GET", "/healthz", "healthz", "healthz", None)
READYZ = Route("GET", "/readyz", "readyz", "readyz", None)
METRICS = Route("GET", "/metrics", "metrics", "metrics_text", None)
GET_CLUSTER = Route("GET", "/v1/cluster", "getCluster", "cluster", Action.CLUSTER)
GET_NODE_PARTITIONS = Route(
    "GET", _NODE + "/partitions", "getNodePartitions", "node_partitions", Action.ADMIN
)
GET_NODE_TLS = Route("GET", _NODE + "/tls", "getNodeTls", "node_tls", Action.ADMIN)
DRAIN_NODE = Route("POST", _NODE + "/drain", "drainNode", "drain", Action.ADMIN)
UNDRAIN_NODE = Route("DELETE", _NODE + "/drain", "undrainNode", "undrain", Action.ADMIN)
SET_NODE_WEIGHT = Route("PUT", _NODE + "/weight", "setNodeWeight", "weight", Action.ADMIN)
HANDOFF_NODE = Route("POST", _NODE + "/handoff", "handoffNode", "handoff", Action.ADMIN)
LIST_TOPICS = Route("GET", "/v1/topics", "listTopics", "list_topics", Action.LIST)
CREATE_TOPIC = Route("POST", "/v1/topics", "createTopic", "create_topic", Action.ADMIN)
DESCRIBE_TOPIC = Route("GET", _TOPIC, "describeTopic", "describe_topic", Action.DESCRIBE)
ALTER_TOPIC = Route("PATCH", _TOPIC, "alterTopic", "alter_topic", Action.ADMIN)
DELETE_TOPIC = Route("DELETE", _TOPIC, "deleteTopic", "delete_topic", Action.ADMIN)
LIST_PARTITIONS = Route("GET", "/v1/partitions", "listPartitions", "list_partitions", Action.LIST)
APPEND_RECORDS = Route("POST", _RECORDS, "appendRecords", "append", Action.PRODUCE)
READ_RECORDS = Route("GET", _RECORDS, "readRecords", "read", Action.CONSUME)
STREAM_APPEND = Route(
    "GET", _RECORDS + "/stream", "streamAppendRecords", "append_stream", Action.PRODUCE
)
DESCRIBE_GROUP = Route("GET", _GROUP, "describeGroup", "groups.describe", Action.CONSUME)
ACQUIRE = Route("POST", _GROUP + "/acquire", "acquireMessages", "groups.acquire", Action.CONSUME)
ACCEPT = Route("POST", _GROUP + "/accept", "acceptMessages", "groups.settle", Action.CONSUME)
RELEASE = Route("POST", _GROUP + "/release", "releaseMessages", "groups.settle", Action.CONSUME)
REJECT = Route("POST", _GROUP + "/reject", "rejectMessages", "groups.settle", Action.CONSUME)
RENEW = Route("POST", _GROUP + "/renew", "renewLeases", "groups.settle", Action.CONSUME)
#: Consumer group admin (docs/api.md, "Consumer group admin"): on one partition (its leader
#: serves them) and across a topic's partitions (any broker, asking each leader in turn).
LIST_PARTITION_GROUPS = Route(
    "GET", _TOPIC + "/partitions/{partition}/groups", "listPartitionGroups", "groups.list",
    Action.CONSUME,
)  # fmt: skip
RESET_PARTITION_GROUP = Route(
    "POST", _GROUP + "/reset", "resetPartitionGroup", "groups.reset", Action.ADMIN
)
DELETE_PARTITION_GROUP = Route(
    "DELETE", _GROUP, "deletePartitionGroup", "groups.delete", Action.ADMIN
)
LIST_GROUPS = Route("GET", _TOPIC + "/groups", "listGroups", "topic_groups.list", Action.CONSUME)
DESCRIBE_TOPIC_GROUP = Route(
    "GET", _TOPIC_GROUP, "describeTopicGroup", "topic_groups.describe", Action.CONSUME
)
RESET_GROUP = Route(
    "POST", _TOPIC_GROUP + "/reset", "resetGroup", "topic_groups.reset", Action.ADMIN
)
DELETE_GROUP = Route("DELETE", _TOPIC_GROUP, "deleteGroup", "topic_groups.delete", Action.ADMIN)
#: Offsets for times (docs/api.md, "Offsets for times"): a partition's log start and end,
#: and the first record at or after a time; served by any replica, up to its commit.
PARTITION_OFFSETS = Route(
    "GET", _TOPIC + "/partitions/{partition}/offsets", "getPartitionOffsets",
    "offsets.partition", Action.DESCRIBE,
)  # fmt: skip
TOPIC_OFFSETS = Route(
    "GET", _TOPIC + "/offsets", "getTopicOffsets", "offsets.topic", Action.DESCRIBE
)
INIT_TXN = Route("POST", _TXN, "initTransactions", "txns.init", Action.TRANSACT)
DESCRIBE_TXN = Route("GET", _TXN, "describeTransactions", "txns.describe", Action.TRANSACT)
ADD_TXN_PARTITIONS = Route(
    "POST", _TXN + "/partitions", "addTransactionPartitions", "txns.add_partitions", Action.TRANSACT
)
END_TXN = Route("POST", _TXN + "/end", "endTransaction", "txns.end", Action.TRANSACT)
WRITE_TXN_MARKER = Route(
    "POST", _RECORDS.removesuffix("/records") + "/markers", "writeTransactionMarker",
    "txns.marker", Action.INTERNAL,
)  # fmt: skip
#: (Brokers only) a metadata write forwarded by the broker that took it to the metadata
#: leader (laminar.server.forward): the command as the metadata log stores it.
PROPOSE_METADATA = Route(
    "POST", "/v1/metadata/commands", "proposeMetadataCommand", "metadata.propose",
    Action.INTERNAL,
)  # fmt: skip

#: Every route the broker serves, in the order it registers them.
ROUTES: tuple[Route, ...] = (
    HEALTHZ,
    READYZ,
    METRICS,
    GET_CLUSTER,
    GET_NODE_PARTITIONS,
    GET_NODE_TLS,
    DRAIN_NODE,
    UNDRAIN_NODE,
    SET_NODE_WEIGHT,
    HANDOFF_NODE,
    LIST_TOPICS,
    CREATE_TOPIC,
    DESCRIBE_TOPIC,
    ALTER_TOPIC,
    DELETE_TOPIC,
    LIST_PARTITIONS,
    APPEND_RECORDS,
    READ_RECORDS,
    STREAM_APPEND,
    DESCRIBE_GROUP,
    ACQUIRE,
    ACCEPT,
    RELEASE,
    REJECT,
    RENEW,
    LIST_PARTITION_GROUPS,
    RESET_PARTITION_GROUP,
    DELETE_PARTITION_GROUP,
    LIST_GROUPS,
    DESCRIBE_TOPIC_GROUP,
    RESET_GROUP,
    DELETE_GROUP,
    PARTITION_OFFSETS,
    TOPIC_OFFSETS,
    INIT_TXN,
    DESCRIBE_TXN,
    ADD_TXN_PARTITIONS,
    END_TXN,
    WRITE_TXN_MARKER,
    PROPOSE_METADATA,
)
#: The queue commands that settle held messages, by the last segment of their path.
SETTLE_ROUTES = {"accept": ACCEPT, "release": RELEASE, "reject": REJECT, "renew": RENEW}
