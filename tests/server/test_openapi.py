"""broker/laminar/server/openapi.yaml is a valid OpenAPI 3.1 document and covers the API contract.

The contract is `laminar.contract` (DESIGN.md §5): its routes are exactly what a broker's
application serves and what the document describes (operationId and access included), and
its limits and name rules are the document's. docs/api.md, the guide with examples, is read
too: its endpoints and JSON examples must match the document, so the two cannot drift.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from openapi_schema_validator import OAS31Validator
from openapi_spec_validator import validate

from laminar import contract

REPO = Path(__file__).resolve().parents[2]
OPENAPI = REPO / "broker" / "laminar" / "server" / "openapi.yaml"
API_SPEC = REPO / "docs" / "api.md"

#: (method, path) of every operation, as the spec spells them
ENDPOINTS = {(route.method.lower(), route.spec_path) for route in contract.ROUTES}
METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")
BATCH_TYPE = contract.BATCH_TYPE
ENDPOINT_IN_MARKDOWN = re.compile(r"`(GET|POST|PUT|PATCH|DELETE) (/[^\s`?]*)")


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    with OPENAPI.open() as f:
        loaded: dict[str, Any] = yaml.safe_load(f)
    return loaded


def operations(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (method, path): op
        for path, item in doc["paths"].items()
        for method, op in item.items()
        if method in METHODS
    }


def resolve(doc: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        target: Any = doc
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


def response(doc: dict[str, Any], method: str, path: str, status: str) -> dict[str, Any]:
    return resolve(doc, operations(doc)[(method, path)]["responses"][status])


def schema_validator(doc: dict[str, Any], name: str) -> OAS31Validator:
    schema = {"$ref": f"#/components/schemas/{name}", "components": doc["components"]}
    return OAS31Validator(schema)


def test_the_document_is_valid_openapi_3_1(doc: dict[str, Any]) -> None:
    assert doc["openapi"].startswith("3.1")
    validate(doc)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> set[tuple[str, str]]:
    """(method, route) of every route a broker's application serves (built, never started)."""
    from laminar.server.api import Api
    from laminar.server.config import BrokerConfig, new_secret
    from laminar.server.console import is_console_route
    from laminar.server.metrics import BrokerMetrics
    from laminar.server.node import Broker

    path = tmp_path_factory.mktemp("openapi") / "n1"
    broker = Broker(BrokerConfig("n1", path, secret=new_secret(), allow_anonymous=True))
    app = Api(broker, BrokerMetrics(broker)).app()
    routes = {(r.method, r.resource.canonical) for r in app.router.routes() if r.resource}
    return {route for route in routes if not is_console_route(route[1])}  # (docs/console.md)


def test_the_broker_serves_the_contract_routes(served: set[tuple[str, str]]) -> None:
    """The broker registers exactly the contract's routes (each GET with its HEAD)."""
    routes = [(route.method, route.path) for route in contract.ROUTES]
    assert len(set(routes)) == len(routes)
    heads = {("HEAD", path) for method, path in routes if method == "GET"}
    assert served == set(routes) | heads
    operation_ids = [route.operation for route in contract.ROUTES]
    assert len(set(operation_ids)) == len(operation_ids)


def test_the_spec_describes_exactly_what_the_broker_serves(
    doc: dict[str, Any], served: set[tuple[str, str]]
) -> None:
    spec_path = {route.path: route.spec_path for route in contract.ROUTES}
    served_operations = {
        (method.lower(), spec_path.get(path, path)) for method, path in served if method != "HEAD"
    }
    assert set(operations(doc)) == served_operations == ENDPOINTS


def test_every_operation_has_the_contract_operation_id(doc: dict[str, Any]) -> None:
    ops = operations(doc)
    for route in contract.ROUTES:
        op = ops[(route.method.lower(), route.spec_path)]
        assert op["operationId"] == route.operation, (route.method, route.path)


def test_every_endpoint_of_the_spec_file_is_described(doc: dict[str, Any]) -> None:
    found = {(m.lower(), p) for m, p in ENDPOINT_IN_MARKDOWN.findall(API_SPEC.read_text())}
    assert found >= ENDPOINTS - {("get", "/healthz"), ("get", "/readyz"), ("get", "/metrics")}
    assert found <= set(operations(doc)), found - set(operations(doc))


def test_v1_paths_need_the_bearer_token_and_health_paths_do_not(doc: dict[str, Any]) -> None:
    schemes = doc["components"]["securitySchemes"]
    assert schemes["bearerAuth"] == {**schemes["bearerAuth"], "type": "http", "scheme": "bearer"}
    for (method, path), op in operations(doc).items():
        effective = op.get("security", doc.get("security", []))
        if path.startswith("/v1/"):
            assert {"bearerAuth": []} in effective, (method, path)
            unauthorized = response(doc, method, path, "401")
            assert "WWW-Authenticate" in unauthorized["headers"], (method, path)
        else:
            assert effective == [], (method, path)


def test_every_v1_operation_says_who_may_call_it_as_the_broker_enforces(
    doc: dict[str, Any],
) -> None:
    """403 on every /v1 operation, and its `x-laminar-access` is the access of its contract
    route, which the broker enforces (laminar/server/auth.py RULES): the document cannot drift
    from the code."""
    from laminar.server.auth import RULES

    ops = operations(doc)
    for route in contract.ROUTES:
        method, path = route.method.lower(), route.spec_path
        op = ops[(method, path)]
        if route.access is None:
            assert not path.startswith("/v1/") and "x-laminar-access" not in op, (method, path)
            continue
        forbidden = response(doc, method, path, "403")
        assert "forbidden" in forbidden["description"], (method, path)
        assert op["x-laminar-access"] == route.access.value, (method, path)
        assert RULES[(route.method, route.path)] is route.access, (method, path)


def test_error_responses_carry_the_error_schema_and_their_headers(doc: dict[str, Any]) -> None:
    required_headers = {"307": "Location", "429": "Retry-After", "503": "Retry-After"}
    for (method, path), op in operations(doc).items():
        if not path.startswith("/v1/"):
            continue
        for status in op["responses"]:
            if status.startswith(("4", "5")) or status == "307":
                resp = response(doc, method, path, status)
                schema = resolve(doc, resp["content"]["application/json"]["schema"])
                assert schema["required"] == ["error"], (method, path, status)
            if status in required_headers:
                headers = response(doc, method, path, status)["headers"]
                header = resolve(doc, headers[required_headers[status]])
                assert header["required"] is True, (method, path, status)


def test_the_error_examples_of_the_spec_validate(doc: dict[str, Any]) -> None:
    error = schema_validator(doc, "Error")
    error.validate({"error": {"code": "not_found", "message": "no topic t"}})
    error.validate({"error": {"code": "conflict", "message": "exists", "extra": 1}})
    assert not error.is_valid({"error": {"code": "no_such_code", "message": "x"}})
    assert not error.is_valid({"message": "x"})
    schema_validator(doc, "OutOfRangeError").validate(
        {"error": {"code": "out_of_range", "message": "below the log start", "log_start": 5}}
    )
    assert not schema_validator(doc, "OutOfRangeError").is_valid(
        {"error": {"code": "out_of_range", "message": "below the log start"}}
    )
    schema_validator(doc, "NotLeaderError").validate(
        {
            "error": {
                "code": "not_leader",
                "message": "ask n2",
                "leader": "n2",
                "leader_url": "http://127.0.0.1:9002",
            }
        }
    )


def test_writes_through_raft_may_answer_503_and_504(doc: dict[str, Any]) -> None:
    """Every write the broker proposes to a Raft group (metadata, records, queue commands) may
    answer 503 (nothing done) and 504 (the outcome unknown)."""
    proposing = {
        (method, path)
        for method, path in ENDPOINTS
        if method != "get" and path.startswith("/v1/") and not path.endswith("/handoff")
    }
    for method, path in proposing:
        assert {"503", "504"} <= set(operations(doc)[(method, path)]["responses"]), (method, path)


def test_records_speak_the_binary_batch_format(doc: dict[str, Any]) -> None:
    path = "/v1/topics/{topic}/partitions/{p}/records"
    append = operations(doc)[("post", path)]
    assert set(append["requestBody"]["content"]) == {"application/json", BATCH_TYPE}
    for status in ("307", "404", "409", "413", "429", "503", "504"):
        assert status in append["responses"]
    read = operations(doc)[("get", path)]
    ok = read["responses"]["200"]
    assert set(ok["content"]) == {"application/json", BATCH_TYPE}
    assert set(ok["headers"]) == {"Laminar-Next-Index", "Laminar-Commit-Index", "Laminar-Log-Start"}
    names = {(parameter["in"], parameter["name"]) for parameter in read["parameters"]}
    query = {
        ("query", name) for name in ("from", "max_records", "max_bytes", "wait_ms", "isolation")
    }
    assert names == query | {("header", contract.ACKED_INDEX_HEADER)}
    assert "416" in read["responses"]


def test_topic_names_follow_the_contract_pattern(doc: dict[str, Any]) -> None:
    name = schema_validator(doc, "TopicName")
    for good in ("t", "orders.v1", "A_b-c", "x" * 200):
        assert name.is_valid(good), good
    for bad in ("", ".hidden", "-x", "a/b", "x" * 201, "sp ace"):
        assert not name.is_valid(bad), bad


def json_examples(markdown: str) -> list[Any]:
    return [json.loads(block) for block in re.findall(r"```json\n(.*?)```", markdown, re.S)]


def test_the_json_examples_of_the_spec_file_validate(doc: dict[str, Any]) -> None:
    by_shape = {  # keys only that shape has
        ("members",): "Cluster",
        ("node_id", "partitions"): "NodePartitions",
        ("node_id", "enabled"): "NodeTls",
        ("name", "partition_states"): "TopicDescription",
        ("partitions",): "PartitionList",
        ("records", "producer_id"): "AppendRequest",
        ("records", "next_index"): "ReadResult",
        ("lease_ms", "wait_ms"): "AcquireRequest",
        ("consumer", "messages"): "AcquireResult",
        ("done", "refused"): "SettleResult",
        ("cursor", "dead_letter_pending"): "GroupDescription",
        ("to", "force"): "ResetGroupRequest",
        ("group", "partitions"): "TopicGroupReset",
        ("group", "lag", "partitions"): "TopicGroupDescription",
        ("groups",): "TopicGroups",
        ("record_timestamp_ms",): "PartitionOffsets",
    }
    seen = set()
    for example in json_examples(API_SPEC.read_text()):
        fits = [keys for keys in by_shape if all(k in example for k in keys)]
        most = max(map(len, fits), default=0)  # the shape with the most keys that fits
        names = [by_shape[keys] for keys in fits if len(keys) == most]
        assert len(names) == 1, example
        schema_validator(doc, names[0]).validate(example)
        seen.add(names[0])
    assert seen == set(by_shape.values())


def test_bodies_of_the_contract_validate(doc: dict[str, Any]) -> None:
    schema_validator(doc, "AppendResult").validate(
        {"base_index": 17, "count": 3, "duplicate": False}
    )
    schema_validator(doc, "NodeAdminState").validate({"node": "n1", "draining": True, "weight": 1})
    schema_validator(doc, "WeightRequest").validate({"weight": 0})
    assert not schema_validator(doc, "WeightRequest").is_valid({"weight": 1_000_001})
    schema_validator(doc, "CreateTopicRequest").validate(
        {"name": "t", "partitions": 6, "replication_factor": 3, "config": {}}
    )
    schema_validator(doc, "TopicList").validate(
        {"topics": [{"name": "t", "partitions": 1, "replication_factor": 3, "config": {}}]}
    )


def test_queue_endpoints_are_leader_calls_with_the_contract_statuses(doc: dict[str, Any]) -> None:
    prefix = "/v1/topics/{topic}/partitions/{p}/groups/{group}"
    for action in ("acquire", "accept", "release", "reject", "renew"):
        op = operations(doc)[("post", f"{prefix}/{action}")]
        assert set(op["requestBody"]["content"]) == {"application/json"}, action
        for status in ("200", "307", "400", "401", "404", "429", "503", "504"):
            assert status in op["responses"], (action, status)
    describe = operations(doc)[("get", prefix)]
    assert {"200", "307", "404", "503"} <= set(describe["responses"])


def test_queue_names_follow_the_contract_patterns(doc: dict[str, Any]) -> None:
    group, consumer = schema_validator(doc, "GroupName"), schema_validator(doc, "ConsumerId")
    for good in ("g", "billing.v1", "A_b-c", "x" * 200):
        assert group.is_valid(good) and consumer.is_valid(good), good
    assert consumer.is_valid("host-1:42") and not group.is_valid("host-1:42")
    for bad in ("", ".g", "-g", "a/b", "x" * 201, "sp ace", ":x"):
        assert not group.is_valid(bad) and not consumer.is_valid(bad), bad


def test_queue_bodies_of_the_contract_validate(doc: dict[str, Any]) -> None:
    acquire = schema_validator(doc, "AcquireRequest")
    acquire.validate({})
    acquire.validate({"consumer": "c", "max": 10000, "lease_ms": 3600000, "wait_ms": 60000})
    for bad in ({"max": 0}, {"max": 10001}, {"lease_ms": 0}, {"wait_ms": 60001}, {"max_bytes": 0}):
        assert not acquire.is_valid(bad), bad
    message = {
        "index": 3,
        "deliveries": 1,
        "lease_deadline_ms": 10,
        "timestamp_ms": 1,
        "key": None,
        "value": "v",
        "headers": {},
    }
    schema_validator(doc, "AcquireResult").validate({"consumer": "c", "messages": [message]})
    assert not schema_validator(doc, "QueueMessage").is_valid({**message, "deliveries": 0})
    settle = schema_validator(doc, "SettleRequest")
    settle.validate({"consumer": "c", "indexes": [1, 2]})
    assert not settle.is_valid({"consumer": "c", "indexes": []})
    assert not settle.is_valid({"indexes": [1]})
    reject = schema_validator(doc, "RejectRequest")
    reject.validate({"consumer": "c", "indexes": [1], "reason": "bad input"})
    assert not reject.is_valid({"consumer": "c", "indexes": [1], "reason": ""})
    assert not reject.is_valid({"consumer": "c", "indexes": [1], "reason": "x" * 201})
    renew = schema_validator(doc, "RenewRequest")
    renew.validate({"consumer": "c", "indexes": [1], "lease_ms": 1000})
    assert not renew.is_valid({"consumer": "c", "indexes": [1]})
    renewed = schema_validator(doc, "RenewResult")
    renewed.validate({"done": [1], "refused": [], "lease_deadline_ms": 5})
    assert not renewed.is_valid({"done": [1], "refused": []})


def test_the_spec_is_as_strict_as_the_broker_on_bodies(doc: dict[str, Any]) -> None:
    """The body limits of the spec are the broker's own constants; every operation that takes a
    body lists what reading one may answer (408 too slow, 413 too big, 415 wrong type)."""
    from laminar.contract import MAX_APPEND_RECORDS
    from laminar.log.records import MAX_TIMESTAMP_MS, MIN_TIMESTAMP_MS
    from laminar.models.records import MAX_HEADER_NAME_BYTES
    from laminar.server.http import MAX_JSON_DEPTH, MAX_JSON_VALUES

    for (method, path), op in operations(doc).items():
        if "requestBody" in op:
            assert {"408", "413", "415"} <= set(op["responses"]), (method, path)
    codes = set(doc["components"]["schemas"]["ErrorCode"]["enum"])
    assert {"request_timeout", "internal"} <= codes
    append = schema_validator(doc, "AppendRequest")
    assert (
        doc["components"]["schemas"]["AppendRequest"]["properties"]["records"]["maxItems"]
        == MAX_APPEND_RECORDS
    )
    described = doc["components"]["schemas"]["AppendRequest"]["description"]
    assert f"{MAX_JSON_VALUES:,}" in described and f"{MAX_JSON_DEPTH} deep" in described
    record = doc["components"]["schemas"]["AppendRecord"]
    assert record["properties"]["headers"]["propertyNames"]["maxLength"] == MAX_HEADER_NAME_BYTES
    good = {"key": "k", "value": "v", "headers": {"h": "x"}, "timestamp_ms": MAX_TIMESTAMP_MS}
    append.validate({"records": [good, {"value": None, "encoding": "utf-8"}]})
    append.validate({"records": [{"timestamp_ms": MIN_TIMESTAMP_MS, "headers": None}]})
    for bad in (
        {"records": [{**good, "timestamp_ms": MAX_TIMESTAMP_MS + 1}]},
        {"records": [{**good, "timestamp_ms": MIN_TIMESTAMP_MS - 1}]},
        {"records": [{**good, "timestamp_ms": 1.5}]},
        {"records": [{**good, "encoding": "rot13"}]},
        {"records": [{**good, "extra": 1}]},
        {"records": [{"value": "v"}] * (MAX_APPEND_RECORDS + 1)},
    ):
        assert not append.is_valid(bad), str(bad)[:80]


def test_every_operation_declares_413_and_415(doc: dict[str, Any]) -> None:
    """The broker answers a request with a compressed body 415, and one whose declared body is
    over --max-request-bytes 413, before routing it: on every operation, bodiless ones too."""
    for (method, path), op in operations(doc).items():
        assert {"413", "415"} <= set(op["responses"]), (method, path)


def test_commit_indexes_may_be_minus_one(doc: dict[str, Any]) -> None:
    schemas = doc["components"]["schemas"]
    assert schemas["CommitIndex"]["minimum"] == -1
    for name in ("PartitionState", "HostedPartition", "ReadResult"):
        commit = schemas[name]["properties"]["commit_index"]
        assert commit == {"$ref": "#/components/schemas/CommitIndex"}, name
    header = doc["components"]["headers"]["LaminarCommitIndex"]["schema"]
    assert header == {"$ref": "#/components/schemas/CommitIndex"}
    assert schema_validator(doc, "CommitIndex").is_valid(-1)
    assert not schema_validator(doc, "CommitIndex").is_valid(-2)


def test_the_spec_and_the_broker_agree_on_topics(doc: dict[str, Any]) -> None:
    """Topic caps and the known config keys, their types and ranges, are the broker's own: the
    same samples pass (or fail) the spec and the broker's checks of a proposal."""
    from laminar.log.config import FsyncPolicy, LogConfig
    from laminar.log.errors import LogConfigError
    from laminar.metadata import AlterTopic, CreateTopic, MetadataError, validate_proposal
    from laminar.metadata.state import (
        INT_CONFIG_KEYS,
        LOG_CONFIG_KEYS,
        MAX_CONFIG_INT,
        MAX_DELIVERIES_LIMIT,
        MAX_PARTITIONS,
        MAX_REPLICATION_FACTOR,
        MIN_BATCH_LIMIT_BYTES,
        NULLABLE_CONFIG_KEYS,
        QUEUE_CONFIG_KEYS,
    )

    schemas = doc["components"]["schemas"]
    create, alter = schemas["CreateTopicRequest"], schemas["AlterTopicRequest"]
    for schema in (create, alter):
        assert schema["additionalProperties"] is False
        assert schema["properties"]["partitions"]["maximum"] == MAX_PARTITIONS
    assert set(create["properties"]) == {"name", "partitions", "replication_factor", "config"}
    assert create["properties"]["replication_factor"]["maximum"] == MAX_REPLICATION_FACTOR
    summary = schemas["TopicSummary"]["properties"]
    assert summary["partitions"]["maximum"] == MAX_PARTITIONS
    assert summary["replication_factor"]["maximum"] == MAX_REPLICATION_FACTOR

    config = schemas["TopicConfig"]
    keys = config["properties"]
    assert config["additionalProperties"] is False
    assert set(keys) == LOG_CONFIG_KEYS | QUEUE_CONFIG_KEYS
    for key in INT_CONFIG_KEYS:
        nullable = key in NULLABLE_CONFIG_KEYS
        assert keys[key]["type"] == (["integer", "null"] if nullable else "integer"), key
        assert keys[key]["maximum"] == MAX_CONFIG_INT, key
    for key in ("max_batch_bytes", "segment_overflow_bytes"):
        assert keys[key]["minimum"] == MIN_BATCH_LIMIT_BYTES, key
    for key in ("retention_bytes", "retention_ms", "segment_ms", "fsync_interval_ms"):
        assert keys[key]["minimum"] == 1, key
    assert keys["fsync"]["enum"] == [policy.value for policy in FsyncPolicy]
    assert (keys["max_deliveries"]["minimum"], keys["max_deliveries"]["maximum"]) == (
        1,
        MAX_DELIVERIES_LIMIT,
    )
    floor = keys["segment_bytes"]["minimum"]
    LogConfig(segment_bytes=floor)
    with pytest.raises(LogConfigError):
        LogConfig(segment_bytes=floor - 1)

    def broker_takes(body: dict[str, Any]) -> bool:
        command = CreateTopic(
            "t",
            body.get("partitions", 1),
            body.get("replication_factor", 1),
            body.get("config", {}),
            assignment=((("n1",),) * p if isinstance(p := body.get("partitions", 1), int) else ()),
        )
        try:
            validate_proposal(command)
            validate_proposal(AlterTopic("t", None, body.get("config", {})))
        except MetadataError:
            return False
        return True

    request = schema_validator(doc, "CreateTopicRequest")
    big = MAX_CONFIG_INT
    samples: list[dict[str, Any]] = [
        {"partitions": MAX_PARTITIONS, "replication_factor": MAX_REPLICATION_FACTOR},
        {"partitions": MAX_PARTITIONS + 1},
        {"partitions": 0},
        {"replication_factor": MAX_REPLICATION_FACTOR + 1},
        {"config": {"segment_bytes": floor, "retention_ms": 1, "retention_bytes": None}},
        {"config": {"segment_bytes": floor - 1}},
        {"config": {"segment_bytes": 4096.5}},
        {"config": {"segment_bytes": True}},
        {"config": {"segment_ms": big, "fsync_interval_ms": big, "retention_bytes": big}},
        {"config": {"fsync_interval_ms": big + 1}},
        {"config": {"retention_ms": 0}},
        {"config": {"retention_ms": True}},
        {"config": {"max_batch_bytes": MIN_BATCH_LIMIT_BYTES}},
        {"config": {"max_batch_bytes": MIN_BATCH_LIMIT_BYTES - 1}},
        {"config": {"segment_overflow_bytes": MIN_BATCH_LIMIT_BYTES - 1}},
        {"config": {"fsync": "interval"}},
        {"config": {"fsync": "sometimes"}},
        {"config": {"max_deliveries": MAX_DELIVERIES_LIMIT}},
        {"config": {"max_deliveries": MAX_DELIVERIES_LIMIT + 1}},
        {"config": {"max_deliveries": None}},
        {"config": {"unknown_key": 1}},
    ]
    for body in samples:
        assert request.is_valid({"name": "t", **body}) == broker_takes(body), body


def test_the_spec_states_the_contract_limits_and_names(doc: dict[str, Any]) -> None:
    """What both ends check (laminar.contract) is what the document says."""
    from laminar.queue.state import MAX_SCAN

    schemas = doc["components"]["schemas"]
    for schema, rule in (
        ("TopicName", contract.TOPIC_NAME),
        ("GroupName", contract.GROUP_NAME),
        ("ConsumerId", contract.CONSUMER_ID),
    ):
        assert schemas[schema]["pattern"] == f"^{rule.pattern}$", schema
    assert schemas["Index"]["maximum"] == contract.MAX_INDEX
    assert schemas["WeightRequest"]["properties"]["weight"]["maximum"] == contract.MAX_WEIGHT
    acquire = schemas["AcquireRequest"]["properties"]
    assert (acquire["max"]["default"], acquire["max"]["maximum"]) == (
        contract.DEFAULT_ACQUIRE,
        contract.MAX_ACQUIRE,
    )
    assert (acquire["lease_ms"]["default"], acquire["lease_ms"]["maximum"]) == (
        contract.DEFAULT_LEASE_MS,
        contract.MAX_LEASE_MS,
    )
    assert acquire["wait_ms"]["maximum"] == contract.MAX_WAIT_MS
    assert acquire["max_bytes"]["maximum"] == contract.MAX_ACQUIRE_BYTES
    assert schemas["RenewRequest"]["properties"]["lease_ms"]["maximum"] == contract.MAX_LEASE_MS
    assert schemas["IndexList"]["maxItems"] == contract.MAX_SETTLE_INDEXES <= MAX_SCAN
    reason = schemas["RejectRequest"]["properties"]["reason"]
    assert reason["maxLength"] == contract.MAX_REASON_CHARS
    read = operations(doc)[("get", contract.READ_RECORDS.spec_path)]
    query = {p["name"]: p["schema"] for p in read["parameters"]}
    assert (query["max_records"]["default"], query["max_records"]["maximum"]) == (
        contract.DEFAULT_READ_RECORDS,
        contract.MAX_READ_RECORDS,
    )
    assert (query["max_bytes"]["default"], query["max_bytes"]["maximum"]) == (
        contract.DEFAULT_READ_BYTES,
        contract.MAX_READ_BYTES,
    )
    assert query["wait_ms"]["maximum"] == contract.MAX_WAIT_MS
    ok = read["responses"]["200"]
    assert set(ok["headers"]) == {
        contract.NEXT_INDEX_HEADER,
        contract.COMMIT_INDEX_HEADER,
        contract.LOG_START_HEADER,
    }
    acquired = operations(doc)[("post", contract.ACQUIRE.spec_path)]["responses"]["200"]
    assert set(acquired["content"]) == {contract.JSON_TYPE, contract.ACQUIRED_TYPE}
