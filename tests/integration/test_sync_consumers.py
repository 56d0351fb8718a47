"""The blocking consumers (laminar.client.sync_consumers) against real brokers.

`SyncConsumer`: reads every partition in order, seeks, counts in `positions()` only what it
handed out (not what it read ahead), ends at the end (`stop_at_end`), or after
`consumer_timeout_ms` without a record and goes on at the next `for`. `SyncGroupConsumer`: two
consumers in two threads share a queue exactly once; settling from a loop accepts, releases
(the message comes again) and rejects (to `<topic>.dlq`, as the asyncio consumer does); `run`
calls plain handlers in threads and accepts, rejects or releases (`Retry`) by what they do;
`close()` waits for the handler under way and releases what is held, also when a handler asks
for it. Ctrl-C, in a real process: the iteration or `run` ends, the consumer is closed (held
messages released, the handler under way finished and accepted), and KeyboardInterrupt reaches
the program; `close()` from a SIGTERM handler (docs/client.md) ends `run` the same way."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from laminar.client import (
    Client,
    NotFound,
    Retry,
    SyncDelivery,
    SyncGroupConsumer,
)
from laminar.local_cluster import LocalCluster

from .conftest import WAIT_S, interruptible

pytestmark = pytest.mark.integration

#: how long one script of the Ctrl-C tests may take to start, consume and end
SCRIPT_TIMEOUT_S = 120.0


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def poll(what: str, check: Callable[[], object], timeout_s: float = WAIT_S) -> None:
    """Call `check` until it returns True (bounded in time)."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        last = check()
        if last is True:
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


@pytest.fixture
def client(cluster3: LocalCluster) -> Iterator[Client]:
    with Client(cluster3.urls, token=cluster3.token, timeout_s=20) as client:
        yield client


def new_topic(client: Client, prefix: str, partitions: int) -> str:
    name = unique(prefix)
    client.create_topic(name, partitions=partitions, replication_factor=3)
    client.wait_for_leaders(name)
    return name


def group_totals(client: Client, topic: str, group: str) -> Counter[str]:
    totals: Counter[str] = Counter()
    for partition in range(client.describe_topic(topic).partitions):
        described = client.describe_group(topic, partition, group)
        totals.update(
            accepted=described.accepted,
            acquired=described.acquired,
            pending=described.pending,
            dead=described.dead_lettered,
            dead_pending=described.dead_letter_pending,
        )
    return +totals  # (zero counts dropped)


def totals_become(client: Client, topic: str, group: str, expected: dict[str, int]) -> bool:
    """Wait until the group's totals over every partition are `expected` (a dead letter is
    moved a moment after its reject); True then."""

    def check() -> object:
        totals = group_totals(client, topic, group)
        return True if totals == expected else totals

    poll(f"{group}'s totals {expected}", check)
    return True


def dead_letters(client: Client, topic: str) -> dict[bytes, str]:
    """value -> reason of every record of `<topic>.dlq`."""
    found: dict[bytes, str] = {}
    for partition in range(client.describe_topic(topic).partitions):
        for record in client.read(f"{topic}.dlq", partition, None, max_records=1000).records:
            found[record.value or b""] = dict(record.headers)["laminar.dlq.reason"].decode()
    return found


# ---------------------------------------------------------------------------- SyncConsumer


def test_the_sync_consumer_reads_seeks_and_ends(client: Client) -> None:
    topic = new_topic(client, "log", 2)
    firsts = {}
    for partition in (0, 1):
        values = [f"p{partition}-{n}".encode() for n in range(300)]
        metas = client.produce(topic, values, partition=partition)
        firsts[partition] = metas[0].index
    ends = {p: first + 300 for p, first in firsts.items()}

    with client.consumer(topic, stop_at_end=True) as consumer:
        assert consumer.partitions == [0, 1]
        client.produce(topic, [b"after the start"], partition=0)  # past its end: not read
        got = list(consumer)  # every record up to the commit indexes at the start: the end
        by_partition = {p: [r for q, r in got if q == p] for p in (0, 1)}
        for p, records in by_partition.items():
            assert [r.index for r in records] == list(range(firsts[p], ends[p]))
            assert [r.value for r in records] == [f"p{p}-{n}".encode() for n in range(300)]
        assert consumer.positions() == ends

        # one record handed out after a seek: positions() counts it, not what was read ahead
        consumer.seek(0, firsts[0] + 100)
        partition, record = next(consumer)
        assert (partition, record.index, record.value) == (0, firsts[0] + 100, b"p0-100")
        assert consumer.positions() == {0: firsts[0] + 101, 1: ends[1]}
        consumer.seek(0, firsts[0] + 250)  # drops what it read ahead of partition 0
        assert [r.value for _, r in consumer] == [f"p0-{n}".encode() for n in range(250, 300)]
    assert consumer.closed
    assert list(consumer) == []  # closed: iteration ends at once

    # consumer_timeout_ms: a `for` ends once nothing came for that long (here, nothing is
    # there), and a later `for` goes on where the last one stopped
    client.produce(topic, [b"later"], partition=1)
    with client.consumer(topic, [1], start={1: ends[1] + 1}, consumer_timeout_ms=200) as idle:
        assert list(idle) == []
        assert idle.positions() == {1: ends[1] + 1}
    with client.consumer(topic, [1], start={1: ends[1]}, consumer_timeout_ms=0) as only_1:
        assert only_1.partitions == [1]
        poll("the record at the start", lambda: [r.value for _, r in only_1] == [b"later"])


def test_the_sync_consumer_raises_what_the_broker_refuses(client: Client) -> None:
    with pytest.raises(NotFound):
        client.consumer(unique("missing")).start()
    with pytest.raises(ValueError, match="consumer_timeout_ms"):
        client.consumer("orders", consumer_timeout_ms=-1)
    with pytest.raises(ValueError, match="start"):
        client.consumer("orders", start="newest")


# ---------------------------------------------------------------------------- SyncGroupConsumer


def test_two_sync_group_consumers_in_threads_share_the_queue_exactly_once(
    client: Client,
) -> None:
    topic, group, count = new_topic(client, "shared", 3), "workers", 300
    client.produce(topic, [f"job-{n}".encode() for n in range(count)])
    seen: Counter[bytes] = Counter()
    by_consumer: Counter[str] = Counter()
    lock = threading.Lock()
    all_seen = threading.Event()
    # each consumer holds its first message until the other has one too: both get some
    both_started = threading.Barrier(2, timeout=WAIT_S)
    errors: list[BaseException] = []
    queues = [client.group_consumer(topic, group, max_in_flight=10) for _ in range(2)]

    def work(queue: SyncGroupConsumer) -> None:
        try:
            for number, delivery in enumerate(queue):
                if number == 0:
                    both_started.wait()
                assert delivery.accept() is True
                with lock:
                    seen[delivery.value or b""] += 1
                    by_consumer[queue.consumer] += 1
                    if sum(seen.values()) >= count:
                        all_seen.set()
        except BaseException as e:
            errors.append(e)
            all_seen.set()

    threads = [threading.Thread(target=work, args=(queue,)) for queue in queues]
    for thread in threads:
        thread.start()
    try:
        assert all_seen.wait(WAIT_S * 2), f"{sum(seen.values())} of {count} seen"
    finally:
        for queue in queues:
            queue.close()  # from this thread: their iterations end
        for thread in threads:
            thread.join(WAIT_S)
    assert not errors, errors
    assert not any(thread.is_alive() for thread in threads)
    assert len({queue.consumer for queue in queues}) == 2
    assert sorted(seen) == sorted(f"job-{n}".encode() for n in range(count))
    assert max(seen.values()) == 1, seen.most_common(3)
    assert sorted(by_consumer) == sorted(queue.consumer for queue in queues)  # both worked
    assert all(queue.in_flight == 0 for queue in queues)
    assert totals_become(client, topic, group, {"accepted": count})


def test_settling_from_a_loop_accepts_releases_and_rejects_to_the_dlq(client: Client) -> None:
    topic, group = new_topic(client, "settle", 1), "settlers"
    client.produce(topic, [b"good", b"again", b"poison"])
    got: list[tuple[bytes | None, int]] = []
    with client.group_consumer(topic, group, limit=4) as queue:
        for delivery in queue:  # `limit`: ends after the 4th delivery
            assert isinstance(delivery, SyncDelivery) and delivery.state == "held"
            got.append((delivery.value, delivery.deliveries))
            if delivery.value == b"again" and delivery.deliveries == 1:
                assert delivery.release() is True
            elif delivery.value == b"poison":
                assert delivery.reject("unparseable") is True
            else:
                assert delivery.accept() is True
            assert delivery.settled
            with pytest.raises(RuntimeError, match="already"):
                delivery.accept()
    assert sorted(got) == [(b"again", 1), (b"again", 2), (b"good", 1), (b"poison", 1)]
    assert totals_become(client, topic, group, {"accepted": 2, "dead": 1})
    assert dead_letters(client, topic) == {b"poison": "unparseable"}


def test_run_calls_plain_handlers_in_threads(client: Client) -> None:
    topic, group, count = new_topic(client, "run", 2), "runners", 60
    client.produce(topic, [f"job-{n}".encode() for n in range(count)] + [b"retry"])
    bad = {f"job-{n}".encode() for n in range(3, count, 10)}
    handled: Counter[bytes] = Counter()
    threads: set[str] = set()
    lock = threading.Lock()
    queue = client.group_consumer(topic, group, batch=5)

    def handle(delivery: SyncDelivery) -> None:
        value = delivery.value or b""
        with lock:
            handled[value] += 1
            threads.add(threading.current_thread().name)
            if sum(handled.values()) == count + 2:  # the retried one comes twice
                queue.close()  # from a handler: begins closing, returns at once
        if value in bad:
            raise ValueError(f"cannot run {value.decode()}")
        if value == b"retry" and delivery.deliveries == 1:
            raise Retry

    with queue:
        runner = threading.Thread(target=queue.run, args=(handle,), kwargs={"concurrency": 4})
        runner.start()
        runner.join(WAIT_S * 2)
        assert not runner.is_alive(), f"run did not end: {sum(handled.values())} handled"
    assert queue.closed
    assert handled[b"retry"] == 2 and all(handled[f"job-{n}".encode()] == 1 for n in range(count))
    assert threads and all(name.startswith(f"laminar-{group}") for name in threads)
    assert totals_become(client, topic, group, {"accepted": count + 1 - len(bad), "dead": len(bad)})
    letters = dead_letters(client, topic)
    assert set(letters) == bad
    assert all(reason.startswith("ValueError: cannot run job-") for reason in letters.values())


def test_close_waits_for_the_handler_under_way_and_releases_what_is_held(
    client: Client,
) -> None:
    topic, group = new_topic(client, "close", 1), "closers"
    client.produce(topic, [f"job-{n}".encode() for n in range(5)])
    queue = client.group_consumer(topic, group, batch=5)
    started = threading.Event()
    finished: list[bool] = []

    def handle(delivery: SyncDelivery) -> None:
        started.set()
        finished.append(queue.stopping.wait(WAIT_S))  # returns only once close() began

    with queue:
        runner = threading.Thread(target=queue.run, args=(handle,))
        runner.start()
        assert started.wait(WAIT_S)
        poll("all five held", lambda: queue.in_flight == 5)
        queue.close()  # waits for the handler, accepts its message, releases the others
        assert finished == [True]
        runner.join(WAIT_S)
        assert not runner.is_alive()
    assert totals_become(client, topic, group, {"accepted": 1, "pending": 4})

    # iterating: a delivery not settled is released by close()
    with client.group_consumer(topic, group) as again:
        delivery = next(again)
        assert delivery.deliveries == 2  # released once already
    assert again.closed
    assert totals_become(client, topic, group, {"accepted": 1, "pending": 4})


# ---------------------------------------------------------------------------- Ctrl-C

SCRIPT = """
import signal
import sys
import threading
import time

from laminar.client import Client

url, token, topic, mode = sys.argv[1:]


def announce_waiting():
    # Print "waiting" once the main thread is inside the consumer's next(): a signal sent
    # then lands there, not in the loop's body (bounded: 60 s).
    main = threading.main_thread().ident
    for _ in range(6000):
        frame = sys._current_frames().get(main)
        while frame is not None:
            code = frame.f_code
            if code.co_name == "__next__" and code.co_filename.endswith("sync_consumers.py"):
                print("waiting", flush=True)
                return
            frame = frame.f_back
        time.sleep(0.01)


with Client([url], token=token) as client:
    if mode == "log":
        consumer = client.consumer(topic)
    else:
        consumer = client.group_consumer(topic, "ctrl-c")
    try:  # no `with consumer`: what closes it on Ctrl-C is the consumer itself
        if mode in ("run", "sigterm"):
            if mode == "sigterm":  # docs/client.md's way to stop on SIGTERM
                signal.signal(signal.SIGTERM, lambda signum, frame: consumer.close())

            def handle(delivery):
                print(delivery.value.decode(), flush=True)  # (run waits: signal it now)
                consumer.stopping.wait(60)  # finishes once the close began

            consumer.run(handle, concurrency=2)
            print("stopped, closed:", consumer.closed, flush=True)
        else:
            for item in consumer:  # held, not settled: released by the close
                value = item[1].value if mode == "log" else item.value
                print(value.decode(), flush=True)
                threading.Thread(target=announce_waiting, daemon=True).start()
    except KeyboardInterrupt:
        print("interrupted, closed:", consumer.closed, flush=True)
"""


def interrupt(
    cluster: LocalCluster, script: Path, topic: str, mode: str, signum: int, ready: int
) -> list[str]:
    """Run the script on `topic`; once it printed `ready` lines (the message, and "waiting"
    where it announces that), signal it; return its output."""
    process = subprocess.Popen(
        [sys.executable, str(script), cluster.urls[0], cluster.token, topic, mode],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=interruptible,
    )  # fmt: skip
    assert process.stdout is not None
    try:
        first = [process.stdout.readline() for _ in range(ready)]
        assert all(first), process.communicate(timeout=SCRIPT_TIMEOUT_S)[1]
        process.send_signal(signum)
        rest, errors = process.communicate(timeout=SCRIPT_TIMEOUT_S)
    finally:
        if process.returncode is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, errors
    return [line.rstrip("\n") for line in first] + rest.splitlines()


@pytest.mark.parametrize("mode", ["log", "iterate", "run", "sigterm"])
def test_ctrl_c_ends_the_loop_and_closes(
    mode: str, cluster3: LocalCluster, client: Client, tmp_path: Path
) -> None:
    topic = new_topic(client, f"ctrl-c-{mode}", 1)
    client.produce(topic, [b"the-message"])
    script = tmp_path / "consume.py"
    script.write_text(SCRIPT)
    signum, expected = signal.SIGINT, ["the-message", "waiting", "interrupted, closed: True"]
    if mode == "run":  # run() waits from the start: no "waiting" to wait for
        expected.remove("waiting")
    if mode == "sigterm":  # close() from a SIGTERM handler: run returns
        signum, expected = signal.SIGTERM, ["the-message", "stopped, closed: True"]
    assert interrupt(cluster3, script, topic, mode, signum, len(expected) - 1) == expected
    if mode == "iterate":  # handed out, never settled: released
        assert totals_become(client, topic, "ctrl-c", {"pending": 1})
    elif mode in ("run", "sigterm"):  # the handler under way finished: accepted
        assert totals_become(client, topic, "ctrl-c", {"accepted": 1})
