"""TLS (docs/security.md, "TLS"): brokers given a certificate serve HTTPS only, send clients to
https URLs, speak mutual TLS to each other (a peer without a certificate of the cluster's CA
gets nothing), and take new certificates and CA bundles without a restart while a client keeps
producing."""

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

from laminar.certs import KeyPair, fingerprint, issue, make_ca
from laminar.client import AsyncClient, LaminarError, Producer
from laminar.local_cluster import LocalCluster
from laminar.log.batch import Record
from laminar.server.transport import HANDSHAKE_HEAD, HELLO, MAGIC, VERSION, hello_body
from laminar.tls import client_context

from .conftest import auth, make_cluster, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = make_cluster(tmp_path_factory.mktemp("tls"), 3, tls=True)
    yield cluster
    cluster.stop()


def _host_port(url: str) -> tuple[str, int]:
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    return host, int(port)


async def _server_certificate(url: str, context: ssl.SSLContext) -> dict[str, object]:
    """The certificate a new TLS connection to `url` is shown."""
    host, port = _host_port(url)
    _, writer = await asyncio.open_connection(host, port, ssl=context, server_hostname=host)
    try:
        return writer.get_extra_info("peercert")  # type: ignore[no-any-return]
    finally:
        writer.close()


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")
def test_the_api_is_https_only_and_sends_clients_to_https(tls_cluster: LocalCluster) -> None:
    assert tls_cluster.ca_file is not None
    assert all(url.startswith("https://") for url in tls_cluster.urls)

    async def run() -> None:
        async with AsyncClient(
            tls_cluster.urls, token=tls_cluster.token, ca_file=tls_cluster.ca_file
        ) as client:
            await client.create_topic("tls-orders", partitions=1, replication_factor=3)
            described = await client.wait_for_leaders("tls-orders")
            (state,) = described.partition_states
            assert state.leader_url is not None and state.leader_url.startswith("https://")
            members = (await client.cluster()).members
            assert {m.api_url for m in members} == set(tls_cluster.urls)
            result = await client.append("tls-orders", 0, [Record(value=b"over TLS")])
            read = await client.read("tls-orders", 0, result.base_index)
            assert read.records[0].value == b"over TLS"
        leader = state.leader_url
        follower = next(url for url in tls_cluster.urls if url != leader)
        context = client_context(tls_cluster.ca_file)
        async with aiohttp.ClientSession(headers=auth(tls_cluster)) as session:
            # a follower sends the append to the leader's https URL
            async with session.post(
                f"{follower}/v1/topics/tls-orders/partitions/0/records",
                json={"records": [{"value": "x"}]},
                allow_redirects=False,
                ssl=context,
            ) as answer:
                assert answer.status == 307
                assert answer.headers["Location"].startswith(f"{leader}/v1/topics/")
                assert (await answer.json())["error"]["leader_url"] == leader
            # the node's partitions, fetched by another broker over HTTPS with the cluster's CA
            node = next(m.id for m in members if m.api_url == leader)
            async with session.get(f"{follower}/v1/nodes/{node}/partitions", ssl=context) as got:
                assert got.status == 200 and (await got.json())["partitions"]
            # one connection (its TLS session) goes on after aiohttp takes it over (a HEAD)
            one = aiohttp.TCPConnector(limit=1, ssl=context)
            async with aiohttp.ClientSession(headers=auth(tls_cluster), connector=one) as single:
                for method in ("GET", "HEAD", "GET"):
                    async with single.request(method, f"{leader}/v1/cluster") as got:
                        assert got.status == 200
                        await got.read()
            # plain HTTP to the API port gets no answer
            plain = leader.replace("https://", "http://")
            with pytest.raises(aiohttp.ClientError):
                async with session.get(f"{plain}/healthz") as answer:
                    await answer.read()
            # TLS 1.1 is refused
            old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            old.load_verify_locations(cafile=str(tls_cluster.ca_file))
            old.minimum_version = ssl.TLSVersion.TLSv1
            old.maximum_version = ssl.TLSVersion.TLSv1_1
            old.set_ciphers("ALL:@SECLEVEL=0")
            with pytest.raises((aiohttp.ClientError, ssl.SSLError)):
                async with session.get(f"{leader}/healthz", ssl=old) as answer:
                    await answer.read()
        # without the cluster's CA the certificate is refused at once, not retried
        started = time.monotonic()
        async with AsyncClient(
            tls_cluster.urls, token=tls_cluster.token, timeout_s=30
        ) as untrusting:
            with pytest.raises(LaminarError, match="certificate verify failed") as refused:
                await untrusting.topics()
        assert refused.value.code == "tls_error" and time.monotonic() - started < 10

    asyncio.run(run())


def _peer_port(cluster: LocalCluster, node: str) -> tuple[str, int]:
    return cluster.nodes[node].host, 7071


def _hello(client: str, server: str) -> bytes:
    body = hello_body("local", client, server)
    return HANDSHAKE_HEAD.pack(MAGIC, VERSION, HELLO, 0, len(body)) + body


def _peer_answer(cluster: LocalCluster, context: ssl.SSLContext | None) -> bytes:
    """What n1's peer port answers a HELLO from "n9" with: the challenge (a peer it admits to
    the HMAC handshake), or b"" when the connection is refused or closed."""
    host, port = _peer_port(cluster, "n1")
    try:
        with socket.create_connection((host, port), timeout=5) as raw:
            sock: socket.socket = raw
            if context is not None:
                sock = context.wrap_socket(raw, server_hostname=host)
            sock.sendall(_hello("n9", "n1"))
            sock.settimeout(5)
            return sock.recv(HANDSHAKE_HEAD.size)
    except (OSError, ssl.SSLError):
        return b""


def test_peers_need_a_certificate_of_the_clusters_ca(
    tls_cluster: LocalCluster, tmp_path: Path
) -> None:
    assert tls_cluster.ca_file is not None
    ca = KeyPair(
        tls_cluster.ca_file.read_bytes(), (tls_cluster.ca_file.parent / "ca.key").read_bytes()
    )

    def context_with(pair: KeyPair | None) -> ssl.SSLContext:
        context = client_context(tls_cluster.ca_file)
        if pair is not None:
            (tmp_path / "peer.crt").write_bytes(pair.cert_pem)
            (tmp_path / "peer.key").write_bytes(pair.key_pem)
            context.load_cert_chain(tmp_path / "peer.crt", tmp_path / "peer.key")
        return context

    # A certificate of the cluster's CA: admitted to the HMAC handshake (the challenge comes)
    admitted = _peer_answer(tls_cluster, context_with(issue(ca, "n9", ["127.0.0.1"])))
    assert admitted[:4] == MAGIC
    # No certificate, one of another CA, or no TLS at all: nothing comes back
    assert _peer_answer(tls_cluster, context_with(None)) == b""
    stranger = issue(make_ca("another"), "n9", ["127.0.0.1"])
    assert _peer_answer(tls_cluster, context_with(stranger)) == b""
    assert _peer_answer(tls_cluster, None) == b""


async def _trusting(client: AsyncClient, cluster: LocalCluster, cas: tuple[KeyPair, ...]) -> None:
    """Until every broker says it verifies peers against `cas` (GET /v1/nodes/{id}/tls)."""
    wanted = tuple(fingerprint(ca.cert_pem) for ca in cas)
    for node in cluster.nodes:

        async def loaded(n: str = node) -> bool:
            return (await client.node_tls(n)).trusted_cas == wanted

        await wait_until(f"{node} trusting {len(cas)} CA(s)", loaded, 30)


def _serial(cert: dict[str, object]) -> int:
    return int(str(cert["serialNumber"]), 16)


def test_certificates_and_ca_rotate_without_a_restart_while_a_client_produces(
    tmp_path: Path,
) -> None:
    """Each broker gets a new certificate of the same CA; then the CA bundle becomes old+new
    and the brokers get certificates of the new CA; then the bundle is the new CA alone and a
    restarted broker rejoins over mutual TLS with the others. A producer runs throughout; no
    append fails, and every new connection shows the certificate of the moment."""
    cluster = make_cluster(tmp_path / "rotating", 3, tls=True)
    try:
        assert cluster.ca_file is not None
        old_ca = KeyPair(
            cluster.ca_file.read_bytes(), (cluster.ca_file.parent / "ca.key").read_bytes()
        )
        new_ca = make_ca("the next CA")
        # The client trusts both from the start (the bundle reaches clients first).
        bundle = tmp_path / "client-ca.crt"
        bundle.write_bytes(old_ca.cert_pem + new_ca.cert_pem)
        asyncio.run(_rotate(cluster, old_ca, new_ca, bundle))
    finally:
        cluster.stop()


async def _rotate(cluster: LocalCluster, old_ca: KeyPair, new_ca: KeyPair, bundle: Path) -> None:
    assert cluster.ca_file is not None
    context = client_context(bundle)
    acked = 0
    producing = True

    async with AsyncClient(cluster.urls, token=cluster.token, ca_file=bundle) as client:
        await client.create_topic("rotating", partitions=3, replication_factor=3)
        await client.wait_for_leaders("rotating")

        async def produce() -> None:
            nonlocal acked
            async with Producer(client, "rotating", linger_ms=1) as producer:
                while producing:
                    await (await producer.send(f"record {acked}".encode()))
                    acked += 1
                    await asyncio.sleep(0.01)

        producer = asyncio.create_task(produce())

        async def shows(node: str, pair: KeyPair) -> bool:
            cert = await _server_certificate(cluster.nodes[node].api_url, context)
            return _serial(cert) == pair.certificate.serial_number

        # 1. a new certificate of the same CA for every broker
        for node in cluster.nodes:
            pair = cluster.renew_certificate(node)
            await wait_until(
                f"{node} serving its new certificate", lambda n=node, p=pair: shows(n, p), 30
            )
            state = await client.node_tls(node)  # what it says it serves: the same
            assert state.enabled and state.node_id == node
            assert state.fingerprint == fingerprint(pair.cert_pem)
            assert state.trusted_cas == (fingerprint(old_ca.cert_pem),)
        # the broker says so in its metrics: one reload, and the new certificate's expiry
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{cluster.nodes['n3'].api_url}/metrics", ssl=context) as answer,
        ):
            metrics = await answer.text()
        samples = {
            sample.name: sample.value
            for family in text_string_to_metric_families(metrics)
            for sample in family.samples
        }
        assert samples["laminar_tls_reloads_total"] == 1
        assert samples["laminar_tls_reload_failing"] == 0
        expiry = samples["laminar_tls_certificate_expiry_timestamp_seconds"]
        assert expiry == pair.not_after.timestamp()
        # 2. the bundle old+new on every broker, then certificates of the new CA
        cluster.ca_file.write_bytes(old_ca.cert_pem + new_ca.cert_pem)
        await _trusting(client, cluster, (old_ca, new_ca))
        for node in cluster.nodes:
            pair = cluster.renew_certificate(node, new_ca)
            await wait_until(f"{node} on the new CA", lambda n=node, p=pair: shows(n, p), 30)
        # 3. the old CA dropped; a restarted broker rejoins over mutual TLS of the new CA
        cluster.ca_file.write_bytes(new_ca.cert_pem)
        await _trusting(client, cluster, (new_ca,))
        before = acked
        cluster.kill("n3")
        cluster.start_node("n3")
        cluster.wait_ready(["n3"])

        async def n3_in_sync() -> bool:
            described = await client.describe_topic("rotating")
            return all("n3" in p.in_sync for p in described.partition_states)

        await wait_until("n3 back in sync", n3_in_sync, 60)

        async def acked_since() -> bool:  # (an event to wait for: the loop may lag on a load)
            return acked > before

        await wait_until("an append acknowledged since the restart", acked_since, 60)
        producing = False
        await producer  # raises if an append failed
        assert acked > before > 0
        total = 0
        for partition in range(3):
            read = await client.read("rotating", partition, 0, max_records=100_000)
            total += len(read.records)
        assert total == acked
