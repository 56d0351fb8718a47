"""The cluster metadata state machine: topics, their configuration, node weights and drains,
and the transaction coordinator's records (laminar.txn.coordinator).

It is the state of the `__cluster` Raft group: every command is one committed entry, applied
in log order on every node. `apply` is deterministic and all-or-nothing: a command that is
invalid against the current state (a topic that exists, fewer partitions than before) returns
an error and changes nothing, so replicas never diverge. Snapshots are canonical JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ..contract import MAX_PARTITIONS as MAX_PARTITIONS
from ..contract import MAX_REPLICATION_FACTOR as MAX_REPLICATION_FACTOR
from ..contract import MAX_WEIGHT as MAX_WEIGHT
from ..contract import NODE_ID as NODE_ID
from ..contract import TOPIC_NAME as TOPIC_NAME
from ..contract import WORKER_NODE_ID
from ..log.config import FsyncPolicy, LogConfig
from ..txn import coordinator as txn
from ..txn.coordinator import (
    AddTxnPartitions,
    CompleteTxn,
    Coordinator,
    EndTxn,
    ForgetIdleTxns,
    InitTxn,
    TxnCommand,
    TxnError,
)

#: topic configuration keys: the log's knobs, validated by building a LogConfig
LOG_CONFIG_KEYS = frozenset(f.name for f in fields(LogConfig))
#: topic settings of its consumer groups (laminar.queue), beside the log's
QUEUE_CONFIG_KEYS = frozenset({"max_deliveries"})
MAX_DELIVERIES_LIMIT = 1_000_000
TOPIC_CONFIG_KEYS = LOG_CONFIG_KEYS | QUEUE_CONFIG_KEYS
#: the log's integer knobs (LogConfig checks their ranges), and those of them that take null
INT_CONFIG_KEYS = frozenset(f.name for f in fields(LogConfig) if f.type in ("int", "int | None"))
NULLABLE_CONFIG_KEYS = frozenset(f.name for f in fields(LogConfig) if f.type == "int | None")
MAX_CONFIG_INT = 2**63 - 1
FSYNC_POLICIES = tuple(policy.value for policy in FsyncPolicy)
#: The smallest max_batch_bytes and segment_overflow_bytes a topic may be given (so that its
#: batch limit is never below): room for the control batches the broker itself writes into
#: every partition's log (a new leader's no-op, a membership change naming a node id).
MIN_BATCH_LIMIT_BYTES = 1024
SNAPSHOT_VERSION = 1


class MetadataError(ValueError):
    """A command that cannot apply. `code`: invalid, exists or not_found."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


Assignment = tuple[tuple[str, ...], ...]  # per partition: its initial voters


@dataclass(frozen=True, slots=True)
class Topic:
    name: str
    partitions: int
    replication_factor: int
    config: Mapping[str, Any] = field(default_factory=dict)
    #: each partition's initial voters: every node bootstraps the partition's Raft group
    #: with these, so all agree; later moves are Raft configuration changes in the group
    assignment: Assignment = ()
    #: the metadata index of the CreateTopic: the topic's identity (a topic deleted and
    #: created again under the same name is another topic). -1: created before it was kept.
    created_index: int = -1


@dataclass(frozen=True, slots=True)
class CreateTopic:
    """Create a topic; the proposer fills `assignment` from placement as it sees it."""

    name: str
    partitions: int
    replication_factor: int
    config: Mapping[str, Any] = field(default_factory=dict)
    assignment: Assignment = ()


@dataclass(frozen=True, slots=True)
class AlterTopic:
    """Grow the partition count (with initial voters for the new partitions in
    `assignment`) and/or replace configuration keys (None: unchanged)."""

    name: str
    partitions: int | None = None
    config: Mapping[str, Any] | None = None
    assignment: Assignment = ()


@dataclass(frozen=True, slots=True)
class DeleteTopic:
    name: str


@dataclass(frozen=True, slots=True)
class SetWeight:
    node: str
    weight: int


@dataclass(frozen=True, slots=True)
class SetDraining:
    node: str
    draining: bool


Command = CreateTopic | AlterTopic | DeleteTopic | SetWeight | SetDraining | TxnCommand
TXN_COMMANDS = (InitTxn, AddTxnPartitions, EndTxn, CompleteTxn, ForgetIdleTxns)
_KINDS: dict[str, type[Any]] = {
    "create_topic": CreateTopic,
    "alter_topic": AlterTopic,
    "delete_topic": DeleteTopic,
    "set_weight": SetWeight,
    "set_draining": SetDraining,
    "init_txn": InitTxn,
    "add_txn_partitions": AddTxnPartitions,
    "end_txn": EndTxn,
    "complete_txn": CompleteTxn,
    "forget_idle_txns": ForgetIdleTxns,
}
_NAMES = {kind: name for name, kind in _KINDS.items()}


def _check_topic_name(name: object) -> str:
    if not isinstance(name, str) or not TOPIC_NAME.fullmatch(name):
        raise MetadataError(
            "invalid", f"topic name {name!r} must match {TOPIC_NAME.pattern} (at most 200 chars)"
        )
    return name


def _check_node(node: object, pattern: re.Pattern[str] = NODE_ID) -> str:
    if not isinstance(node, str) or not pattern.fullmatch(node):
        raise MetadataError("invalid", f"node id {node!r} must match {pattern.pattern}")
    return node


def _check_int(name: str, value: object, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise MetadataError("invalid", f"{name}={value!r} must be an integer in [{low}, {high}]")
    return value


def _check_config(config: object) -> dict[str, Any]:
    if not isinstance(config, Mapping):
        raise MetadataError("invalid", "config must be an object")
    unknown = sorted(set(config) - TOPIC_CONFIG_KEYS)
    if unknown:
        raise MetadataError(
            "invalid", f"unknown config keys {unknown}; known: {sorted(TOPIC_CONFIG_KEYS)}"
        )
    if "max_deliveries" in config:
        _check_int("max_deliveries", config["max_deliveries"], 1, MAX_DELIVERIES_LIMIT)
    try:
        LogConfig(**{k: v for k, v in config.items() if k in LOG_CONFIG_KEYS})
    except (TypeError, ValueError) as e:
        raise MetadataError("invalid", f"invalid config: {e}") from e
    return dict(sorted(config.items()))


def config_type_problem(key: str, value: object) -> str | None:
    """Why `value` is not of the type topic config `key` takes (naming both), else None (also
    for a key that is not a config key: that is another check's). Shared by the broker's
    proposal check and the command line, so both say the same."""
    if key in INT_CONFIG_KEYS:  # (max_deliveries: its own check names its range too)
        if value is None and key in NULLABLE_CONFIG_KEYS:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or value > MAX_CONFIG_INT:
            kind = "an integer or null" if key in NULLABLE_CONFIG_KEYS else "an integer"
            return f"invalid config: {key}={value!r} must be {kind} up to 2^63-1"
    elif key == "fsync" and value not in FSYNC_POLICIES:
        return f"invalid config: fsync={value!r} must be one of {', '.join(FSYNC_POLICIES)}"
    return None


def _check_config_values(config: Mapping[str, Any]) -> None:
    """Every setting of its type (`config_type_problem`: an integer setting a JSON integer,
    not a bool, not 5.0, of at most 2^63-1, or null where it may be), and batch limits of at
    least MIN_BATCH_LIMIT_BYTES. Checked on proposals only (`validate_proposal`), before
    LogConfig sees the values (it compares them without checking their types), and entries
    committed before this check must still apply as they did."""
    for key in sorted(set(config)):
        problem = config_type_problem(key, config[key])
        if problem is not None:
            raise MetadataError("invalid", problem)
    for key in ("max_batch_bytes", "segment_overflow_bytes"):
        value = config.get(key)
        if value is not None and value < MIN_BATCH_LIMIT_BYTES:
            raise MetadataError(
                "invalid",
                f"invalid config: {key}={value} is below {MIN_BATCH_LIMIT_BYTES} (the broker's "
                "own control batches must fit in a batch)",
            )


def _check_assignment(assignment: object, partitions: int, replication_factor: int) -> None:
    if not isinstance(assignment, tuple) or len(assignment) != partitions:
        raise MetadataError("invalid", f"assignment must list voters for {partitions} partitions")
    for voters in assignment:
        if not isinstance(voters, tuple) or not 1 <= len(voters) <= replication_factor:
            raise MetadataError(
                "invalid", f"each partition needs 1 to {replication_factor} initial voters"
            )
        if len(set(voters)) != len(voters):
            raise MetadataError("invalid", f"repeated voter in {list(voters)}")
        for node in voters:
            _check_node(node, WORKER_NODE_ID)  # (a broker's worker)


def validate(command: Command, *, unassigned: bool = False) -> None:
    """Checks that need no state (the API runs them before proposing). MetadataError.
    `unassigned`: a topic's partitions may come without their assignment yet (a proposal
    forwarded to the metadata leader, which makes it: `NodeCore.propose_metadata`)."""
    if isinstance(command, TXN_COMMANDS):
        try:
            txn.validate(command)
        except TxnError as e:
            raise MetadataError(e.code, str(e)) from e
    elif isinstance(command, CreateTopic):
        _check_topic_name(command.name)
        _check_int("partitions", command.partitions, 1, MAX_PARTITIONS)
        _check_int("replication_factor", command.replication_factor, 1, MAX_REPLICATION_FACTOR)
        _check_config(command.config)
        if not (unassigned and command.assignment == ()):
            _check_assignment(command.assignment, command.partitions, command.replication_factor)
    elif isinstance(command, AlterTopic):
        _check_topic_name(command.name)
        if command.partitions is not None:
            _check_int("partitions", command.partitions, 1, MAX_PARTITIONS)
        if command.config is not None:
            _check_config(command.config)
    elif isinstance(command, DeleteTopic):
        _check_topic_name(command.name)
    elif isinstance(command, SetWeight):
        _check_node(command.node)
        _check_int("weight", command.weight, 0, MAX_WEIGHT)
    else:
        _check_node(command.node, WORKER_NODE_ID)  # (a worker drains apart from its broker)
        if not isinstance(command.draining, bool):
            raise MetadataError("invalid", "draining must be true or false")


def validate_proposal(command: Command, *, unassigned: bool = False) -> None:
    """`validate`, and the checks that only what a client proposes now must pass (entries
    committed before them must still apply as they did). MetadataError."""
    if isinstance(command, CreateTopic | AlterTopic) and isinstance(command.config, Mapping):
        _check_config_values(command.config)  # first: LogConfig's own errors name no key
    validate(command, unassigned=unassigned)


def encode_command(command: Command) -> bytes:
    body = {f.name: getattr(command, f.name) for f in fields(command)}
    return json.dumps({"op": _NAMES[type(command)], **body}, sort_keys=True).encode()


def _tuples(assignment: object) -> object:
    """JSON lists back to the tuples commands carry."""
    if isinstance(assignment, list):
        return tuple(tuple(v) if isinstance(v, list) else v for v in assignment)
    return assignment


def decode_command(data: bytes) -> Command:
    """Parse and validate a command; MetadataError("invalid") for anything malformed."""
    command = _parse_command(data)
    validate(command)
    return command


def decode_proposal(data: bytes) -> Command:
    """A command another broker forwarded to the metadata leader to propose
    (laminar.server.forward): as `decode_command`, but a new topic comes without its
    assignment, which the leader makes as it proposes it; checked as a proposal
    (`validate_proposal`), so that its refusal is the one the leader gives its own callers.
    MetadataError("invalid")."""
    command = _parse_command(data)
    validate_proposal(command, unassigned=True)
    return command


def _parse_command(data: bytes) -> Command:
    try:
        document = json.loads(data)
        kind = _KINDS[document.pop("op")]
        if "assignment" in document:
            document["assignment"] = _tuples(document["assignment"])
        for key in ("partitions", "also", "txn_ids"):
            if isinstance(document.get(key), list):
                document[key] = _tuples(document[key])
        command: Command = kind(**document)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise MetadataError("invalid", f"malformed metadata command: {e}") from e
    return command


class ClusterState:
    """Topics, weights and drains as of `applied_index` of the `__cluster` group."""

    def __init__(self) -> None:
        self.topics: dict[str, Topic] = {}
        self.weights: dict[str, int] = {}  # nodes without an entry weigh 1
        self.draining: set[str] = set()
        self.txns = Coordinator()
        self.applied_index = -1

    def weight(self, node: str) -> int:
        return self.weights.get(node, 1)

    def apply(self, index: int, command: Command) -> MetadataError | None:
        """Apply the command committed at `index`; an error leaves the state unchanged."""
        if index <= self.applied_index:
            raise ValueError(f"index {index} was already applied (at {self.applied_index})")
        self.applied_index = index
        try:
            validate(command)
            self._apply(index, command)
        except MetadataError as e:
            return e
        return None

    def _apply(self, index: int, command: Command) -> None:
        if isinstance(command, TXN_COMMANDS):
            partitions_of = {name: topic.partitions for name, topic in self.topics.items()}
            try:
                self.txns.apply(index, command, partitions_of)
            except TxnError as e:
                raise MetadataError(e.code, str(e)) from e
        elif isinstance(command, CreateTopic):
            if command.name in self.topics:
                raise MetadataError("exists", f"topic {command.name} exists")
            self.topics[command.name] = Topic(
                command.name,
                command.partitions,
                command.replication_factor,
                _check_config(command.config),
                command.assignment,
                created_index=index,
            )
        elif isinstance(command, AlterTopic):
            topic = self._topic(command.name)
            partitions = topic.partitions if command.partitions is None else command.partitions
            if partitions < topic.partitions:
                raise MetadataError(
                    "invalid",
                    f"topic {topic.name} has {topic.partitions} partitions; they can only grow",
                )
            _check_assignment(
                command.assignment, partitions - topic.partitions, topic.replication_factor
            )
            config = dict(topic.config)
            config.update(command.config or {})
            self.topics[topic.name] = Topic(
                topic.name,
                partitions,
                topic.replication_factor,
                _check_config(config),
                topic.assignment + command.assignment,
                created_index=topic.created_index,
            )
        elif isinstance(command, DeleteTopic):
            self._topic(command.name)
            del self.topics[command.name]
        elif isinstance(command, SetWeight):
            self.weights[command.node] = command.weight
        elif command.draining:
            self.draining.add(command.node)
        else:
            self.draining.discard(command.node)

    def _topic(self, name: str) -> Topic:
        topic = self.topics.get(name)
        if topic is None:
            raise MetadataError("not_found", f"topic {name} does not exist")
        return topic

    def snapshot(self) -> bytes:
        document = {
            "version": SNAPSHOT_VERSION,
            "applied_index": self.applied_index,
            "topics": [
                {
                    "name": t.name,
                    "partitions": t.partitions,
                    "replication_factor": t.replication_factor,
                    "config": dict(t.config),
                    "assignment": [list(voters) for voters in t.assignment],
                    "created_index": t.created_index,
                }
                for _, t in sorted(self.topics.items())
            ],
            "weights": dict(sorted(self.weights.items())),
            "draining": sorted(self.draining),
            "transactions": self.txns.document(),
        }
        return json.dumps(document, sort_keys=True).encode()

    @classmethod
    def restore(cls, data: bytes) -> ClusterState:
        document = json.loads(data)
        if document.get("version") != SNAPSHOT_VERSION:
            raise MetadataError(
                "invalid", f"unsupported snapshot version {document.get('version')}"
            )
        state = cls()
        state.applied_index = document["applied_index"]
        for topic in document["topics"]:
            state.topics[topic["name"]] = Topic(
                topic["name"],
                topic["partitions"],
                topic["replication_factor"],
                topic["config"],
                tuple(tuple(voters) for voters in topic["assignment"]),
                created_index=topic.get("created_index", -1),
            )
        state.weights = dict(document["weights"])
        state.draining = set(document["draining"])
        if "transactions" in document:  # (none kept before transactions)
            state.txns = Coordinator.from_document(document["transactions"])
        return state
