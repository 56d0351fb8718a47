"""The HTTP API's JSON bodies (docs/api.md, `server/openapi.yaml`), declared once and used by
both ends: the broker builds its answers with them and parses request bodies with them, the
client sends requests with them and returns the answers as them (`laminar.client` re-exports
them), and the `laminar` CLI prints them.

Each model is a frozen dataclass with `to_json()` (the JSON object as the API writes it: a
field the spec leaves optional is left out, not null, when the model has nothing for it) and
`from_json(obj)` (checks the JSON's types and raises `ModelError`, a ValueError, saying what is
wrong; the broker answers a request body's 400, or 413 for `TooLargeError`). Its `SCHEMA` is
the JSON pointer of its schema in openapi.yaml (tests/test_models.py holds them together).
Fields are named as in the JSON, except where a unit or a clearer name helps (`max_messages`
for an acquire's `max`) or the JSON nests (`NodeTls.fingerprint`).

`laminar.contract` keeps the routes, limits, media types and name rules the models use; the
models live apart from it because they are code (checks and conversions), one module per part
of the API: records, topics, cluster, queues, transactions, errors.
"""

from .checks import JsonModel, ModelError, TooLargeError
from .cluster import (
    ClusterInfo,
    Handoff,
    HostedPartition,
    Member,
    MetadataCommitted,
    NodeAdminState,
    NodePartitions,
    NodeTls,
    WeightRequest,
)
from .errors import ErrorBody
from .group_admin import (
    GroupReset,
    GroupSummary,
    PartitionGroups,
    PartitionOffsets,
    ResetGroupRequest,
    TopicGroupDescription,
    TopicGroupReset,
    TopicGroups,
    TopicOffsets,
)
from .queues import (
    DEFAULT_REJECT_REASON,
    AcquiredMessage,
    AcquireRequest,
    AcquireResult,
    GroupDescription,
    RejectRequest,
    RenewRequest,
    Settled,
    SettleRequest,
)
from .records import (
    AppendRequest,
    AppendResult,
    ReadResult,
    record_from_json,
    record_to_json,
)
from .topics import (
    ABSENT,
    AlterTopicRequest,
    CreateTopicRequest,
    PartitionList,
    PartitionState,
    TopicDescription,
    TopicInfo,
    TopicList,
)
from .transactions import (
    TxnDescription,
    TxnEnded,
    TxnEndRequest,
    TxnInitRequest,
    TxnMarkerRequest,
    TxnPartitionsRequest,
    TxnProducerInfo,
)

#: Every model, for the tests that hold them to the spec.
MODELS = (
    TxnInitRequest,
    TxnProducerInfo,
    TxnPartitionsRequest,
    TxnEndRequest,
    TxnDescription,
    TxnEnded,
    TxnMarkerRequest,
    AppendRequest,
    AppendResult,
    ReadResult,
    TopicInfo,
    TopicList,
    PartitionState,
    PartitionList,
    TopicDescription,
    CreateTopicRequest,
    AlterTopicRequest,
    Member,
    ClusterInfo,
    HostedPartition,
    NodePartitions,
    NodeTls,
    NodeAdminState,
    WeightRequest,
    Handoff,
    MetadataCommitted,
    AcquireRequest,
    AcquiredMessage,
    AcquireResult,
    SettleRequest,
    RejectRequest,
    RenewRequest,
    Settled,
    GroupDescription,
    ResetGroupRequest,
    GroupReset,
    TopicGroupReset,
    PartitionGroups,
    GroupSummary,
    TopicGroups,
    TopicGroupDescription,
    PartitionOffsets,
    TopicOffsets,
    ErrorBody,
)

__all__ = [
    "ABSENT",
    "DEFAULT_REJECT_REASON",
    "MODELS",
    "AcquireRequest",
    "AcquireResult",
    "AcquiredMessage",
    "AlterTopicRequest",
    "AppendRequest",
    "AppendResult",
    "ClusterInfo",
    "CreateTopicRequest",
    "ErrorBody",
    "GroupDescription",
    "GroupReset",
    "GroupSummary",
    "Handoff",
    "HostedPartition",
    "JsonModel",
    "Member",
    "MetadataCommitted",
    "ModelError",
    "NodeAdminState",
    "NodePartitions",
    "NodeTls",
    "PartitionGroups",
    "PartitionList",
    "PartitionOffsets",
    "PartitionState",
    "ReadResult",
    "RejectRequest",
    "RenewRequest",
    "ResetGroupRequest",
    "SettleRequest",
    "Settled",
    "TooLargeError",
    "TopicDescription",
    "TopicGroupDescription",
    "TopicGroupReset",
    "TopicGroups",
    "TopicInfo",
    "TopicList",
    "TopicOffsets",
    "TxnDescription",
    "TxnEndRequest",
    "TxnEnded",
    "TxnInitRequest",
    "TxnMarkerRequest",
    "TxnPartitionsRequest",
    "TxnProducerInfo",
    "WeightRequest",
    "record_from_json",
    "record_to_json",
]
