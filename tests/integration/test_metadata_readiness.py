"""A broker is ready, and denies that a topic exists, only once it has applied what the cluster
committed (issue 17, bug 4): a metadata barrier (read index) confirms it with the metadata
leader. Until then: /readyz 503, and 503 (retriable) instead of 404. Real broker processes."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest

from laminar.client import AsyncClient
from laminar.local_cluster import LocalCluster

from .conftest import auth, make_cluster, wait_until

pytestmark = pytest.mark.integration

START_TIMEOUT_S = 60.0


async def status_of(
    session: aiohttp.ClientSession, method: str, url: str, **kwargs: object
) -> int | None:
    """HTTP status, None while nothing listens."""
    try:
        async with session.request(method, url, allow_redirects=False, **kwargs) as response:  # type: ignore[arg-type]
            await response.read()
            return response.status
    except aiohttp.ClientConnectionError:
        return None


async def first_ready_topics(cluster: LocalCluster, node: str) -> list[str]:
    """Poll `node`'s /readyz from the moment it starts; the topics it knows when it first
    answers 200."""
    base = cluster.nodes[node].api_url
    deadline = time.monotonic() + START_TIMEOUT_S
    async with aiohttp.ClientSession(headers=auth(cluster)) as session:
        while time.monotonic() < deadline:
            if await status_of(session, "GET", f"{base}/readyz") == 200:
                async with session.get(f"{base}/v1/topics") as response:
                    return [t["name"] for t in (await response.json())["topics"]]
            await asyncio.sleep(0.01)
    raise AssertionError(f"{node} never became ready")


async def test_a_restarted_broker_is_ready_only_once_it_knows_what_was_committed(
    tmp_path: Path,
) -> None:
    """n3 is killed; topics are created without it. The first 200 of its /readyz after the
    restart comes when it already knows them (it used to be ready as soon as it knew a
    metadata leader and had replayed its own, older, metadata)."""
    cluster = make_cluster(tmp_path / "ready")
    try:
        cluster.kill("n3")
        names = [f"late-{n}" for n in range(5)]
        async with AsyncClient([cluster.nodes["n1"].api_url], token=cluster.token) as client:
            for name in names:  # (not waiting for leaders: some replicas are on n3)
                await client.create_topic(
                    name, partitions=1, replication_factor=2, wait_for_leaders=False
                )
        cluster.start_node("n3")
        known = await first_ready_topics(cluster, "n3")
        assert set(names) <= set(known), known
    finally:
        cluster.stop()


async def test_a_topic_a_restarting_broker_has_not_learned_yet_is_never_404(
    tmp_path: Path,
) -> None:
    """Requests reach n3 from its first moment up: for a topic created while it was down it
    answers 503 (not yet sure) or serves it (307 to the leader, or 200), never 404."""
    cluster = make_cluster(tmp_path / "never-404")
    try:
        cluster.kill("n3")
        async with AsyncClient([cluster.nodes["n1"].api_url], token=cluster.token) as client:
            await client.create_topic(
                "late", partitions=1, replication_factor=2, wait_for_leaders=False
            )
        cluster.start_node("n3")
        url = f"{cluster.nodes['n3'].api_url}/v1/topics/late/partitions/0/records"
        answers: list[int] = []
        deadline = time.monotonic() + START_TIMEOUT_S
        async with aiohttp.ClientSession(headers=auth(cluster)) as session:
            while time.monotonic() < deadline:
                status = await status_of(session, "GET", f"{url}?from=0")
                if status is not None:
                    answers.append(status)
                    if status in (200, 307):
                        break
                await asyncio.sleep(0.01)
        assert answers and answers[-1] in (200, 307), answers
        assert 404 not in answers, answers
    finally:
        cluster.stop()


async def test_a_broker_cut_off_from_the_metadata_answers_503_not_404(tmp_path: Path) -> None:
    """With two of three brokers down, the third cannot confirm what the cluster committed:
    not ready, and a topic it does not know is 503 (it may exist), not 404. Once the others
    are back, an unknown topic is 404 again."""
    cluster = make_cluster(tmp_path / "cut-off")
    try:
        cluster.kill("n1")
        cluster.kill("n2")
        base = cluster.nodes["n3"].api_url
        async with aiohttp.ClientSession(headers=auth(cluster)) as session:
            assert await status_of(session, "GET", f"{base}/readyz") == 503
            for method, path in (
                ("GET", "/v1/topics/nobody-knows"),
                ("GET", "/v1/topics/nobody-knows/partitions/0/records"),
                ("POST", "/v1/topics/nobody-knows/partitions/0/records"),
            ):
                body = {"json": {"records": [{"value": "x"}]}} if method == "POST" else {}
                assert await status_of(session, method, base + path, **body) == 503, path
        cluster.start_node("n1")
        cluster.start_node("n2")
        cluster.wait_ready()

        async def unknown_is_404() -> object:
            async with aiohttp.ClientSession(headers=auth(cluster)) as session:
                return await status_of(session, "GET", f"{base}/v1/topics/nobody-knows") == 404

        await wait_until("an unknown topic to be 404 again", unknown_is_404)
    finally:
        cluster.stop()
