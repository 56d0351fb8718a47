"""`laminar demo`: a 3-broker cluster on loopback, a topic, a few messages produced and
consumed, the cluster status — then everything stopped and removed."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

from .client import AsyncClient, Producer
from .local_cluster import LocalCluster

DEMO_PREFIX = "127.0.2"  # not the addresses of `laminar local-cluster up` (127.0.0.x)
TOPIC = "demo"


def status_table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows)
    return "\n".join(line.rstrip() for line in lines)


async def _run(cluster: LocalCluster, messages: int) -> None:
    async with AsyncClient(cluster.urls, ca_file=cluster.ca_file, token=cluster.token) as client:
        await client.create_topic(TOPIC, partitions=3, replication_factor=3)
        await client.wait_for_leaders(TOPIC, timeout_s=30)
        print(f"created topic {TOPIC!r}: 3 partitions, each on 3 brokers (Raft)")
        async with Producer(client, TOPIC, linger_ms=2) as producer:
            sent = [
                await producer.send(f"message {i}".encode(), key=f"user-{i % 4}".encode())
                for i in range(messages)
            ]
            await producer.flush()
        for future in sent:
            metadata = await future
            assert metadata.index >= 0
        print(f"produced {messages} messages; each acknowledged once a majority had it on disk")
        received = 0
        for partition in range(3):
            result = await client.read(TOPIC, partition, 0)
            for record in result.records:
                key = (record.key or b"").decode()
                value = (record.value or b"").decode()
                print(f"  partition {partition} index {record.index:>3}  {key}: {value}")
                received += 1
        if received != messages:
            raise RuntimeError(f"consumed {received} messages, produced {messages}")
        info = await client.cluster()
        rows = [["BROKER", "API", "STATE", "LEADS"]]
        described = await client.describe_topic(TOPIC)
        for member in info.members:
            leads = [str(p.partition) for p in described.partition_states if p.leader == member.id]
            rows.append([member.id, member.api_url, member.state, ",".join(leads) or "-"])
        print(f"\ncluster status (metadata leader: {info.metadata_leader})")
        print(status_table(rows))
        rows = [["PARTITION", "LEADER", "REPLICAS", "IN-SYNC", "COMMIT"]]
        for p in described.partition_states:
            rows.append(
                [
                    str(p.partition),
                    p.leader or "-",
                    ",".join(p.replicas),
                    ",".join(p.in_sync),
                    str(p.commit_index),
                ]
            )
        print(status_table(rows))


def run_demo(messages: int = 12, data_dir: str | None = None) -> None:
    path = Path(data_dir or tempfile.mkdtemp(prefix="laminar-demo-"))
    cluster = LocalCluster(path, 3, prefix=DEMO_PREFIX, tls=True)
    print(f"starting 3 brokers on {DEMO_PREFIX}.11-13 (data in {path}), HTTPS and mutual TLS")
    try:
        cluster.start()
        for node in cluster.nodes.values():
            print(f"  {node.id}  {node.api_url}")
        print(
            f"the API requires a token: an admin's is in {cluster.token_file} (clients: "
            f"export LAMINAR_TOKEN_FILE={cluster.token_file})"
        )
        print(
            f"web console, while the demo runs: {cluster.urls[0]}/ (any broker; log in with "
            f"the token in {cluster.token_file}; the certificate is signed by the demo's CA "
            f"{cluster.ca_file}; docs/console.md)"
        )
        asyncio.run(_run(cluster, messages))
    finally:
        cluster.stop()
        if data_dir is None:
            shutil.rmtree(path, ignore_errors=True)
    print("stopped the cluster")
