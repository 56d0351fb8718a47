"""One `laminar serve` process configured only by LAMINAR_* variables: readiness, metrics,
SIGTERM → exit 0 with everything persisted; and a graceful stop of a partition leader in a
3-broker cluster hands its leadership over."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from laminar.client import AsyncClient
from laminar.credentials import Role, dump, entry, new_token, token_hash
from laminar.log.batch import Record, encode_batch
from laminar.server.config import new_secret
from laminar.workers import usable_cores, worker_index

from .conftest import auth, loopback_prefix, make_cluster, settled_log_end

pytestmark = pytest.mark.integration

REQUIRED_METRICS = [
    "laminar_partition_leader",
    "laminar_partition_commit_index",
    "laminar_partition_log_end",
    "laminar_partition_log_start",
    "laminar_partition_bytes",
    "laminar_append_latency_seconds_bucket",
    "laminar_read_latency_seconds_bucket",
    "laminar_raft_elections_total",
    "laminar_raft_leader_changes_total",
    "laminar_raft_leader_rebalances_total",
    "laminar_raft_quiesce_wakes_total",
    "laminar_partition_appends_in_flight",
    "laminar_swim_members",
    "laminar_request_errors_total",
]


#: the admin token of the broker `start_broker` runs (its credentials file, from the environment)
ENV_TOKEN = new_token()


def start_broker(data_dir: Path, host: str, log_path: Path) -> subprocess.Popen[bytes]:
    secret = data_dir.parent / "secret"
    secret.write_bytes(new_secret())
    credentials = data_dir.parent / "credentials.yaml"
    admin = entry("admin", [Role.ADMIN], hashes=[token_hash(ENV_TOKEN)])
    credentials.write_text(dump([admin]))
    env = dict(os.environ)
    env.update(
        {
            "LAMINAR_NODE_ID": "solo",
            "LAMINAR_DATA_DIR": str(data_dir),
            "LAMINAR_HOST": host,
            "LAMINAR_CLUSTER_ID": "env-test",
            "LAMINAR_SECRET_FILE": str(secret),
            "LAMINAR_CREDENTIALS_FILE": str(credentials),
            "LAMINAR_FSYNC": "always",
        }
    )
    with open(log_path, "ab") as output:
        return subprocess.Popen(
            [sys.executable, "-m", "laminar", "serve"],
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )


async def wait_ready(base: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            assert process.poll() is None, "the broker exited"
            try:
                async with session.get(f"{base}/readyz") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError("not ready")


async def test_env_config_metrics_and_sigterm(tmp_path: Path) -> None:
    host = f"{loopback_prefix()}.1"
    base = f"http://{host}:7070"
    data_dir = tmp_path / "solo"
    process = start_broker(data_dir, host, tmp_path / "solo.log")
    try:
        await wait_ready(base, process)
        async with AsyncClient([base], token=ENV_TOKEN) as client:
            await client.create_topic("metered", partitions=2, replication_factor=1)
            for _ in range(50):
                states = (await client.describe_topic("metered")).partition_states
                if all(p.leader for p in states):
                    break
                await asyncio.sleep(0.1)
            result = await client.append("metered", 1, [Record(value=b"m") for _ in range(7)])
            await client.read("metered", 1, result.base_index)
            with pytest.raises(Exception):  # noqa: B017 - any error: we count it below
                await client.describe_topic("absent")
        async with aiohttp.ClientSession() as session, session.get(f"{base}/metrics") as response:
            assert response.status == 200
            text = await response.text()
        for name in REQUIRED_METRICS:
            assert name in text, name
        # the default, one worker per usable core: worker 0's /metrics has every worker's,
        # labelled with it (partition 1's leader's, and its own 404)
        worker = worker_index(states[1].leader or "solo")
        label = f',worker="{worker}"' if usable_cores() > 1 else ""
        commit = f'laminar_partition_commit_index{{partition="1",topic="metered"{label}}}'
        assert commit in text
        if usable_cores() > 1:
            assert 'laminar_request_errors_total{code="not_found",status="404",worker="0"}' in text
        else:
            assert 'laminar_request_errors_total{code="not_found",status="404"}' in text
        commit_line = next(line for line in text.splitlines() if line.startswith(commit))
        assert float(commit_line.split()[-1]) >= result.base_index + 6
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
        # everything is back after a restart
        process = start_broker(data_dir, host, tmp_path / "solo.log")
        await wait_ready(base, process)
        async with AsyncClient([base], token=ENV_TOKEN) as client:
            for _ in range(100):
                states = (await client.describe_topic("metered")).partition_states
                if states[1].commit_index >= result.base_index + 6:
                    break
                await asyncio.sleep(0.1)
            read = await client.read("metered", 1, result.base_index)
            assert [r.value for r in read.records] == [b"m"] * 7
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=20)


async def test_graceful_stop_hands_over_leadership(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path / "graceful")
    try:
        async with AsyncClient(cluster.urls, token=cluster.token) as client:
            await client.create_topic("handover", partitions=1, replication_factor=3)
            for _ in range(100):
                leader = (await client.describe_topic("handover")).partition_states[0].leader
                if leader:
                    break
                await asyncio.sleep(0.1)
            assert leader is not None
            before = await client.append(
                "handover", 0, [Record(value=b"before")], producer_id=77, sequence=0
            )
            assert cluster.stop_node(leader) == 0
            assert "hands handover/0 to" in cluster.tail(leader, 200)
            # a successor was handed the leadership: appends work again (an idempotent
            # append is retried if the old leader's pooled connection broke)
            after = await client.append(
                "handover", 0, [Record(value=b"after")], producer_id=77, sequence=1
            )
            assert after.base_index > before.base_index
            state = (await client.describe_topic("handover")).partition_states[0]
            assert state.leader not in (None, leader)
            records = (await client.read("handover", 0, before.base_index)).records
            assert [r.value for r in records] == [b"before", b"after"]
    finally:
        cluster.stop()


async def test_brokers_stopped_together_do_not_hand_their_leaderships_back_and_forth(
    tmp_path: Path,
) -> None:
    """Every broker of a cluster gets SIGTERM at once (a cluster's deletion, `local-cluster
    down`): each says it is leaving, so none hands a group to another one stopping, once it
    has heard. A group is handed over at most once by each broker (before it heard that the
    others were stopping too), where they used to hand every group back and forth until the
    handoff's deadline: hundreds of times."""
    cluster = make_cluster(tmp_path / "together")
    try:
        async with AsyncClient(cluster.urls, token=cluster.token) as client:
            await client.create_topic("together", partitions=6, replication_factor=3)
            await client.wait_for_leaders("together")
    finally:
        cluster.stop()
    handed: dict[str, int] = {}
    for node in cluster.nodes:
        for group in re.findall(rf"{node} hands (\S+) to ", cluster.tail(node, 1_000_000)):
            handed[group] = handed.get(group, 0) + 1
    # (none may be handed over at all: a broker that hears the others first hands nothing)
    assert max(handed.values(), default=0) <= len(cluster.nodes), handed


async def test_append_backpressure_is_bounded_in_bytes(tmp_path: Path) -> None:
    """A partition takes at most --max-pending-bytes of appends awaiting commit: a larger
    append is refused with 429 + Retry-After before its body is read, and nothing changes."""
    cluster = make_cluster(
        tmp_path / "bounded", 1, extra_args=("--max-pending-bytes", str(100 * 1024))
    )
    try:
        async with AsyncClient(cluster.urls, token=cluster.token) as client:
            await client.create_topic("bounded", partitions=1, replication_factor=1)
            for _ in range(100):
                if (await client.describe_topic("bounded")).partition_states[0].leader:
                    break
                await asyncio.sleep(0.1)
            small = await client.append("bounded", 0, [Record(value=b"s" * 10_000)])
            end = (await client.describe_topic("bounded")).partition_states[0].log_end
        big = encode_batch([Record(value=b"b" * 150_000)])
        url = f"{cluster.urls[0]}/v1/topics/bounded/partitions/0/records"
        headers = {"Content-Type": "application/vnd.laminar.batch"}
        async with (
            aiohttp.ClientSession(headers=auth(cluster)) as session,
            session.post(url, data=big, headers=headers) as response,
        ):
            assert response.status == 429
            assert response.headers["Retry-After"] == "1"
            assert (await response.json())["error"]["code"] == "overloaded"
        async with AsyncClient(cluster.urls, token=cluster.token) as client:
            state = (await client.describe_topic("bounded")).partition_states[0]
            assert state.log_end == end
            records = (await client.read("bounded", 0, small.base_index)).records
            assert [len(r.value or b"") for r in records] == [10_000]
    finally:
        cluster.stop()


async def test_long_polls_waiting_when_the_broker_stops_answer_503(tmp_path: Path) -> None:
    """SIGTERM while a long-poll read and a long-poll acquire wait on an empty partition: the
    broker closes the replica under them, and each answers 503 `unavailable` + Retry-After
    (a request the server reads only once it stopped listening sees its connection close):
    never 500, and never an empty 200, which would say "nothing new yet"."""
    cluster = make_cluster(tmp_path / "stopping", 1)
    try:
        async with AsyncClient(cluster.urls, token=cluster.token) as client:
            await client.create_topic("quiet", partitions=1, replication_factor=1)
            await client.wait_for_leaders("quiet")
            end = await settled_log_end(client, "quiet")
        base = f"{cluster.urls[0]}/v1/topics/quiet/partitions/0"
        async with aiohttp.ClientSession(headers=auth(cluster)) as session:

            async def answer(method: str, url: str, **kw: Any) -> tuple[int, Any, Any] | None:
                try:
                    async with session.request(method, url, **kw) as response:
                        body = await response.json()
                        return response.status, response.headers.get("Retry-After"), body
                except aiohttp.ClientConnectionError:
                    return None  # closed without an answer

            long_polls = [
                asyncio.create_task(answer("GET", f"{base}/records?from={end}&wait_ms=30000")),
                asyncio.create_task(
                    answer("POST", f"{base}/groups/g/acquire", json={"wait_ms": 30000})
                ),
            ]
            async with session.get(f"{cluster.urls[0]}/healthz") as response:
                assert response.status == 200  # the long polls went out before this
            assert await asyncio.to_thread(cluster.stop_node, "n1") == 0
            for answered in await asyncio.gather(*long_polls):
                if answered is not None:
                    status, retry_after, body = answered
                    assert (status, retry_after) == (503, "1"), body
                    assert body["error"]["code"] == "unavailable"
    finally:
        cluster.stop()
