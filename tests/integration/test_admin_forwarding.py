"""Metadata writes sent to any broker, and topic creation and growth that wait for leaders
(issue 26, "A newcomer's first hour"; docs/api.md "Cluster" and "Topics"), against real brokers.

A plain HTTP client that does not follow a 307 for a POST, PATCH or DELETE (Python's urllib)
creates a topic, changes its config, drains and undrains a node and deletes the topic through
a broker that is not the metadata leader: each is answered there, as the leader would, and
read back from that broker at once. The leader's refusals come back as they are; the brokers'
own forwarding route forwards nothing again. The 201 of a 12-partition, RF 3 topic names every
partition's leader, so that the first append to each succeeds with one request (urllib, and the
Python client: no redirect, no retry); `wait_for_leaders=false` (and the CLI's
`--no-wait-for-leaders`) answers while a partition can have no leader, before a creation that
waits for one.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from email.message import Message
from typing import Any

import pytest

from laminar.client import AsyncClient
from laminar.contract import METADATA_INDEX_HEADER
from laminar.credentials import internal_token
from laminar.local_cluster import CLUSTER_ID, LocalCluster
from laminar.log.batch import Record
from laminar.metadata import CreateTopic, encode_command
from laminar.placement import Candidate, hosts, partition_key
from laminar.server.config import read_secret_file

from .conftest import make_cluster, wait_until

pytestmark = pytest.mark.integration

#: The brokers' request timeout here: a creation waiting for a leader that cannot be elected
#: (its only replica's broker paused) waits this long at most; the test resumes that broker
#: well before.
REQUEST_TIMEOUT_MS = 40_000
#: A urllib call's own bound (beyond the brokers' request timeout).
HTTP_TIMEOUT_S = 60.0
PARTITIONS = 12

#: urllib as a user's script has it, without the environment's proxies (the brokers are on
#: loopback): its redirect handler follows no 307 of a POST, PATCH or DELETE.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http(
    method: str, url: str, token: str, body: Any = None, raw: bytes | None = None
) -> tuple[int, Message, Any]:
    """One request with urllib: (status, headers, JSON body or None)."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with OPENER.open(request, timeout=HTTP_TIMEOUT_S) as response:
            status, headers, payload = response.status, response.headers, response.read()
    except urllib.error.HTTPError as e:  # (a 307 of a POST, too: urllib does not follow it)
        status, headers, payload = e.code, e.headers, e.read()
    return status, headers, json.loads(payload) if payload else None


def run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=HTTP_TIMEOUT_S)


async def ahttp(
    method: str, url: str, token: str, body: Any = None, raw: bytes | None = None
) -> tuple[int, Message, Any]:
    return await asyncio.to_thread(http, method, url, token, body, raw)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    extra = ("--request-timeout-ms", str(REQUEST_TIMEOUT_MS))
    cluster = make_cluster(tmp_path_factory.mktemp("forwarding"), 3, extra_args=extra)
    yield cluster
    cluster.stop()


async def roles(cluster: LocalCluster) -> tuple[str, str, str]:
    """(the metadata leader, a broker that is not it, the third broker): node ids."""
    leader: list[str] = []

    async def elected() -> bool:
        status, _, body = await ahttp("GET", cluster.urls[0] + "/v1/cluster", cluster.token)
        if status == 200 and body["metadata_leader"] in cluster.nodes:
            leader[:] = [body["metadata_leader"]]
            return True
        return False

    await wait_until("a metadata leader", elected)
    others = sorted(n for n in cluster.nodes if n != leader[0])
    return leader[0], others[0], others[1]


def url_of(cluster: LocalCluster, node: str) -> str:
    return cluster.nodes[node].api_url


async def test_admin_writes_sent_with_urllib_to_a_follower_are_answered_there(
    cluster: LocalCluster,
) -> None:
    leader, entry_node, third = await roles(cluster)
    entry, token = url_of(cluster, entry_node), cluster.token
    status, headers, _ = await ahttp("GET", url_of(cluster, leader) + "/v1/cluster", token)
    assert status == 200
    seen = int(headers[METADATA_INDEX_HEADER])

    # create, at a broker that does not lead the metadata: 201 there, with every leader
    name = "forwarded"
    wanted = {"name": name, "partitions": PARTITIONS, "replication_factor": 3}
    status, headers, created = await ahttp("POST", entry + "/v1/topics", token, wanted)
    assert status == 201, created
    assert int(headers[METADATA_INDEX_HEADER]) > seen  # (the entry broker applied the create)
    states = created["partition_states"]
    assert [s["partition"] for s in states] == list(range(PARTITIONS))
    assert all(s["leader"] and s["leader_url"] for s in states), states
    # read back from the same broker at once, without naming the index seen
    status, _, described = await ahttp("GET", f"{entry}/v1/topics/{name}", token)
    assert status == 200 and described["partitions"] == PARTITIONS, described
    status, _, listed = await ahttp("GET", entry + "/v1/topics", token)
    assert name in [t["name"] for t in listed["topics"]]

    # the first append to every partition, at the leader the 201 named: one request each
    for state in states:
        p = state["partition"]
        url = f"{state['leader_url']}/v1/topics/{name}/partitions/{p}/records"
        records = {"records": [{"value": f"first {p}"}]}
        status, _, appended = await ahttp("POST", url, token, records)
        assert status == 200, (p, appended)
        status, _, read = await ahttp("GET", url + f"?from={appended['base_index']}", token)
        assert status == 200 and read["records"][0]["value"] == f"first {p}", read

    # a config change, at the same broker: answered and read back there
    change = {"config": {"retention_ms": 3_600_000}}
    status, _, altered = await ahttp("PATCH", f"{entry}/v1/topics/{name}", token, change)
    assert status == 200 and altered["config"] == {"retention_ms": 3_600_000}, altered
    status, _, described = await ahttp("GET", f"{entry}/v1/topics/{name}", token)
    assert described["config"] == {"retention_ms": 3_600_000}, described

    # more partitions, at the same broker: answered once the new ones have leaders too, and
    # the first append to each is one request to the leader named
    grown = PARTITIONS + 2
    body = {"partitions": grown}
    status, _, altered = await ahttp("PATCH", f"{entry}/v1/topics/{name}", token, body)
    assert status == 200 and altered["partitions"] == grown, altered
    added = altered["partition_states"][PARTITIONS:]
    assert [s["partition"] for s in added] == [PARTITIONS, PARTITIONS + 1], altered
    assert all(s["leader"] and s["leader_url"] for s in added), added
    for state in added:
        p = state["partition"]
        url = f"{state['leader_url']}/v1/topics/{name}/partitions/{p}/records"
        status, _, appended = await ahttp("POST", url, token, {"records": [{"value": "new"}]})
        assert status == 200, (p, appended)
    status, _, refused = await ahttp(
        "PATCH", f"{entry}/v1/topics/{name}?wait_for_leaders=maybe", token, {"partitions": 9}
    )
    assert status == 400 and "wait_for_leaders" in refused["error"]["message"], refused
    status, _, described = await ahttp("GET", f"{entry}/v1/topics/{name}", token)
    assert described["partitions"] == grown, described  # (the refusal changed nothing)

    # the leader's refusals, as it would answer them
    status, _, refused = await ahttp("POST", entry + "/v1/topics", token, wanted)
    assert status == 409 and refused["error"]["code"] == "conflict", refused
    too_many = {"name": "forwarded-rf5", "replication_factor": 5}
    status, _, refused = await ahttp("POST", entry + "/v1/topics", token, too_many)
    assert status == 400 and refused["error"]["code"] == "bad_request", refused
    assert "replication_factor=5" in refused["error"]["message"], refused
    bad = {"config": {"retention_ms": "abc"}}
    status, _, refused = await ahttp("PATCH", f"{entry}/v1/topics/{name}", token, bad)
    assert status == 400 and "retention_ms" in refused["error"]["message"], refused

    # a drain and an undrain of the third broker: answered, and shown by the same broker
    for method, draining in (("POST", True), ("DELETE", False)):
        status, _, node = await ahttp(method, f"{entry}/v1/nodes/{third}/drain", token)
        assert status == 200 and node == {"node": third, "draining": draining, "weight": 1}
        status, _, info = await ahttp("GET", entry + "/v1/cluster", token)
        members = {m["id"]: m for m in info["members"]}
        assert members[third]["draining"] is draining, info

    # a delete: 204, and gone from that broker at once
    status, _, _ = await ahttp("DELETE", f"{entry}/v1/topics/{name}", token)
    assert status == 204
    status, _, gone = await ahttp("GET", f"{entry}/v1/topics/{name}", token)
    assert status == 404 and gone["error"]["code"] == "not_found", gone


async def test_the_python_client_appends_once_to_each_partition_of_a_topic_it_created(
    cluster: LocalCluster,
) -> None:
    """Through a follower alone (the client knows no other broker): the create is answered
    there once every partition has a leader, and each first append is one request."""
    _, entry_node, _ = await roles(cluster)
    name = "client-created"
    async with AsyncClient([url_of(cluster, entry_node)], token=cluster.token) as client:
        created = await client.create_topic(name, PARTITIONS, 3)
        assert all(s.leader_url for s in created.partition_states), created
        sent = client.requests_sent
        for p in range(PARTITIONS):
            result = await client.append(name, p, [Record(f"first {p}".encode())])
            assert result.count == 1
        assert client.requests_sent == sent + PARTITIONS  # no redirect, no retry
        assert client.redirects == 0
        await client.delete_topic(name)


async def test_a_forwarded_write_is_not_forwarded_again(cluster: LocalCluster) -> None:
    """The brokers' own route, at a broker that does not lead the metadata: 503, nothing
    done (one hop only); a command that is not one: 400."""
    leader, entry_node, _ = await roles(cluster)
    secret = read_secret_file(str(cluster.secret_path()))
    brokers = internal_token(secret, CLUSTER_ID)
    command = encode_command(CreateTopic("twice-forwarded", 1, 1, {}))
    url = url_of(cluster, entry_node) + "/v1/metadata/commands"
    status, headers, body = await ahttp("POST", url, brokers, raw=command)
    assert status == 503 and body["error"]["code"] == "unavailable", body
    assert headers["Retry-After"] == "1"
    assert "not forwarded again" in body["error"]["message"], body
    status, _, body = await ahttp("GET", url_of(cluster, leader) + "/v1/topics", brokers)
    assert "twice-forwarded" not in [t["name"] for t in body["topics"]]
    leader_url = url_of(cluster, leader) + "/v1/metadata/commands"
    for bad in (b'{"op": "no_such_op"}', b'{"op": "delete_topic", "name": "-bad"}', b"[1]"):
        status, _, body = await ahttp("POST", leader_url, brokers, raw=bad)
        assert status == 400 and body["error"]["code"] == "bad_request", (bad, body)


def placed_on(node: str, nodes: list[str], prefix: str) -> str:
    """A topic name whose partition 0, with one replica, placement puts on `node` (the
    brokers' own placement function, every broker of weight 1)."""
    candidates = [Candidate(n) for n in nodes]
    for n in range(200):  # each name lands on `node` one time in len(nodes)
        name = f"{prefix}-{n}"
        if hosts(partition_key(name, 0), candidates, 1) == [node]:
            return name
    raise AssertionError(f"no name of 200 places on {node}")


async def test_opting_out_answers_before_a_leader_exists_and_the_default_waits_for_one(
    cluster: LocalCluster,
) -> None:
    """The broker that placement gives a one-replica topic's partition is paused (SIGSTOP:
    it keeps its place; nobody else can lead the partition): a default creation waits, opt-out
    ones (urllib, and `laminar topic create --no-wait-for-leaders`) are answered meanwhile,
    without the leader, and the waiting one is answered, with it, once that broker runs
    again."""
    _, entry_node, paused = await roles(cluster)
    entry, token, nodes = url_of(cluster, entry_node), cluster.token, sorted(cluster.nodes)
    waiting_name = placed_on(paused, nodes, "waits")
    at_once_name = placed_on(paused, nodes, "at-once")
    cli_name = placed_on(paused, nodes, "cli-at-once")
    command = [sys.executable, "-m", "laminar", "topic", "create", cli_name]
    command += ["--replication-factor", "1", "--no-wait-for-leaders", "--json"]
    command += ["--brokers", entry, "--token-file", str(cluster.token_file)]
    pid = cluster.serving_pids()[paused]
    os.kill(pid, signal.SIGSTOP)
    try:
        one_replica = {"name": waiting_name, "replication_factor": 1}
        waiting = asyncio.ensure_future(ahttp("POST", entry + "/v1/topics", token, one_replica))
        url = entry + "/v1/topics?wait_for_leaders=false"
        one_replica = {"name": at_once_name, "replication_factor": 1}
        at_once = asyncio.ensure_future(ahttp("POST", url, token, one_replica))
        cli = asyncio.ensure_future(asyncio.to_thread(run, command))
        await asyncio.wait({at_once, cli})  # (each bounded: HTTP_TIMEOUT_S)
        assert not waiting.done()
        status, _, created = at_once.result()
        assert status == 201, created
        (state,) = created["partition_states"]
        assert state["replicas"] == [paused] and state["leader"] is None, state
        result = cli.result()
        assert result.returncode == 0, result.stderr
        (state,) = json.loads(result.stdout)["partition_states"]
        assert state["replicas"] == [paused] and state["leader"] is None, state
    finally:
        os.kill(pid, signal.SIGCONT)
    status, _, created = await waiting
    assert status == 201, created
    (state,) = created["partition_states"]
    assert state["leader"] == paused and state["leader_url"] == url_of(cluster, paused), state
    for name in (waiting_name, at_once_name, cli_name):
        status, _, _ = await ahttp("DELETE", f"{entry}/v1/topics/{name}", token)
        assert status == 204, name


def test_a_bad_wait_for_leaders_is_400(cluster: LocalCluster) -> None:
    status, _, body = http(
        "POST", cluster.urls[0] + "/v1/topics?wait_for_leaders=maybe", cluster.token,
        {"name": "never-made"},
    )  # fmt: skip
    assert status == 400 and "wait_for_leaders" in body["error"]["message"], body
