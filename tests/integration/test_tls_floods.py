"""Floods of idle TCP connections against TLS brokers (docs/security.md, "Limits on
unauthenticated connections"): the bounds per source address apply at TCP accept, before the
TLS handshake. From one address, the connections past the bound are closed at once, the first
ones are held only until the short handshake bound, and genuine peers and clients from other
addresses get in meanwhile: a broker restarted during a flood rejoins and catches up."""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from laminar.certs import KeyPair, issue
from laminar.client import AsyncClient, h1
from laminar.local_cluster import LocalCluster
from laminar.log.batch import Record
from laminar.server.config import DEFAULT_API_PORT, DEFAULT_PEER_PORT
from laminar.server.transport import (
    HANDSHAKE_HEAD,
    HELLO,
    MAGIC,
    MAX_PENDING_PER_SOURCE,
    VERSION,
    hello_body,
)
from laminar.tls import client_context

from .conftest import auth, make_cluster, wait_until

pytestmark = pytest.mark.integration
#: the API's cap per client address, and its header timeout (the bound on TLS handshakes)
MAX_CONNECTIONS = 32
HEADER_TIMEOUT_S = 5.0
#: idle connections opened per flooded port (well past either bound)
FLOOD = 200
#: a generous bound on what the broker does at once, or after its 5 s handshake bounds
#: (HANDSHAKE_TIMEOUT_S, HEADER_TIMEOUT_S)
PROMPT_S = 20.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = make_cluster(
        tmp_path_factory.mktemp("tls-floods"),
        3,
        tls=True,
        extra_args=(
            f"--max-connections-per-client={MAX_CONNECTIONS}",
            f"--header-timeout-ms={HEADER_TIMEOUT_S * 1000:.0f}",
        ),
    )
    yield cluster
    cluster.stop()


def flood_source(cluster: LocalCluster, last: int) -> str:
    """A loopback address no broker, and no connection between brokers, uses (they dial from
    127.0.0.1): the flood's."""
    return f"{cluster.prefix}.{last}"


async def idle_sockets(host: str, port: int, count: int, source: str) -> list[socket.socket]:
    """`count` TCP connections from `source` to host:port that send nothing (no ClientHello)."""
    loop = asyncio.get_running_loop()
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sockets.append(sock)
            sock.setblocking(False)
            sock.bind((source, 0))
            await asyncio.wait_for(loop.sock_connect(sock, (host, port)), 10)
    except BaseException:
        close_all(sockets)
        raise
    return sockets


def closed_by_broker(sock: socket.socket) -> bool:
    """Whether the broker closed `sock` (end of stream or reset), without waiting."""
    try:
        while sock.recv(1 << 16):  # nothing comes before the ClientHello; drain if it did
            pass
        return True
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True


def close_all(sockets: list[socket.socket]) -> None:
    for sock in sockets:
        sock.close()


async def all_closed(what: str, sockets: list[socket.socket], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(closed_by_broker(sock) for sock in sockets):
        if time.monotonic() > deadline:
            open_ = sum(not closed_by_broker(sock) for sock in sockets)
            raise AssertionError(f"{what}: {open_} of {len(sockets)} open after {timeout_s} s")
        await asyncio.sleep(0.05)


async def refused_handshakes(cluster: LocalCluster, node: str) -> float:
    return await broker_counter(cluster, node, "laminar_peer_handshakes_refused_total")


async def broker_counter(cluster: LocalCluster, node: str, name: str) -> float:
    """`name`'s value in the `/metrics` of broker `node`."""
    assert cluster.ca_file is not None
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"{cluster.nodes[node].api_url}/metrics", ssl=client_context(cluster.ca_file)
        ) as answer,
    ):
        text = await answer.text()
    return next(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    )


def peer_context(cluster: LocalCluster, directory: Path) -> ssl.SSLContext:
    """A TLS client context with a certificate of the cluster's CA, as a peer has."""
    assert cluster.ca_file is not None
    ca = KeyPair(cluster.ca_file.read_bytes(), (cluster.ca_file.parent / "ca.key").read_bytes())
    pair = issue(ca, "n9", ["127.0.0.1"])
    (directory / "peer.crt").write_bytes(pair.cert_pem)
    (directory / "peer.key").write_bytes(pair.key_pem)
    context = client_context(cluster.ca_file)
    context.load_cert_chain(directory / "peer.crt", directory / "peer.key")
    return context


def challenged(cluster: LocalCluster, node: str, source: str, context: ssl.SSLContext) -> bool:
    """Whether a TLS peer from `source` gets through to the HMAC handshake of `node` (its
    HELLO is answered with a challenge)."""
    host = cluster.nodes[node].host
    body = hello_body("local", "n9", node)
    try:
        with (
            socket.create_connection((host, DEFAULT_PEER_PORT), 5, (source, 0)) as raw,
            context.wrap_socket(raw, server_hostname=host) as sock,
        ):
            sock.sendall(HANDSHAKE_HEAD.pack(MAGIC, VERSION, HELLO, 0, len(body)) + body)
            return sock.recv(HANDSHAKE_HEAD.size)[:4] == MAGIC
    except (OSError, ssl.SSLError):
        return False


async def test_a_peer_port_flood_is_bounded_at_accept_and_a_restarted_broker_rejoins(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    source = flood_source(cluster, 250)
    flooded = ["n1", "n2"]
    async with AsyncClient(cluster.urls, token=cluster.token, ca_file=cluster.ca_file) as client:
        await client.create_topic("floods", partitions=3, replication_factor=3)
        await client.wait_for_leaders("floods")
        cluster.kill("n3")
        before = {node: await refused_handshakes(cluster, node) for node in flooded}
        floods = {
            node: await idle_sockets(cluster.nodes[node].host, DEFAULT_PEER_PORT, FLOOD, source)
            for node in flooded
        }
        try:
            cap = MAX_PENDING_PER_SOURCE
            for node, flood in floods.items():
                # Past the bound for one source: closed at once, with no TLS work, while the
                # first ones (accepted first) are still held in their handshake. Had the bound
                # applied only after TLS, all would be held, and the first ones timed out first.
                await all_closed(f"{node}: the flood past the bound", flood[cap:], PROMPT_S)
                assert not any(closed_by_broker(sock) for sock in flood[:cap])
                assert await refused_handshakes(cluster, node) - before[node] >= FLOOD - cap
            # A broker restarted during the flood (kept up: closed connections are replaced)
            # gets in: it rejoins and catches up with what was appended meanwhile.
            for partition in range(3):
                await client.append("floods", partition, [Record(value=b"during the flood")])
            cluster.start_node("n3")
            topped_up = time.monotonic()

            async def n3_in_sync() -> bool:
                nonlocal topped_up
                if time.monotonic() - topped_up >= 1.0:  # replace what was closed, each second
                    topped_up = time.monotonic()
                    for node, flood in floods.items():
                        closed = [sock for sock in flood if closed_by_broker(sock)]
                        close_all(closed)
                        flood[:] = [sock for sock in flood if sock not in closed]
                        host = cluster.nodes[node].host
                        flood += await idle_sockets(host, DEFAULT_PEER_PORT, len(closed), source)
                described = await client.describe_topic("floods")
                return all("n3" in p.in_sync for p in described.partition_states)

            await wait_until("n3 back in sync during the flood", n3_in_sync, 45)
            # The first ones were held only until the handshake bound, not a minute.
            await all_closed("the held ones", [s for f in floods.values() for s in f], PROMPT_S)
        finally:
            for flood in floods.values():
                close_all(flood)
        # Every place the flood held is free again: a TLS peer from its address gets through.
        context = peer_context(cluster, tmp_path)
        for node in flooded:
            assert await asyncio.to_thread(challenged, cluster, node, source, context), node


async def test_an_api_port_flood_is_capped_at_accept_and_other_clients_are_served(
    cluster: LocalCluster,
) -> None:
    assert cluster.ca_file is not None
    source = flood_source(cluster, 251)
    base = cluster.nodes["n1"].api_url
    context = client_context(cluster.ca_file)
    refused = await broker_counter(cluster, "n1", "laminar_http_connections_refused_total")
    flood = await idle_sockets(cluster.nodes["n1"].host, DEFAULT_API_PORT, FLOOD, source)
    try:
        # Past the cap for the address: closed at once (no TLS, so no 429 either), while the
        # first ones are still held in their TLS handshake.
        await all_closed("the flood past the cap", flood[MAX_CONNECTIONS:], PROMPT_S)
        assert not any(closed_by_broker(sock) for sock in flood[:MAX_CONNECTIONS])
        counted = await broker_counter(cluster, "n1", "laminar_http_connections_refused_total")
        assert counted - refused == FLOOD - MAX_CONNECTIONS
        async with aiohttp.ClientSession(headers=auth(cluster)) as session:
            async with session.get(f"{base}/v1/topics", ssl=context) as answer:  # 127.0.0.1
                assert answer.status == 200, await answer.text()
            # The held ones are closed after the handshake bound (--header-timeout-ms).
            await all_closed("the held ones", flood[:MAX_CONNECTIONS], PROMPT_S)
            # Their places are free again: the flood's address is served.
            connector = aiohttp.TCPConnector(local_addr=(source, 0))
            async with (
                aiohttp.ClientSession(headers=auth(cluster), connector=connector) as other,
                other.get(f"{base}/v1/topics", ssl=context) as answer,
            ):
                assert answer.status == 200, await answer.text()
    finally:
        close_all(flood)


async def test_a_client_over_the_cap_learns_it_from_the_closed_handshakes(
    cluster: LocalCluster,
) -> None:
    """Over TLS a connection past the cap is closed before its handshake, with no 429: the
    client's pool, holding other connections to that broker, takes the reset for the cap,
    holds no more than it has open, and sends the request again on one of those (nothing was
    sent on the closed one). Every request is answered."""
    base = cluster.nodes["n1"].api_url
    context = client_context(cluster.ca_file)
    p = h1.Pool(2 * MAX_CONNECTIONS, connect_timeout_s=HEADER_TIMEOUT_S)
    try:
        deadline = asyncio.get_running_loop().time() + PROMPT_S
        answers = await asyncio.gather(
            *(
                p.request("GET", f"{base}/healthz", {}, None, deadline, context)
                for _ in range(2 * MAX_CONNECTIONS)
            )
        )
        assert sorted({status for status, _, _ in answers}) == [200]
        cap = p.cap_of(base)
        assert cap is not None and 0 < cap <= MAX_CONNECTIONS
    finally:
        p.close()
