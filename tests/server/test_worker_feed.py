"""What worker 0 asks the other workers over the local feed (docs/workers.md), on a real Unix
socket:
* metrics: one scrape labels every sample with its worker; a worker that does not answer is
  left out, and the scrape still answers; a worker that sends garbage keeps its connection
  (which says it runs);
* a handoff: worker 0 adds up what each still leads; a worker that does not answer in time is
  left out; a worker's handoff does not hold up its feed."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics
from prometheus_client.parser import text_string_to_metric_families

from laminar.server.metrics import merge_workers
from laminar.server.worker_feed import FeedClient, FeedServer, socket_path


class Connected:
    """Worker 0's record of which workers are down (`FeedServer`'s `on_workers`)."""

    def __init__(self) -> None:
        self.down: list[int] = []
        self._changed = asyncio.Event()

    def changed(self, mask: int) -> None:
        self.down.append(mask)
        self._changed.set()

    async def until_down(self, mask: int) -> None:
        """Wait until the workers down are those of `mask`."""
        while not self.down or self.down[-1] != mask:
            self._changed.clear()
            await asyncio.wait_for(self._changed.wait(), 10)


def worker_text(appended: int, latency_s: float) -> str:
    """A worker's OpenMetrics text, made as BrokerMetrics makes it."""
    registry = CollectorRegistry()
    Counter("laminar_appended_records", "records appended", registry=registry).inc(appended)
    errors = Counter("laminar_request_errors", "errors", ["status", "code"], registry=registry)
    errors.labels("404", "not_found").inc()
    Histogram("laminar_append_latency_seconds", "latency", registry=registry).observe(latency_s)
    return str(openmetrics(registry).decode())


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_merged_metrics_label_each_sample_with_its_worker_and_name_each_family_once() -> None:
    body, content_type = merge_workers({0: worker_text(3, 0.01), 1: worker_text(5, 2.0)})
    text = body.decode()
    assert content_type.startswith("text/plain")
    assert text.count("# TYPE laminar_appended_records_total counter") == 1
    got = samples(text)
    assert got[("laminar_appended_records_total", (("worker", "0"),))] == 3
    assert got[("laminar_appended_records_total", (("worker", "1"),))] == 5
    error = ("laminar_request_errors_total", (("code", "not_found"), ("status", "404"),
                                              ("worker", "1")))  # fmt: skip
    assert got[error] == 1
    slow = ("laminar_append_latency_seconds_bucket", (("le", "1.0"), ("worker", "1")))
    assert got[slow] == 0 and got[(slow[0], (("le", "1.0"), ("worker", "0")))] == 1
    assert all(dict(labels).get("worker") in ("0", "1") for _, labels in got)


async def test_worker_0_scrapes_the_others_over_the_feed_and_leaves_out_a_silent_one(
    tmp_path: Path,
) -> None:
    workers = Connected()
    server = FeedServer(tmp_path, 3, lambda: [], workers.changed)
    await server.start()
    text = worker_text(7, 0.1)
    client = FeedClient(tmp_path, 1, lambda table: None, lambda event: None, lambda: text)
    following = asyncio.create_task(client.run())
    silent = None
    try:
        await workers.until_down(0b100)  # worker 1 connected
        assert await server.scrape() == {1: text}
        # worker 2 connects and never answers: left out when the wait ends
        reader, silent = await asyncio.open_unix_connection(str(socket_path(tmp_path)))
        silent.write(json.dumps({"worker": 2}).encode() + b"\n")
        await workers.until_down(0)
        assert await server.scrape(timeout_s=0.5) == {1: text}
        asked: dict[str, object] = {}
        while "scrape" not in asked:  # (the member table comes first)
            asked = json.loads(await reader.readline())
        assert asked == {"scrape": 2}  # (it was asked; it did not answer)
        # garbage, then a late answer to scrape 2: both dropped, the connection kept
        silent.write(b"not json\n" + json.dumps({"scrape": 2, "text": "late"}).encode() + b"\n")
        answering = asyncio.create_task(server.scrape(timeout_s=10))
        asked = json.loads(await reader.readline())
        assert asked == {"scrape": 3}
        mine = worker_text(1, 0.2)
        silent.write(json.dumps({"scrape": 3, "text": mine}).encode() + b"\n")
        assert await answering == {1: text, 2: mine}
        assert workers.down[-1] == 0
    finally:
        following.cancel()
        if silent is not None:
            silent.close()
        await server.stop()


async def test_worker_0_asks_the_others_to_hand_over_and_hears_how_many_groups_each_leads(
    tmp_path: Path,
) -> None:
    holds: list[tuple[float | None, float]] = []
    release = asyncio.Event()

    async def handoff(hold_s: float | None, timeout_s: float) -> int:
        holds.append((hold_s, timeout_s))
        await release.wait()  # (a handoff takes a while: the feed goes on meanwhile)
        return 3

    workers = Connected()
    server = FeedServer(tmp_path, 3, lambda: [], workers.changed)
    await server.start()
    client = FeedClient(
        tmp_path, 1, lambda table: None, lambda event: None, lambda: "# EOF\n", handoff
    )
    following = asyncio.create_task(client.run())
    silent = None
    try:
        await workers.until_down(0b100)  # worker 1 connected
        handing = asyncio.create_task(server.handoff(60.0, timeout_s=10, answer_s=0))
        # worker 1 is handing over: its feed still answers a scrape
        assert await server.scrape(timeout_s=10) == {1: "# EOF\n"}
        assert holds == [(60.0, 10)] and not handing.done()  # (the worker's own budget)
        release.set()
        assert await handing == {1: 3}
        # worker 2 connects and never answers: left out when the wait ends
        reader, silent = await asyncio.open_unix_connection(str(socket_path(tmp_path)))
        silent.write(json.dumps({"worker": 2}).encode() + b"\n")
        await workers.until_down(0)
        assert await server.handoff(None, timeout_s=0.3, answer_s=0.2) == {1: 3}
        assert holds == [(60.0, 10), (None, 0.3)]
        asked: dict[str, object] = {}
        while "handoff" not in asked:  # (the member table comes first)
            asked = json.loads(await reader.readline())
        # (asks are numbered with scrapes)
        assert asked == {"handoff": 3, "hold_s": None, "timeout_s": 0.3}
        # a late answer (to an ask that has ended), and one of the wrong type: both dropped
        silent.write(json.dumps({"handoff": 3, "leading": 3}).encode() + b"\n")
        answering = asyncio.create_task(server.handoff(1.5, timeout_s=10, answer_s=0))
        asked = json.loads(await reader.readline())
        assert asked == {"handoff": 4, "hold_s": 1.5, "timeout_s": 10}
        silent.write(json.dumps({"handoff": 4, "leading": "many"}).encode() + b"\n")
        silent.write(json.dumps({"handoff": 4, "leading": 2}).encode() + b"\n")
        assert await answering == {1: 3, 2: 2}
        assert workers.down[-1] == 0  # (no answer cost a worker its connection)
    finally:
        following.cancel()
        if silent is not None:
            silent.close()
        await server.stop()
