"""The HTTP API under schemathesis (issue 19, "Fuzzing stays in CI"): every operation of
broker/laminar/server/openapi.yaml, with valid and invalid inputs, against a live cluster of three
brokers that require a bearer token.

Each case goes to one of the brokers (307s are followed to the leader, with the body sent again
and the token kept: requests drops the Authorization header on a redirect to another host), and
its answer must conform to the spec: no 5xx, a status the operation declares, a declared content
type, a body and headers that match their schemas. Every 307 on the way must be a declared
`not_leader` answer too. At the end no broker may have logged an unexpected exception.

Path parameters are steered to real resources part of the time (topics made beforehand, with
records and a consumer group, topics the run creates, the cluster's nodes), so that operations
reach their handlers and not only the 404s of names nobody made; long polls and partition counts
are clamped so that the run stays within its budget (tests/fuzz/__init__.py). A failure prints
the request that reproduces it (a curl command); the brokers' unexpected exceptions are printed
from their logs.
"""

from __future__ import annotations

import re
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.parameters import ParameterLocation
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from laminar.contract import GROUP_NAME, TOPIC_NAME
from laminar.credentials import internal_token
from laminar.local_cluster import CLUSTER_ID, LocalCluster
from laminar.server.config import read_secret_file
from tests.integration.conftest import TOKEN, make_cluster

from . import DERANDOMIZE, fuzz_examples
from .strategies import batches, fuzzed, resealed

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
OPENAPI = REPO / "broker" / "laminar" / "server" / "openapi.yaml"
EXAMPLES = fuzz_examples(100)

#: Seeded topics: (name, partitions, replication factor); the run never deletes them.
SEEDED = (("fuzz-orders", 3, 3), ("fuzz-single", 1, 1))
GROUP = "fuzz-group"
#: Clamps that keep the run bounded (a valid value above them is lowered to them).
MAX_WAIT_MS = 100
MAX_PARTITIONS = 4
REQUEST_TIMEOUT_S = 30.0


@schemathesis.check
def negative_data_refused(ctx: Any, response: Any, case: Any) -> bool | None:
    """schemathesis's negative_data_rejection, but for the cases the run itself sends valid:
    one invalid only in its headers (the spec declares none but the Authorization that the
    session sends with every request), and one whose invalid query holds an object or a list
    (it goes out as an empty value, which means "omitted")."""
    meta = case.meta
    if meta is not None:
        negative = {location for location in meta.components if meta.is_negative_at(location)}
        rest = negative - {ParameterLocation.HEADER}  # the session sends the token anyway
        query = case.query or {}
        if rest == {ParameterLocation.QUERY} and any(
            isinstance(value, dict | list) for value in query.values()
        ):
            rest = set()  # an object in a query goes out as an empty value: "omitted"
        if not rest:
            return None
    return negative_data_rejection(ctx, response, case)


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
    negative_data_refused,
]

#: Binary appends: valid batches, and mutated ones (their checksum made to match, or not).
schemathesis.openapi.media_type(
    "application/vnd.laminar.batch", st.one_of(fuzzed(batches()), fuzzed(batches()).map(resealed))
)
#: What refuses a request the spec does not allow: a 4xx that says so (413: too many records,
#: or values, in a JSON body), or a 503 (nothing done: the broker could not tell yet).
REFUSALS = ["400", "401", "404", "405", "409", "413", "415", "416", "422", "429", "503"]
CONFIG = schemathesis.Config.from_dict(
    {"checks": {"negative_data_rejection": {"expected-statuses": REFUSALS}}}
)
SCHEMA = schemathesis.openapi.from_path(OPENAPI, config=CONFIG)
SCHEMA.config.generation.update(
    modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
    max_examples=EXAMPLES,
    deterministic=DERANDOMIZE,
    database="none",
    # the broker ignores query parameters and headers it does not know (as HTTP servers do):
    # one is no invalid input that it must refuse
    allow_extra_parameters=False,
)
SCHEMA.config.phases.update(phases=["examples", "coverage", "fuzzing"])


class ClusterSession(requests.Session):
    """Follows 307s between the cluster's brokers with the token, and checks each 307."""

    def __init__(self, hosts: set[str]) -> None:
        super().__init__()
        self.trust_env = False  # no proxy between the test and loopback brokers
        self.hosts = hosts
        self.redirects = 0
        self.bad_redirects: list[str] = []
        self.operation: Any = None
        self.hooks["response"].append(self._seen)

    def should_strip_auth(self, old_url: str, new_url: str) -> bool:
        return urlsplit(new_url).hostname not in self.hosts

    def _seen(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        if response.status_code != 307:
            return
        self.redirects += 1
        problems = []
        if self.operation is not None and "307" not in self.operation.definition.raw.get(
            "responses", {}
        ):
            problems.append("307 is not declared")
        location = response.headers.get("Location", "")
        if urlsplit(location).hostname not in self.hosts:
            problems.append(f"Location {location!r} is not a broker")
        try:
            error = response.json()["error"]
            assert error["code"] == "not_leader" and isinstance(error["message"], str)
            assert error.get("leader_url") is None or urlsplit(error["leader_url"]).hostname in (
                self.hosts
            )
        except (ValueError, KeyError, TypeError, AssertionError):
            problems.append(f"body {response.text[:200]!r} is not a not_leader error")
        if problems:
            self.bad_redirects.append(
                f"{response.request.method} {response.request.url}: {'; '.join(problems)}"
            )


@dataclass
class Api:
    cluster: LocalCluster
    session: ClusterSession
    #: topic name -> partitions, of the topics that exist (seeded, or created by the run)
    topics: dict[str, int]
    created: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    cases: int = 0
    statuses: dict[int, int] = field(default_factory=dict)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {TOKEN}"}

    def headers_for(self, access: str | None) -> dict[str, str]:
        """The admin's token; for the brokers' own operations (access `internal`: the
        transaction markers), the brokers' own, which alone reaches their handlers."""
        if access != "internal":
            return self.headers
        secret = read_secret_file(str(self.cluster.secret_path()))
        return {"Authorization": f"Bearer {internal_token(secret, CLUSTER_ID)}"}


def _seed(cluster: LocalCluster, session: requests.Session) -> dict[str, int]:
    base = cluster.urls[0]
    headers = {"Authorization": f"Bearer {TOKEN}"}
    topics = {}
    for name, partitions, rf in SEEDED:
        body = {"name": name, "partitions": partitions, "replication_factor": rf}
        response = session.post(f"{base}/v1/topics", json=body, headers=headers, timeout=30)
        assert response.status_code == 201, response.text
        topics[name] = partitions
        for partition in range(partitions):
            records = [{"key": f"k{i}", "value": f"v{i}"} for i in range(5)]
            records.append({"value": "/w==", "encoding": "base64"})  # not UTF-8
            url = f"{base}/v1/topics/{name}/partitions/{partition}/records"
            _until_ok(session, "POST", url, {"records": records})  # (once it has a leader)
            acquire = f"{base}/v1/topics/{name}/partitions/{partition}/groups/{GROUP}/acquire"
            response = session.post(acquire, json={"max": 2}, headers=headers, timeout=30)
            assert response.status_code == 200, response.text
    return topics


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    cluster = make_cluster(tmp_path_factory.mktemp("fuzz-api"), token=TOKEN)
    try:
        session = ClusterSession({urlsplit(url).hostname or "" for url in cluster.urls})
        state = Api(cluster, session, _seed(cluster, session))
        state.started = time.monotonic()
        yield state
        elapsed = time.monotonic() - state.started
        statuses = dict(sorted(state.statuses.items()))
        print(
            f"\nschemathesis: {state.cases} cases in {elapsed:.0f} s, statuses {statuses}, "
            f"{session.redirects} redirects followed, {len(state.created)} topics created"
        )
        unexpected = {node: _unexpected(cluster, node) for node in cluster.nodes}
        unexpected = {node: lines for node, lines in unexpected.items() if lines}
        assert not unexpected, f"the brokers logged unexpected exceptions: {unexpected}"
    finally:
        cluster.stop()


def _unexpected(cluster: LocalCluster, node: str) -> list[str]:
    """The lines of the broker's log that tell of an exception nothing expected."""
    log = cluster.nodes[node].data_dir / "broker.log"
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    found = [n for n, line in enumerate(lines) if "Traceback" in line or "unexpectedly" in line]
    return ["\n".join(lines[max(0, n - 2) : n + 25]) for n in found[:3]]


def _pick(case: Any, choices: list[str], salt: str) -> str | None:
    """One of `choices` for 3 cases in 4 (stable for a case), or None: keep the generated."""
    if not choices:
        return None
    key = zlib.crc32(f"{salt}|{case.path_parameters}|{case.query}|{case.body!r}".encode())
    if key % 4 == 3:
        return None
    return choices[(key >> 2) % len(choices)]


def _steer(case: Any, api: Api) -> None:
    """Aim a case at real resources part of the time, and keep it within the run's budget."""
    params = case.path_parameters or {}
    label = case.operation.label
    topic = params.get("topic")
    if isinstance(topic, str) and TOPIC_NAME.fullmatch(topic):
        deleting = label == "DELETE /v1/topics/{topic}"
        pool = list(api.created) if deleting else sorted(api.topics)
        chosen = _pick(case, pool, "topic")
        if chosen is not None:
            params["topic"] = chosen
            partition = params.get("p")  # a valid one: to the topic's, or one past the last
            if type(partition) is int and 0 <= partition <= 999_999:
                params["p"] = partition % (api.topics.get(chosen, 1) + 1)
    node = params.get("id")
    if isinstance(node, str) and node and label.startswith("GET /v1/nodes/{id}/"):
        chosen = _pick(case, sorted(api.cluster.nodes), "node")
        if chosen is not None:
            params["id"] = chosen
    group = params.get("group")
    if isinstance(group, str) and GROUP_NAME.fullmatch(group):
        chosen = _pick(case, [GROUP], "group")
        if chosen is not None:
            params["group"] = chosen
    _clamp(case.query, "wait_ms", MAX_WAIT_MS, 60_000)
    if isinstance(case.body, dict):
        _clamp(case.body, "wait_ms", MAX_WAIT_MS, 60_000)
        _clamp(case.body, "partitions", MAX_PARTITIONS, 10_000)


def _clamp(container: Any, name: str, highest: int, valid_up_to: int) -> None:
    """Lower a valid `name` above `highest` to it (an invalid one stays: it must be refused)."""
    if not isinstance(container, dict):
        return
    value = container.get(name)
    if isinstance(value, int) and not isinstance(value, bool) and highest < value <= valid_up_to:
        container[name] = highest
    elif (
        isinstance(value, str)
        and re.fullmatch("[0-9]{1,7}", value)
        and highest < int(value) <= valid_up_to
    ):
        container[name] = str(highest)


def _record(case: Any, response: Any, api: Api) -> None:
    api.cases += 1
    api.statuses[response.status_code] = api.statuses.get(response.status_code, 0) + 1
    if case.operation.label == "POST /v1/topics" and response.status_code == 201:
        body = response.json()
        api.topics[body["name"]] = body["partitions"]
        api.created.append(body["name"])
    elif case.operation.label == "DELETE /v1/topics/{topic}" and response.status_code == 204:
        name = case.path_parameters["topic"]
        api.topics.pop(name, None)
        if name in api.created:
            api.created.remove(name)


@SCHEMA.parametrize()
@settings(
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
    derandomize=DERANDOMIZE,
    print_blob=not DERANDOMIZE,
)
def test_the_api_conforms_to_its_spec(case: Any, api: Api) -> None:
    _steer(case, api)
    urls = api.cluster.urls
    base = urls[zlib.crc32(repr(case.path_parameters).encode() + repr(case.body).encode()) % 3]
    api.session.operation = case.operation
    api.session.bad_redirects.clear()
    headers = api.headers_for(case.operation.definition.raw.get("x-laminar-access"))
    kwargs = {"session": api.session, "headers": headers, "timeout": REQUEST_TIMEOUT_S}
    response = case.call(base_url=base, max_redirects=5, **kwargs)
    _record(case, response, api)
    assert not api.session.bad_redirects, (
        f"{api.session.bad_redirects}\nReproduce with:\n{case.as_curl_command(headers)}"
    )
    case.validate_response(
        response, checks=CHECKS, headers=headers, transport_kwargs={"base_url": base}
    )


def test_a_body_with_a_content_encoding_is_415_on_every_operation(api: Api) -> None:
    """The broker refuses a compressed body (or one declared too large: 413) on every
    operation, those that take no body included, and the spec says so for each."""
    spec = SCHEMA.raw_schema
    values = {"topic": SEEDED[0][0], "p": "0", "group": GROUP, "id": "n1"}
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            if method not in ("get", "put", "post", "delete", "patch"):
                continue
            url = api.cluster.urls[0] + re.sub(r"{(\w+)}", lambda m: values[m[1]], path)
            headers = {
                **api.headers_for(operation.get("x-laminar-access")),
                "Content-Encoding": "gzip",
                "Content-Type": "text/plain",
            }
            response = api.session.request(method, url, data=b"x", headers=headers, timeout=10)
            assert response.status_code == 415, (method, path, response.text)
            assert response.json()["error"]["code"] == "unsupported_media_type"
            assert {"413", "415"} <= set(operation["responses"]), (method, path)


# ---- what the fuzzing found, pinned ----------------------------------------------------------


def test_a_queue_command_over_the_batch_limit_is_refused_and_the_broker_serves_on(
    api: Api,
) -> None:
    """A queue command is an entry in the partition's log, which refuses a batch over the
    topic's max_batch_bytes: proposed anyway, it failed every round of the leader's driver,
    and every partition of that broker stopped (found by this fuzzing: a topic created with
    max_batch_bytes=128, whose leader's no-op no longer fitted)."""
    base, headers = api.cluster.urls[0], api.headers
    body = {"name": "fuzz-small", "replication_factor": 1, "config": {"segment_bytes": 4096}}
    response = api.session.post(f"{base}/v1/topics", json=body, headers=headers, timeout=30)
    assert response.status_code == 201, response.text
    prefix = f"{base}/v1/topics/fuzz-small/partitions/0"
    _until_ok(api.session, "POST", f"{prefix}/records", {"records": [{"value": "v"}]})
    settle = {"consumer": "c", "indexes": list(range(2000))}  # ~22 KB, over its 2 KiB limit
    response = api.session.post(f"{prefix}/groups/g/accept", json=settle, headers=headers)
    assert response.status_code == 400, response.text
    assert "max_batch_bytes" in response.json()["error"]["message"]
    for name, partitions, _ in SEEDED:  # every partition still takes appends
        for partition in range(partitions):
            url = f"{base}/v1/topics/{name}/partitions/{partition}/records"
            _until_ok(api.session, "POST", url, {"records": [{"value": "after"}]})


def test_topic_configs_the_broker_cannot_run_are_refused(api: Api) -> None:
    base = api.cluster.urls[0]
    for config in (
        {"max_batch_bytes": 128},  # below the broker's own control batches (found by fuzzing)
        {"segment_overflow_bytes": 1000},
        {"segment_bytes": 4096.5},
        {"retention_ms": True},
        {"fsync_interval_ms": 2**63},  # (found by fuzzing)
    ):
        body = {"name": "fuzz-refused", "config": config}
        response = api.session.post(f"{base}/v1/topics", json=body, headers=api.headers)
        assert response.status_code == 400, (config, response.text)


def _until_ok(session: requests.Session, method: str, url: str, body: Any) -> None:
    """`method url` with the JSON `body` until it answers 200 (a partition may have no leader
    yet), for 30 s at most."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    deadline = time.monotonic() + 30
    while True:
        response = session.request(method, url, json=body, headers=headers, timeout=30)
        if response.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert response.status_code == 200, (url, response.status_code, response.text)
