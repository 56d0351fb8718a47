"""Client authentication and authorization against real brokers (docs/security.md, "Clients:
authentication and authorization").

Every route of the API, walked from the application's own router (a route added without a rule
here fails `test_every_route_is_authorized`): 401 without a token or with an unknown one, 403
`forbidden` for a principal without the right (its role, or a topic out of its scope), neither
for one with it. Listing shows a scoped principal its topics only; the brokers' own calls to
each other (a node's replicas, topic descriptions, the dead-letter mover) keep working with
their internal principal; the credentials file is re-read on SIGHUP and when it changes
(rotation without downtime); a broker without credentials refuses to start, unless told
--allow-anonymous.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from laminar.client import AsyncClient, Forbidden, Unauthorized
from laminar.credentials import add_principal, retire_tokens
from laminar.local_cluster import LocalCluster
from laminar.log.batch import Record
from laminar.server.api import Api
from laminar.server.auth import RELOAD_INTERVAL_S
from laminar.server.config import BrokerConfig, new_secret
from laminar.server.console import is_console_route
from laminar.server.metrics import BrokerMetrics
from laminar.server.node import Broker

from .conftest import make_cluster, wait_until

pytestmark = pytest.mark.integration

ANY, ADMIN, PRODUCE, CONSUME, DESCRIBE = "any", "admin", "produce", "consume", "describe"
TRANSACT, INTERNAL = "transact", "internal"
TXN = "/v1/transactions/{txn_id}"
ENDED = {"producer_id": 1, "commit": False}
ADDED = {"producer_id": 1, "partitions": [{"topic": "t", "partition": 0}]}
MARKERS = "/v1/topics/{topic}/partitions/{partition}/markers"
GROUP = "/v1/topics/{topic}/partitions/{partition}/groups/{group}"
RECORDS = "/v1/topics/{topic}/partitions/{partition}/records"
SETTLE = {"consumer": "c", "indexes": [0]}
PARTITION_GROUPS = "/v1/topics/{topic}/partitions/{partition}/groups"
TOPIC_GROUP = "/v1/topics/{topic}/groups/{group}"
OFFSETS = "/v1/topics/{topic}/partitions/{partition}/offsets"
RESET = {"to": "latest"}
#: Every /v1 route: what it does, and a request for it (in this order: the drain is undone).
CASES: list[tuple[str, str, str, str, Any]] = [
    ("GET", "/v1/cluster", ANY, "/v1/cluster", None),
    # n2's replicas, asked of n1: n1 fetches them from n2 with the brokers' own principal
    ("GET", "/v1/nodes/{node}/partitions", ADMIN, "/v1/nodes/n2/partitions", None),
    ("GET", "/v1/nodes/{node}/tls", ADMIN, "/v1/nodes/n2/tls", None),
    ("POST", "/v1/nodes/{node}/drain", ADMIN, "/v1/nodes/n3/drain", None),
    ("DELETE", "/v1/nodes/{node}/drain", ADMIN, "/v1/nodes/n3/drain", None),
    ("PUT", "/v1/nodes/{node}/weight", ADMIN, "/v1/nodes/n3/weight", {"weight": 1}),
    ("POST", "/v1/nodes/{node}/handoff", ADMIN, "/v1/nodes/n1/handoff", None),
    ("GET", "/v1/topics", ANY, "/v1/topics", None),
    ("GET", "/v1/partitions", ANY, "/v1/partitions", None),
    ("POST", "/v1/topics", ADMIN, "/v1/topics", {"name": "t-new", "replication_factor": 1}),
    ("GET", "/v1/topics/{topic}", DESCRIBE, "/v1/topics/t", None),
    ("PATCH", "/v1/topics/{topic}", ADMIN, "/v1/topics/t", {"config": {"retention_ms": 10**8}}),
    ("DELETE", "/v1/topics/{topic}", ADMIN, "/v1/topics/t-gone", None),
    ("POST", RECORDS, PRODUCE, "/v1/topics/t/partitions/0/records", {"records": [{"value": "v"}]}),
    ("GET", RECORDS, CONSUME, "/v1/topics/t/partitions/0/records?from=0", None),
    # without the WebSocket upgrade: authorized first, then 426
    ("GET", RECORDS + "/stream", PRODUCE, "/v1/topics/t/partitions/0/records/stream", None),
    ("GET", GROUP, CONSUME, "/v1/topics/t/partitions/0/groups/g", None),
    ("POST", GROUP + "/acquire", CONSUME, "/v1/topics/t/partitions/0/groups/g/acquire", {}),
    ("POST", GROUP + "/accept", CONSUME, "/v1/topics/t/partitions/0/groups/g/accept", SETTLE),
    ("POST", GROUP + "/release", CONSUME, "/v1/topics/t/partitions/0/groups/g/release", SETTLE),
    ("POST", GROUP + "/reject", CONSUME, "/v1/topics/t/partitions/0/groups/g/reject", SETTLE),
    ("POST", GROUP + "/renew", CONSUME, "/v1/topics/t/partitions/0/groups/g/renew", SETTLE),
    # consumer group admin (a reset and a delete are an admin's) and offsets for times
    ("GET", PARTITION_GROUPS, CONSUME, "/v1/topics/t/partitions/0/groups", None),
    ("POST", GROUP + "/reset", ADMIN, "/v1/topics/t/partitions/0/groups/g/reset", RESET),
    ("DELETE", GROUP, ADMIN, "/v1/topics/t/partitions/0/groups/g-none", None),
    ("GET", TOPIC_GROUP.removesuffix("/{group}"), CONSUME, "/v1/topics/t/groups", None),
    ("GET", TOPIC_GROUP, CONSUME, "/v1/topics/t/groups/g", None),
    ("POST", TOPIC_GROUP + "/reset", ADMIN, "/v1/topics/t/groups/g/reset", RESET),
    ("DELETE", TOPIC_GROUP, ADMIN, "/v1/topics/t/groups/g-none", None),
    ("GET", OFFSETS, DESCRIBE, "/v1/topics/t/partitions/0/offsets?timestamp_ms=0", None),
    ("GET", "/v1/topics/{topic}/offsets", DESCRIBE, "/v1/topics/t/offsets", None),
    # transactional ids are scoped as topics are: "t-txn" is in the writer's "t*"
    ("POST", TXN, TRANSACT, "/v1/transactions/t-txn", {}),
    ("GET", TXN, TRANSACT, "/v1/transactions/t-txn", None),
    ("POST", TXN + "/partitions", TRANSACT, "/v1/transactions/t-txn/partitions", ADDED),
    ("POST", TXN + "/end", TRANSACT, "/v1/transactions/t-txn/end", ENDED),
    ("POST", MARKERS, INTERNAL, "/v1/topics/t/partitions/0/markers", ENDED),
    # a metadata write another broker forwards to the metadata leader (server/forward.py)
    ("POST", "/v1/metadata/commands", INTERNAL, "/v1/metadata/commands", {"op": "delete_topic"}),
]
OPEN = ["/healthz", "/readyz", "/metrics"]
#: Who may, and who may not, do each kind of request (the principals of `Secured`).
ALLOWED = {
    ANY: ["admin", "other-reader"],
    ADMIN: ["admin"],
    PRODUCE: ["writer", "admin"],
    CONSUME: ["reader", "admin"],
    DESCRIBE: ["writer", "reader", "admin"],
    TRANSACT: ["writer", "admin"],
    INTERNAL: [],  # the brokers' own principal alone
}
REFUSED = {
    ANY: [],
    ADMIN: ["writer", "reader"],
    PRODUCE: ["reader", "other-writer"],
    CONSUME: ["writer", "other-reader"],
    DESCRIBE: ["other-writer", "other-reader"],
    TRANSACT: ["reader", "other-writer"],
    INTERNAL: ["admin", "writer"],
}


@dataclass
class Secured:
    cluster: LocalCluster
    tokens: dict[str, str]  # principal -> token

    def headers(self, principal: str | None) -> dict[str, str]:
        if principal is None:
            return {}
        return {"Authorization": f"Bearer {self.tokens[principal]}"}


def with_principals(path: Path) -> dict[str, str]:
    """Principals besides the cluster's admin in the credentials file of data directory
    `path` (made if new): their tokens."""
    credentials = LocalCluster(path, 3).credentials_path()
    return {
        "writer": add_principal(credentials, "writer", ["producer"], ["t*"]),
        "reader": add_principal(credentials, "reader", ["consumer"], ["t*"]),
        "other-writer": add_principal(credentials, "other-writer", ["producer"], ["other*"]),
        "other-reader": add_principal(credentials, "other-reader", ["consumer"], ["other"]),
    }


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    path = tmp_path_factory.mktemp("auth")
    tokens = with_principals(path)
    cluster = make_cluster(path)
    tokens["admin"] = cluster.token

    async def topics() -> None:
        async with AsyncClient(cluster.urls, token=cluster.token) as client:
            for name in ("t", "t-gone", "other", "unrelated"):
                await client.create_topic(name, partitions=1, replication_factor=3)
                await client.wait_for_leaders(name)

    asyncio.run(topics())
    yield Secured(cluster, tokens)
    cluster.stop()


def served_routes(tmp_path: Path) -> set[tuple[str, str]]:
    """Every (method, route) the broker's application serves (built here, not started)."""
    config = BrokerConfig("n1", tmp_path / "n1", secret=new_secret(), allow_anonymous=True)
    broker = Broker(config)
    api = Api(broker, BrokerMetrics(broker))
    app = api.app()
    routes = {(r.method, r.resource.canonical) for r in app.router.routes() if r.resource}
    # (the web console's pages authenticate themselves: tests/console)
    return {route for route in routes if not is_console_route(route[1])}


def test_every_route_is_open_or_has_a_case(tmp_path: Path) -> None:
    """A new route must come with its rule (its access in laminar/contract.py: else the
    application is not built) and its case here."""
    served = served_routes(tmp_path)
    cases = {(method, route) for method, route, *_ in CASES}
    assert {r for r in served if r[0] != "HEAD" and r[1].startswith("/v1/")} == cases
    assert {route for method, route in served if not route.startswith("/v1/")} == set(OPEN)
    assert {r for r in served if r[0] == "HEAD"} == {
        ("HEAD", route) for method, route in served if method == "GET"
    }


async def answer(
    session: aiohttp.ClientSession, method: str, url: str, headers: dict[str, str], body: Any
) -> tuple[int, Any, Any]:
    kwargs: dict[str, Any] = {"headers": headers, "allow_redirects": False}
    if body is not None:
        kwargs["json"] = body
    async with session.request(method, url, **kwargs) as response:
        document = None
        if response.content_type == "application/json" and method != "HEAD":
            document = await response.json()
        return response.status, document, response.headers


async def test_every_route_is_authorized(secured: Secured) -> None:
    base = secured.cluster.urls[0]
    unknown = {"Authorization": "Bearer lmq_" + "x" * 43}
    async with aiohttp.ClientSession() as session:
        for method, route, action, path, body in CASES:
            what = f"{method} {route}"
            for headers in ({}, unknown, {"Authorization": "Basic YWRtaW46YWRtaW4="}):
                status, document, answered = await answer(session, method, base + path, headers,
                                                          body)  # fmt: skip
                assert status == 401, (what, headers, status, document)
                assert document["error"]["code"] == "unauthorized", (what, document)
                assert answered["WWW-Authenticate"].startswith("Bearer"), what
            for principal in REFUSED[action]:
                headers = secured.headers(principal)
                status, document, _ = await answer(session, method, base + path, headers, body)
                assert status == 403, (what, principal, status, document)
                assert document["error"]["code"] == "forbidden", (what, document)
                assert principal in document["error"]["message"], (what, document)
            for principal in ALLOWED[action]:
                headers = secured.headers(principal)
                status, document, _ = await answer(session, method, base + path, headers, body)
                assert status not in (401, 403, 500), (what, principal, status, document)
            if method == "GET":  # and the HEAD aiohttp serves with every GET
                assert (await answer(session, "HEAD", base + path, {}, None))[0] == 401, what
                allowed = secured.headers(ALLOWED[action][0])
                status, _, _ = await answer(session, "HEAD", base + path, allowed, None)
                assert status not in (401, 403, 500), (what, status)
        for path in OPEN:  # open to anyone
            status, _, _ = await answer(session, "GET", base + path, {}, None)
            assert status == 200, path
        # a route that does not exist: 401 first (strangers learn nothing), then 404
        status, _, _ = await answer(session, "GET", base + "/v1/nowhere", {}, None)
        assert status == 401
        headers = secured.headers("reader")
        status, document, _ = await answer(session, "GET", base + "/v1/nowhere", headers, None)
        assert status == 404, document
        # the drain was undone (by then n3 had handed its metadata leadership over: the undrain
        # waited for the next leader), so no replica leaves n3
        admin = secured.headers("admin")
        status, document, _ = await answer(session, "GET", base + "/v1/cluster", admin, None)
        assert [m["draining"] for m in document["members"]] == [False] * 3, document


async def test_ending_other_ids_transactions_needs_transact_on_each(secured: Secured) -> None:
    """An end's `also` names other transactional ids: the principal must hold each, not
    only the one in the route."""
    base = secured.cluster.urls[0]
    async with AsyncClient(secured.cluster.urls, token=secured.tokens["admin"]) as client:
        mine = await client.init_transactions("t-mine")
        theirs = await client.init_transactions("other-theirs")
    body = {
        "producer_id": mine.producer_id,
        "commit": True,
        "also": [{"transactional_id": "other-theirs", "producer_id": theirs.producer_id}],
    }
    async with aiohttp.ClientSession() as session:
        url = base + "/v1/transactions/t-mine/end"
        status, document, _ = await answer(session, "POST", url, secured.headers("writer"), body)
        assert status == 403, document
        assert "other-theirs" in document["error"]["message"]
    async with AsyncClient(secured.cluster.urls, token=secured.tokens["admin"]) as client:
        also = [("other-theirs", theirs.producer_id)]
        ended = await client.end_transaction("t-mine", mine.producer_id, commit=True, also=also)
        assert ended.committed


async def test_a_scoped_principal_lists_and_describes_its_topics_only(secured: Secured) -> None:
    cluster = secured.cluster

    async def listed(principal: str) -> list[str]:
        token = secured.tokens[principal]
        async with AsyncClient(cluster.urls, token=token) as client:
            return sorted(t.name for t in await client.topics())

    every = await listed("admin")
    assert {"t", "other", "unrelated"} <= set(every)
    assert await listed("other-reader") == ["other"]
    assert set(await listed("reader")) == {t for t in every if t.startswith("t")}
    async with AsyncClient(cluster.urls, token=secured.tokens["other-reader"]) as client:
        assert {p.topic for p in await client.partitions()} == {"other"}  # the table, scoped
        assert [p.topic for p in await client.partitions("other")] == ["other"]
        for topic in ("unrelated", "no-such-topic"):
            with pytest.raises(Forbidden):
                await client.partitions(topic)
    async with AsyncClient(cluster.urls, token=secured.tokens["other-writer"]) as client:
        assert (await client.describe_topic("other")).partitions == 1
        with pytest.raises(Forbidden) as refused:
            await client.describe_topic("unrelated")  # whether it exists or not: 403
        assert "other-writer" in refused.value.message
        with pytest.raises(Forbidden):
            await client.describe_topic("no-such-topic")
        with pytest.raises(Forbidden):
            await client.create_topic("other-mine")  # producers create no topics
        info = await client.cluster()  # the membership, which clients route with
        assert len(info.members) == 3


async def test_the_brokers_call_each_other_with_their_own_principal(secured: Secured) -> None:
    """Through any broker: a node's replicas (fetched from that node), a topic's description
    (every broker's replicas), appends and reads redirected to the leader with the token kept,
    and the dead-letter mover (an internal client) creating `t.dlq` and moving a rejected
    message there for the consumer to read."""
    cluster = secured.cluster
    admin = secured.tokens["admin"]
    for url in cluster.urls:
        async with AsyncClient([url], token=admin) as client:
            for node in cluster.nodes:
                hosted = await client.node_partitions(node)
                assert hosted.node_id == node

            async def in_sync(client: AsyncClient = client) -> object:
                # every broker describes the topic, from every broker's replicas (a follower
                # counts in sync once it acknowledged its leader's own entries)
                states = (await client.describe_topic("t")).partition_states
                return all(p.leader and len(p.in_sync) == 3 for p in states)

            await wait_until("t described in sync", in_sync)
    async with AsyncClient(cluster.urls, token=secured.tokens["writer"]) as writer:
        leader = (await writer.describe_topic("t")).partition_states[0].leader_url
        follower = next(u for u in cluster.urls if u != (leader or "").rstrip("/"))
    async with AsyncClient([follower], token=secured.tokens["writer"]) as writer:
        written = await writer.append("t", 0, [Record(b"poison")])  # 307 to the leader
    async with AsyncClient([follower], token=secured.tokens["reader"]) as reader:
        group = "dead-letters"
        acquired = await reader.acquire("t", 0, group, max_messages=1000)
        held = [m.index for m in acquired.messages]
        assert written.base_index in held
        await reader.reject("t", 0, group, acquired.consumer, held, reason="no good")

        async def moved() -> object:
            return (await reader.describe_group("t", 0, group)).dead_lettered == len(held)

        await wait_until("the rejected messages in t.dlq", moved)
        dead = await reader.read("t.dlq", 0, 0)
        assert b"poison" in [r.value for r in dead.records]


def broker_pids(cluster: LocalCluster) -> list[int]:
    return [n.pid for n in cluster.nodes.values() if n.pid is not None]


async def works(cluster: LocalCluster, token: str) -> bool:
    async with AsyncClient(cluster.urls, token=token, timeout_s=5) as client:
        try:
            await client.topics()
        except Unauthorized:
            return False
    return True


async def test_credentials_are_reloaded_and_tokens_rotated_without_a_restart(
    tmp_path: Path,
) -> None:
    cluster = make_cluster(tmp_path / "rotation", 1)
    try:
        credentials = cluster.credentials_path()
        admin = cluster.token
        first = add_principal(credentials, "app", ["producer", "consumer"], ["orders"])
        # the file is looked at every RELOAD_INTERVAL_S: no signal needed
        await wait_until("the new principal", lambda: works(cluster, first), RELOAD_INTERVAL_S * 5)
        # rotation: a second token for the same principal; both work meanwhile
        second = add_principal(credentials, "app")
        for pid in broker_pids(cluster):
            os.kill(pid, signal.SIGHUP)  # at once
        await wait_until("the second token", lambda: works(cluster, second), 5)
        assert await works(cluster, first)
        assert retire_tokens(credentials, "app", keep=1) == 1
        for pid in broker_pids(cluster):
            os.kill(pid, signal.SIGHUP)

        async def first_refused() -> bool:
            return not await works(cluster, first)

        await wait_until("the first token refused", first_refused, 5)
        assert await works(cluster, second)
        # a file made invalid is refused, logged, and the principals in use stay
        good = credentials.read_text()
        credentials.write_text(good.replace("role: admin", "role: root"))
        for pid in broker_pids(cluster):
            os.kill(pid, signal.SIGHUP)
        await wait_until("the refusal logged", lambda: refusal_logged(cluster, "'root'"), 10)
        assert await works(cluster, second) and await works(cluster, admin)
        credentials.write_text(good)
        assert cluster.nodes["n1"].alive()
        assert "Traceback" not in cluster.tail("n1", 10_000)
    finally:
        cluster.stop()


async def refusal_logged(cluster: LocalCluster, text: str) -> bool:
    lines = cluster.tail("n1", 1000).splitlines()
    return any("keeping the principals in use" in line and text in line for line in lines)


def serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    secret = tmp_path / "secret"
    if not secret.exists():
        secret.write_bytes(new_secret())
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAMINAR_")}
    ports = ["--api-port", "0", "--peer-port", "0", "--gossip-port", "0"]
    return subprocess.run(
        [sys.executable, "-m", "laminar", "serve", "--node-id", "n1", "--secret-file",
         str(secret), "--data-dir", str(tmp_path / "data"), *ports, *args],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip


def test_a_broker_without_credentials_refuses_to_start(tmp_path: Path) -> None:
    refused = serve(tmp_path)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "no client credentials" in refused.stderr
    assert "--credentials-file" in refused.stderr and "--allow-anonymous" in refused.stderr
    short = tmp_path / "short-token"
    short.write_text("changeme\n")
    refused = serve(tmp_path, "--token-file", str(short))
    assert refused.returncode == 2 and "at least 16 are required" in refused.stderr
    plain = tmp_path / "credentials.yaml"
    plain.write_text("principals:\n- {name: ops, role: admin, tokens: [lmq_plaintext]}\n")
    refused = serve(tmp_path, "--credentials-file", str(plain))
    assert refused.returncode == 2 and "is not a token hash" in refused.stderr
    assert not (tmp_path / "data").exists()


async def test_allow_anonymous_opens_the_api_and_says_so(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path / "open", 1, extra_args=("--allow-anonymous",))
    try:
        async with AsyncClient(cluster.urls) as anonymous:  # no token at all: an admin
            await anonymous.create_topic("open", partitions=1, replication_factor=1)
        async with AsyncClient(cluster.urls, token="lmq_" + "y" * 43, timeout_s=5) as wrong:
            with pytest.raises(Unauthorized):  # a wrong token is still refused
                await wrong.topics()
        assert await works(cluster, cluster.token)
        assert "--allow-anonymous: requests without a token are served as an admin" in (
            cluster.tail("n1", 1000)
        )
    finally:
        cluster.stop()
