"""The broker's event loop never blocks on a log: each round's log writes (pwritev, segment
rolls) and their fdatasync run in the I/O threads (Python ones, or for a write that rolls no
segment, `laminar.log._disk`'s threads without the GIL), and what they wrote becomes part of
the log (readable, applied) only once written. A storage failure there stops the broker as
one on the loop did; nothing changes a log while a round's writes are in flight."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from laminar.client import AsyncClient, Record
from laminar.log import encode_batch
from laminar.log.batch import Buffer
from laminar.log.config import LogConfig
from laminar.log.errors import AppendInProgressError
from laminar.log.segmented_log import SegmentedLog
from laminar.log.storage import DirectWrite, FileDirectory, FileStorage
from laminar.log.store import STORE_HEADER_BYTES
from laminar.node.core import Round
from laminar.raft.log_storage import LogStorage
from laminar.raft.messages import ConfState, Entry
from laminar.server.api import Api
from laminar.server.config import BrokerConfig, new_secret
from laminar.server.metrics import BrokerMetrics
from laminar.server.node import Broker

BATCHES = 40
RECORDS_PER_BATCH = 10
VALUE_BYTES = 1_000
SEGMENT_BYTES = 64 << 10  # rolls every ~6 batches
WAIT_S = 30.0


def config(path: Path) -> BrokerConfig:
    return BrokerConfig(
        "n1",
        path,
        host="127.0.0.1",
        api_port=0,
        peer_port=0,
        gossip_port=0,
        secret=new_secret(),
        allow_anonymous=True,
        segment_bytes=SEGMENT_BYTES,
    )


async def test_the_event_loop_never_writes_or_syncs_a_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real broker (in this process, its API on loopback) takes appends that roll its
    segments: every batch written to a segment's store, every fdatasync of one, ran in an
    I/O thread, and every record reads back."""
    loop_thread = threading.current_thread()
    calls: list[tuple[str, str, int, bool]] = []  # (what, file, position, on the loop)
    write, sync, direct = FileStorage.write, FileStorage.sync, FileStorage.direct

    def recorded_write(self: FileStorage, position: int, parts: Sequence[Buffer]) -> None:
        calls.append(("write", self.name, position, threading.current_thread() is loop_thread))
        write(self, position, parts)

    def recorded_sync(self: FileStorage) -> None:
        calls.append(("sync", self.name, 0, threading.current_thread() is loop_thread))
        sync(self)

    def recorded_direct(
        self: FileStorage, writes: Sequence[tuple[int, Sequence[Buffer]]], **kwargs: Any
    ) -> DirectWrite | None:
        job = direct(self, writes, **kwargs)
        if job is not None:  # handed to the threads without the GIL (laminar.log._disk)
            calls.extend(("write", self.name, position, False) for position, _ in writes)
            if job.sync:
                calls.append(("sync", self.name, 0, False))
        return job

    monkeypatch.setattr(FileStorage, "write", recorded_write)
    monkeypatch.setattr(FileStorage, "sync", recorded_sync)
    monkeypatch.setattr(FileStorage, "direct", recorded_direct)
    broker = Broker(config(tmp_path / "n1"))
    api = Api(broker, BrokerMetrics(broker))
    async with TestClient(TestServer(api.app(), host="127.0.0.1")) as http:
        broker.set_api_addr(f"{http.host}:{http.port}")
        await broker.start()
        try:
            async with AsyncClient([f"http://{http.host}:{http.port}"]) as client:
                await client.create_topic("t", 1, 1)
                await client.wait_for_leaders("t", timeout_s=WAIT_S)
                first = await client.append("t", 0, [Record(value=b"first")])
                calls.clear()  # the replica is hosted (its files made on the loop)
                for batch in range(BATCHES):
                    records = [
                        Record(value=f"{batch}.{i}".encode().ljust(VALUE_BYTES, b"."))
                        for i in range(RECORDS_PER_BATCH)
                    ]
                    await client.append("t", 0, records)
                values = []
                index = first.base_index + 1
                while index < first.base_index + 1 + BATCHES * RECORDS_PER_BATCH:
                    read = await client.read("t", 0, index, max_records=1_000)
                    assert read.records, f"nothing at {index}"
                    values += [r.value for r in read.records]
                    index = read.next_index
                served = list(calls)  # (closing the logs at the stop syncs them: not served)
        finally:
            await broker.stop(graceful=False)
    assert values[-1] == f"{BATCHES - 1}.9".encode().ljust(VALUE_BYTES, b".")
    assert len(values) == BATCHES * RECORDS_PER_BATCH
    replica_dir = tmp_path / "n1"
    stores = [p for p in replica_dir.rglob("*.log") if p.parent.name != "__cluster"]
    assert len(stores) >= 4  # the appends rolled segments
    logs = [c for c in served if c[1].endswith(".log")]
    batch_writes = [c for c in logs if c[0] == "write" and c[2] >= STORE_HEADER_BYTES]
    syncs = [c for c in logs if c[0] == "sync"]
    assert len(batch_writes) >= BATCHES and syncs
    on_loop = [c for c in logs if c[3]]
    assert on_loop == [], f"log I/O on the event loop: {on_loop[:5]}"


async def test_a_storage_failure_in_an_io_thread_stops_the_broker(tmp_path: Path) -> None:
    """The write fails in the I/O thread (a storage closed under it): the driver stops
    (fail-stop, as for a failure on the loop), and nothing of the failed write is part of
    the log."""
    broker = Broker(config(tmp_path / "n1"))
    directory = FileDirectory(str(tmp_path / "log"))
    storage = LogStorage(
        directory, SegmentedLog.open(directory, LogConfig()), conf=ConfState(("n1",))
    )
    data = encode_batch([Record(value=b"x")])
    storage.write_later([Entry(0, 1, 1, data)])
    store = storage.log._segments[-1].store.storage  # (the test breaks it on purpose)
    assert isinstance(store, FileStorage)
    store.close()  # a closed storage: the thread's write fails (it is never opened again)
    failed_in: list[str] = []
    flush = storage.flush(sync=True)
    run = flush.run

    def failing_run() -> None:
        failed_in.append(threading.current_thread().name)
        run()

    flush.run = failing_run  # type: ignore[method-assign]
    rounds = 0

    def begin() -> Round | None:
        nonlocal rounds
        rounds += 1
        return Round({}, syncs=[flush]) if rounds == 1 else None

    stored: list[Round] = []
    broker.core.begin = begin  # type: ignore[method-assign]
    broker.core.stored = stored.append  # type: ignore[method-assign]
    broker.wake()
    await asyncio.wait_for(broker._drive(), WAIT_S)  # returns: it does not go on
    assert broker.failed.is_set() and rounds == 1
    assert failed_in and failed_in[0].startswith("fsync-n1")
    assert stored == [] and storage.last_index() == -1
    with pytest.raises(AppendInProgressError):  # nothing more is written to it
        storage.log.append(data, term=1)


async def test_removed_replicas_are_collected_only_between_rounds(tmp_path: Path) -> None:
    """A collection asked for while a round's writes are in flight (they may be writing the
    replica it would drop) runs at the end of that round."""
    broker = Broker(config(tmp_path / "n1"))
    release = threading.Event()
    started = threading.Event()

    class Blocking:
        syncs = True

        def job(self) -> object:
            return self.run

        def run(self) -> None:
            started.set()
            release.wait(WAIT_S)

        def publish(self) -> None:
            pass

    rounds = 0

    def begin() -> Round | None:
        nonlocal rounds
        rounds += 1
        return Round({}, syncs=[Blocking()]) if rounds == 1 else None  # type: ignore[list-item]

    collected: list[object] = []
    broker.core.begin = begin  # type: ignore[method-assign]
    broker.core.collect_removed = lambda leaders: collected.append(leaders) or []  # type: ignore[method-assign]
    broker.wake()
    driving = asyncio.create_task(broker._drive())
    loop = asyncio.get_running_loop()
    assert await loop.run_in_executor(None, started.wait, WAIT_S)
    assert broker.collect_removed({}) == []
    assert collected == []  # not while the round's writes run
    release.set()
    deadline = loop.time() + WAIT_S
    while not collected and loop.time() < deadline:
        await asyncio.sleep(0.01)
    assert collected == [{}]
    broker.core.stopping = True
    broker.wake()
    await asyncio.wait_for(driving, WAIT_S)
    assert broker.collect_removed({}) == [] and len(collected) == 2  # between rounds: at once
