"""The API's JSON models (laminar.models), which the broker and the client share: each one
survives a round trip through JSON, writes what its schema in openapi.yaml says (every
property the schema has, and no other), reads the examples of docs/api.md back as they are,
and refuses what is not its JSON with the broker's own messages."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from openapi_schema_validator import OAS31Validator

from laminar import models
from laminar.contract import MAX_APPEND_RECORDS, MAX_WEIGHT
from laminar.log.batch import Record, StoredRecord
from laminar.models import (
    ABSENT,
    AcquiredMessage,
    AcquireRequest,
    AcquireResult,
    AlterTopicRequest,
    AppendRequest,
    AppendResult,
    ClusterInfo,
    CreateTopicRequest,
    ErrorBody,
    GroupDescription,
    GroupReset,
    GroupSummary,
    Handoff,
    HostedPartition,
    JsonModel,
    Member,
    MetadataCommitted,
    ModelError,
    NodeAdminState,
    NodePartitions,
    NodeTls,
    PartitionGroups,
    PartitionList,
    PartitionOffsets,
    PartitionState,
    ReadResult,
    RejectRequest,
    RenewRequest,
    ResetGroupRequest,
    Settled,
    SettleRequest,
    TooLargeError,
    TopicDescription,
    TopicGroupDescription,
    TopicGroupReset,
    TopicGroups,
    TopicInfo,
    TopicList,
    TopicOffsets,
    TxnDescription,
    TxnEnded,
    TxnEndRequest,
    TxnInitRequest,
    TxnMarkerRequest,
    TxnPartitionsRequest,
    TxnProducerInfo,
    WeightRequest,
)

REPO = Path(__file__).resolve().parents[1]
OPENAPI = REPO / "broker" / "laminar" / "server" / "openapi.yaml"
API_DOC = REPO / "docs" / "api.md"
FINGERPRINT = "ab" * 32

TEXT = StoredRecord(17, 1_700_000_000_000, b"k1", "héllo".encode(), (("h", b"v"),))
BINARY = StoredRecord(18, 1_700_000_000_001, None, b"\xff\x00", (("h", b"\x80"),))
MEMBER = Member("n1", "http://127.0.0.1:9001", "alive", 2, True, "127.0.0.1:9101")
STATE = PartitionState(
    0, "n1", "http://127.0.0.1:9001", ("n1", "n2"), ("n3",), ("n1",), 1, 9, 10, 4
)
NO_LEADER = PartitionState(1, None, None, ("n1",), (), (), 0, -1, 0)
HOSTED = HostedPartition("t", 0, "leader", "n1", 4, ("n1", "n2"), ("n3",), ("n1",), 1, 9, 10, 4096)
TOPIC = TopicInfo("t", 2, 3, {"retention_ms": 60_000, "fsync": "never"})
MESSAGE = AcquiredMessage(TEXT, 2, 1_700_000_030_000)
COMPONENT = "#/components/schemas/"
GROUP = GroupDescription("t", 0, "billing", 17, 2, 40, 0, 1200, 3, 59, 42, True)
RESET = GroupReset("t", 0, "billing", 59, 3, 61)

#: Each model's samples, with the schema each must match when it is not the model's own
#: (`SCHEMA`): between them they write every property their schemas have.
SAMPLES: dict[type[Any], list[tuple[Any, str | None]]] = {
    AppendRequest: [
        (AppendRequest((Record(b"v"),)), None),
        (
            AppendRequest(
                (
                    Record(b"v", b"k", (("h", b"x"),), 1_700_000_000_000),
                    Record(b"\xff", None, (("h", b""),)),
                ),
                producer_id=7,
                sequence=0,
            ),
            None,
        ),
        (AppendRequest((Record(b"v"),), 1 << 16, 3, transactional=True), None),
    ],
    AppendResult: [(AppendResult(17, 3, False), None), (AppendResult(17, 3, True), None)],
    ReadResult: [(ReadResult([TEXT, BINARY], 19, 99, 1), None), (ReadResult([], 5, 4, 5), None)],
    TopicInfo: [(TOPIC, None)],
    TopicList: [(TopicList((TOPIC, TopicInfo("u", 1, 1, {}))), None), (TopicList(()), None)],
    PartitionState: [
        (STATE, None),
        (NO_LEADER, None),
        (replace(STATE, topic="t"), COMPONENT + "PartitionList/properties/partitions/items"),
    ],
    PartitionList: [
        (PartitionList((replace(NO_LEADER, topic="t"), replace(STATE, topic="u"))), None)
    ],
    TopicDescription: [
        (TopicDescription("t", 2, 3, {"retention_ms": 60_000}, (STATE, NO_LEADER)), None)
    ],
    CreateTopicRequest: [
        (CreateTopicRequest("t"), None),
        (CreateTopicRequest("t", 6, 3, {"retention_ms": 60_000}), None),
    ],
    AlterTopicRequest: [
        (AlterTopicRequest(partitions=4), None),
        (AlterTopicRequest(config={"retention_bytes": None}), None),
    ],
    Member: [(MEMBER, None), (Member("n2", "http://127.0.0.1:9002", "dead"), None)],
    ClusterInfo: [(ClusterInfo("local", "n1", "n1", (MEMBER,)), None)],
    HostedPartition: [(HOSTED, None)],
    NodePartitions: [(NodePartitions("n1", (HOSTED,)), None), (NodePartitions("n2", ()), None)],
    NodeTls: [
        (NodeTls("n1", False), None),
        (NodeTls("n1", True, FINGERPRINT, "2027-02-22T10:00:00Z", (FINGERPRINT,), 2, ""), None),
    ],
    NodeAdminState: [(NodeAdminState("n1", True, 0), None)],
    WeightRequest: [(WeightRequest(0), None), (WeightRequest(MAX_WEIGHT), None)],
    TxnInitRequest: [
        (TxnInitRequest(), None),
        (TxnInitRequest(900_000), None),
        (TxnInitRequest(None, 60_000), None),
    ],
    TxnProducerInfo: [(TxnProducerInfo("billing-7", 1 << 16, 60_000), None)],
    TxnPartitionsRequest: [(TxnPartitionsRequest(1 << 16, (("orders", 0), ("a.b", 9))), None)],
    TxnEndRequest: [
        (TxnEndRequest(2**64 - 1, True), None),
        (TxnEndRequest(1, False), None),
        (TxnEndRequest(7, True, (("spark-q-1", 1 << 16), ("spark-q-2", 2 << 16)), "17"), None),
    ],
    TxnDescription: [
        (TxnDescription("t", 1 << 16, "ongoing", (("orders", 3),), 1_000, 60_000), None),
        (TxnDescription("t:2", 5, "empty", (), 60_000, 120_000, True, "batch 7"), None),
    ],
    TxnEnded: [(TxnEnded("t", True, True, 2), None), (TxnEnded("t", False, False, 9), None)],
    TxnMarkerRequest: [(TxnMarkerRequest(1 << 16 | 1, False), None)],
    Handoff: [(Handoff("n1", 0), None)],
    MetadataCommitted: [(MetadataCommitted(0), None), (MetadataCommitted(17), None)],
    AcquireRequest: [
        (AcquireRequest(), None),
        (AcquireRequest("web-1:42", 100, 30_000, 1000, 1 << 20), None),
    ],
    AcquiredMessage: [
        (MESSAGE, None),
        (AcquiredMessage(BINARY, 1, 5), None),
    ],
    AcquireResult: [(AcquireResult("c-1", (MESSAGE,)), None), (AcquireResult("c-2", ()), None)],
    SettleRequest: [
        (SettleRequest("c-1", (17, 18)), None),
        (SettleRequest("c-1", (17,), 5 << 16), None),
    ],
    RejectRequest: [
        (RejectRequest("c-1", (17,)), None),
        (RejectRequest("c-1", (17,), "bad input"), None),
    ],
    RenewRequest: [(RenewRequest("c-1", (17,), 60_000), None)],
    Settled: [
        (Settled((17,), (19,)), None),
        (Settled((17,), (), 1_700_000_090_000), COMPONENT + "RenewResult"),
    ],
    GroupDescription: [
        (GroupDescription("t", 0, "billing", 17, 2, 40, 0, 1200, 3, 59), None),
        (GROUP, None),
    ],
    ResetGroupRequest: [
        (ResetGroupRequest("earliest", force=True, partitions=(0, 2)), None),
        (ResetGroupRequest(index=17), None),
        (ResetGroupRequest(timestamp_ms=1_767_268_800_000), None),
    ],
    GroupReset: [(RESET, None), (GroupReset("t", 1, "billing", None, 0, 12), None)],
    TopicGroupReset: [(TopicGroupReset("t", "billing", (RESET,)), None)],
    PartitionGroups: [
        (PartitionGroups("t", 0, (GROUP,)), None),
        (PartitionGroups("t", 1, ()), None),
    ],
    GroupSummary: [(GroupSummary("billing", (0, 1), 42), None)],
    TopicGroups: [(TopicGroups("t", (GroupSummary("billing", (0, 1), 42),)), None)],
    TopicGroupDescription: [(TopicGroupDescription("t", "billing", 42, (GROUP,)), None)],
    PartitionOffsets: [
        (PartitionOffsets("t", 0, 0, 120), None),
        (PartitionOffsets("t", 0, 0, 120, 1_767_268_800_000, 57, 1_767_268_800_250), None),
        (PartitionOffsets("t", 1, 3, 3, 1_767_268_800_000), None),  # none that late
    ],
    TopicOffsets: [(TopicOffsets("t", (PartitionOffsets("t", 0, 0, 120),)), None)],
    ErrorBody: [
        (ErrorBody("not_found", "no topic t"), None),
        (
            ErrorBody("not_leader", "ask n2", leader="n2", leader_url="http://127.0.0.1:9002"),
            COMPONENT + "NotLeaderError",
        ),
        (ErrorBody("out_of_range", "below", log_start=5), COMPONENT + "OutOfRangeError"),
        (ErrorBody("corrupt_data", "damaged", next_index=9), COMPONENT + "CorruptDataError"),
    ],
}
CASES = [
    pytest.param(sample, schema, id=f"{type(sample).__name__}-{n}")
    for samples in SAMPLES.values()
    for n, (sample, schema) in enumerate(samples)
]


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    with OPENAPI.open() as f:
        loaded: dict[str, Any] = yaml.safe_load(f)
    return loaded


def at(spec: dict[str, Any], pointer: str) -> dict[str, Any]:
    """The node of the document at JSON pointer `pointer`, its `$ref`s followed."""
    node: Any = spec
    for part in pointer.removeprefix("#/").split("/"):
        key = part.replace("~1", "/").replace("~0", "~")
        node = node[int(key)] if isinstance(node, list) else node[key]
    return resolved(spec, node)


def resolved(spec: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = at(spec, node["$ref"])
    return node


def properties(spec: dict[str, Any], schema: dict[str, Any]) -> set[str]:
    """The properties a schema names, those of the schemas it is `allOf` too."""
    schema = resolved(spec, schema)
    names = set(schema.get("properties", {}))
    for part in schema.get("allOf", ()):
        names |= properties(spec, part)
    return names


def validator(spec: dict[str, Any], pointer: str) -> OAS31Validator:
    return OAS31Validator(
        {"$ref": pointer, "components": spec["components"], "paths": spec["paths"]}
    )


def test_every_model_has_samples() -> None:
    assert set(SAMPLES) == set(models.MODELS)
    for model in models.MODELS:
        assert model.__dataclass_params__.frozen, model  # type: ignore[attr-defined]
        assert hasattr(model, "__slots__"), model


@pytest.mark.parametrize(("sample", "schema"), CASES)
def test_every_model_survives_a_round_trip_through_json(sample: JsonModel, schema: str) -> None:
    model = type(sample)
    assert model.from_json(sample.to_json()) == sample
    assert model.from_json(orjson.loads(orjson.dumps(sample.to_json()))) == sample


@pytest.mark.parametrize(("sample", "schema"), CASES)
def test_every_model_writes_what_its_schema_says(
    spec: dict[str, Any], sample: JsonModel, schema: str | None
) -> None:
    pointer = schema or type(sample).SCHEMA  # type: ignore[attr-defined]
    written = orjson.loads(orjson.dumps(sample.to_json()))
    validator(spec, pointer).validate(written)
    assert set(written) <= properties(spec, at(spec, pointer))


@pytest.mark.parametrize("model", models.MODELS, ids=lambda m: m.__name__)
def test_the_samples_of_a_model_write_every_property_of_its_schemas(
    spec: dict[str, Any], model: type[Any]
) -> None:
    written: set[str] = set()
    declared: set[str] = set()
    for sample, schema in SAMPLES[model]:
        written |= set(sample.to_json())
        declared |= properties(spec, at(spec, schema or model.SCHEMA))
    assert written == declared


#: The JSON examples of docs/api.md, by the keys only that model's have.
EXAMPLES = {
    ("members",): ClusterInfo,
    ("node_id", "partitions"): NodePartitions,
    ("node_id", "enabled"): NodeTls,
    ("name", "partition_states"): TopicDescription,
    ("partitions",): PartitionList,
    ("records", "producer_id"): AppendRequest,
    ("records", "next_index"): ReadResult,
    ("lease_ms", "wait_ms"): AcquireRequest,
    ("consumer", "messages"): AcquireResult,
    ("done", "refused"): Settled,
    ("cursor", "dead_letter_pending"): GroupDescription,
    ("to", "force"): ResetGroupRequest,
    ("group", "partitions"): TopicGroupReset,
    ("group", "lag", "partitions"): TopicGroupDescription,
    ("groups",): TopicGroups,
    ("record_timestamp_ms",): PartitionOffsets,
}


def test_the_examples_of_the_api_doc_read_back_as_they_are() -> None:
    """An answer's example is what the model writes again (the wire is the broker's, field
    for field); a request's reads into a model that writes what reads back the same."""
    seen = set()
    for block in re.findall(r"```json\n(.*?)```", API_DOC.read_text(), re.S):
        example = json.loads(block)
        fits = [keys for keys in EXAMPLES if all(k in example for k in keys)]
        most = max(map(len, fits))
        (model,) = [EXAMPLES[keys] for keys in fits if len(keys) == most]
        parsed = model.from_json(example)
        if model.__name__.endswith("Request"):
            assert model.from_json(parsed.to_json()) == parsed
        else:
            assert parsed.to_json() == example
        seen.add(model)
    assert seen == set(EXAMPLES.values())


@pytest.mark.parametrize(
    ("model", "body", "message"),
    [
        (TxnInitRequest, {"timeout_ms": 0}, "timeout_ms must be in [1, 900000]"),
        (TxnInitRequest, {"timeout": 5}, "unknown fields ['timeout']"),
        (
            TxnPartitionsRequest,
            {"producer_id": 1, "partitions": []},
            "partitions must not be empty",
        ),
        (
            TxnPartitionsRequest,
            {"producer_id": 1, "partitions": [{"topic": "-x", "partition": 0}]},
            "'-x'/0 is not a topic partition",
        ),
        (
            TxnEndRequest,
            {"producer_id": 0, "commit": True},
            "producer_id must be in [1, 18446744073709551615]",
        ),
        (TxnEndRequest, {"producer_id": 1, "commit": 1}, "commit must be true or false, not 1"),
        (TxnInitRequest, {"expiry_ms": 5}, "expiry_ms must be in [60000, 7776000000]"),
        (
            TxnEndRequest,
            {"producer_id": 1, "commit": True, "tag": ""},
            "tag: 1 to 200 printable characters",
        ),
        (
            TxnEndRequest,
            {"producer_id": 1, "commit": True, "also": [{"transactional_id": "a b"}]},
            "transactional id 'a b' must match [A-Za-z0-9][A-Za-z0-9._:-]{0,199}",
        ),
        (
            TxnEndRequest,
            {"producer_id": 1, "commit": True, "also": [{"transactional_id": "a"}]},
            "producer_id is missing",
        ),
        (TxnMarkerRequest, {"producer_id": 1}, "commit is missing"),
        (AppendRequest, [], 'the body must be {"records": [...]}'),
        (AppendRequest, {"records": []}, "records must not be empty"),
        (
            AppendRequest,
            {"records": [{}], "producer_id": 0, "sequence": 0},
            "producer_id must be an integer in [1, 2^63-1]",
        ),
        (AppendRequest, {"records": [{}], "sequence": 0}, "give producer_id and sequence together"),
        (AppendRequest, {"records": [{"value": 1}]}, "records[0].value must be a string or null"),
        (AppendRequest, {"records": [{"x": 1}]}, "records[0] has unknown fields ['x']"),
        (
            AppendRequest,
            {"records": [{"value": "@", "encoding": "base64"}]},
            "records[0].value is not valid base64",
        ),
        (WeightRequest, {"weight": True}, f"weight must be an integer in [0, {MAX_WEIGHT}]"),
        (WeightRequest, [], f"weight must be an integer in [0, {MAX_WEIGHT}]"),
        (CreateTopicRequest, [], "the body must be a JSON object"),
        (CreateTopicRequest, {"name": "t", "x": 1, "a": 2}, "unknown fields ['a', 'x']"),
        (AlterTopicRequest, {}, 'send an object with "partitions" and/or "config"'),
        (AcquireRequest, {"max": None}, "max must be an integer in [1, 10000]"),
        (
            AcquireRequest,
            {"consumer": ":x"},
            "consumer must match [A-Za-z0-9][A-Za-z0-9._:-]{0,199}",
        ),
        (AcquireRequest, {"group": "g"}, "unknown fields ['group']"),
        (SettleRequest, {"indexes": [1]}, "consumer is required (the id acquire returned)"),
        (
            SettleRequest,
            {"consumer": "c", "indexes": []},
            "indexes must be a list of 1..100000 record indexes",
        ),
        (
            SettleRequest,
            {"consumer": "c", "indexes": [1], "reason": "r"},
            "unknown fields ['reason']",
        ),
        (
            RejectRequest,
            {"consumer": "c", "indexes": [1], "reason": ""},
            "reason must be a string of 1..200 characters",
        ),
        (RenewRequest, {"consumer": "c", "indexes": [1]}, "lease_ms is required (the new lease)"),
        (
            RenewRequest,
            {"consumer": "c", "indexes": [1], "lease_ms": 0},
            "lease_ms must be an integer in [1, 3600000]",
        ),
    ],
)
def test_request_bodies_are_refused_with_the_broker_messages(
    model: type[Any], body: Any, message: str
) -> None:
    with pytest.raises(ModelError) as refused:
        model.from_json(body)
    assert str(refused.value) == message


def test_an_append_over_the_record_limit_is_too_large() -> None:
    with pytest.raises(TooLargeError, match=f"at most {MAX_APPEND_RECORDS} records"):
        AppendRequest.from_json({"records": [{}] * (MAX_APPEND_RECORDS + 1)})


def test_answers_of_the_wrong_types_are_refused() -> None:
    good = AppendResult(1, 2).to_json()
    for bad in ({**good, "count": True}, {**good, "count": "2"}, {"base_index": 1}, [], None):
        with pytest.raises(ModelError):
            AppendResult.from_json(bad)
    with pytest.raises(ModelError, match="members"):
        ClusterInfo.from_json({"cluster_id": "c", "node_id": "n1", "metadata_leader": None})
    with pytest.raises(ModelError, match="in_sync"):
        PartitionState.from_json({**STATE.to_json(), "in_sync": [1]})
    assert CreateTopicRequest.from_json({"name": "t"}) == CreateTopicRequest("t", ABSENT)
    # a left-out field and a null one differ (the broker refuses the null)
    assert CreateTopicRequest.from_json({"name": "t", "config": None}).config is None
