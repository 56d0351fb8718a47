"""A broker's handoff reaches every worker over the local feed (docs/workers.md): worker 0
asks the others (a real Unix socket) and adds up what each still leads; a worker that does
not answer in time is left out; a worker's handoff does not hold up its feed."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from laminar.server.worker_feed import FeedClient, FeedServer, socket_path


async def test_worker_0_asks_the_others_to_hand_over_and_hears_how_many_groups_each_leads(
    tmp_path: Path,
) -> None:
    down: list[int] = []
    changed = asyncio.Event()

    def on_workers(mask: int) -> None:
        down.append(mask)
        changed.set()

    async def until_down(mask: int) -> None:
        while not down or down[-1] != mask:
            changed.clear()
            await asyncio.wait_for(changed.wait(), 10)

    holds: list[float | None] = []
    release = asyncio.Event()

    async def handoff(hold_s: float | None) -> int:
        holds.append(hold_s)
        await release.wait()  # (a handoff takes a while: the feed goes on meanwhile)
        return 3

    server = FeedServer(tmp_path, 3, lambda: [], on_workers)
    await server.start()
    client = FeedClient(
        tmp_path, 1, lambda table: None, lambda event: None, lambda: "# EOF\n", handoff
    )
    following = asyncio.create_task(client.run())
    silent = None
    try:
        await until_down(0b100)  # worker 1 connected
        handing = asyncio.create_task(server.handoff(60.0, timeout_s=10))
        # worker 1 is handing over: its feed still answers a scrape
        assert await server.scrape(timeout_s=10) == {1: "# EOF\n"}
        assert holds == [60.0] and not handing.done()
        release.set()
        assert await handing == {1: 3}
        # worker 2 connects and never answers: left out when the wait ends
        reader, silent = await asyncio.open_unix_connection(str(socket_path(tmp_path)))
        silent.write(json.dumps({"worker": 2}).encode() + b"\n")
        await until_down(0)
        assert await server.handoff(None, timeout_s=0.5) == {1: 3}
        assert holds == [60.0, None]
        asked: dict[str, object] = {}
        while "handoff" not in asked:  # (the member table comes first)
            asked = json.loads(await reader.readline())
        assert asked == {"handoff": 3, "hold_s": None}  # (asks are numbered with scrapes)
        # a late answer (to an ask that has ended), and one of the wrong type: both dropped
        silent.write(json.dumps({"handoff": 3, "leading": 3}).encode() + b"\n")
        answering = asyncio.create_task(server.handoff(1.5, timeout_s=10))
        asked = json.loads(await reader.readline())
        assert asked == {"handoff": 4, "hold_s": 1.5}
        silent.write(json.dumps({"handoff": 4, "leading": "many"}).encode() + b"\n")
        silent.write(json.dumps({"handoff": 4, "leading": 2}).encode() + b"\n")
        assert await answering == {1: 3, 2: 2}
        assert down[-1] == 0  # (no answer cost a worker its connection)
    finally:
        following.cancel()
        if silent is not None:
            silent.close()
        await server.stop()
