"""The local feed between a broker's workers (docs/workers.md).

Worker 0 runs the broker's SWIM member; the others see the cluster's members through it. Each
other worker connects to worker 0's Unix socket (`<data dir>/workers.sock`, mode 600), says
which worker it is, and is sent the member table at once, with the members already gone as
events (`laminar.workers.standing_events`), then again with every membership event SWIM
reports. Lines of JSON, one message each.

Worker 0 counts a worker up while its connection is open: a worker that exits, however it
exits, closes it, and worker 0 at once advertises it down (`Member.workers_down`), so that
the groups it led elect new leaders without waiting for a timeout. A worker keeps the last
table it was sent while worker 0 is away, and connects again.

Worker 0 also asks the others for their metrics (`FeedServer.scrape`, for its `/metrics`):
`{"scrape": n}` down the feed, answered `{"scrape": n, "text": <OpenMetrics text>}` up it.
And it asks them to hand their leaderships over when the broker is told to (`FeedServer.handoff`,
for `POST /v1/nodes/{broker}/handoff`, a pod's preStop): `{"handoff": n, "hold_s": s,
"timeout_s": t}`, answered `{"handoff": n, "leading": k}` once the worker has moved what it
could within t seconds. So a broker hands over
every worker's leaderships without its client reaching the workers' own addresses (the peer
Service's names, which a deleted cluster's pods lose first).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, TypeGuard

from ..swim import Addresses, EventKind, Member, MembershipEvent, MemberState, MemberStatus
from ..workers import standing_events

log = logging.getLogger(__name__)
SOCKET_NAME = "workers.sock"
#: the longest path a Unix socket can have (sun_path, with its terminating NUL)
MAX_SOCKET_PATH_BYTES = 107
HELLO_TIMEOUT_S = 5.0
RECONNECT_S = 0.2
#: a worker that lets this much of the feed pile up unread is cut off (it reconnects)
MAX_BUFFERED_BYTES = 4 << 20
MAX_LINE_BYTES = 16 << 20
#: how long worker 0 waits for the other workers' metrics (a worker that does not answer in
#: time is left out of that scrape)
SCRAPE_TIMEOUT_S = 2.0
#: what worker 0 asks of the others, each answered with a field of a type
_ANSWERS: dict[str, tuple[str, type]] = {"scrape": ("text", str), "handoff": ("leading", int)}


class FeedError(Exception):
    pass


def _seconds(value: object) -> TypeGuard[float]:
    """Whether `value` (from a feed line) is a duration: a finite number ≥ 0, not a bool."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and 0 <= value < float("inf")
    )


def socket_path(data_dir: Path) -> Path:
    path = data_dir / SOCKET_NAME
    if len(os.fsencode(path)) > MAX_SOCKET_PATH_BYTES:
        raise FeedError(
            f"the workers' socket {path} is longer than a Unix socket path may be "
            f"({MAX_SOCKET_PATH_BYTES} bytes): use a shorter --data-dir"
        )
    return path


# ---- the messages --------------------------------------------------------------------------


def _state(state: MemberState) -> dict[str, Any]:
    m = state.member
    return {
        "id": m.id,
        "api": m.addresses.api,
        "peer": m.addresses.peer,
        "gossip": m.addresses.gossip,
        "weight": m.weight,
        "leaving": m.leaving,
        "epoch": m.epoch,
        "workers": m.workers,
        "workers_down": m.workers_down,
        "status": int(state.status),
        "incarnation": state.incarnation,
    }


def _parse_state(raw: dict[str, Any]) -> MemberState:
    member = Member(
        raw["id"],
        Addresses(raw["api"], raw["peer"], raw["gossip"]),
        raw["weight"],
        raw["leaving"],
        raw["epoch"],
        raw["workers"],
        raw["workers_down"],
    )
    return MemberState(member, MemberStatus(raw["status"]), raw["incarnation"])


def encode(states: Iterable[MemberState], events: Iterable[MembershipEvent]) -> bytes:
    message = {
        "members": [_state(s) for s in states],
        "events": [
            {"kind": e.kind.value, "state": _state(e.state), "at_ms": e.at_ms} for e in events
        ],
    }
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> tuple[list[MemberState], list[MembershipEvent]]:
    """A feed message (FeedError: not one)."""
    return _members(_object(line))


def _object(line: bytes) -> dict[str, Any]:
    try:
        raw = json.loads(line)
    except ValueError as e:
        raise FeedError(f"not JSON: {e}") from None
    if not isinstance(raw, dict):
        raise FeedError("not a JSON object")
    return raw


def _members(raw: dict[str, Any]) -> tuple[list[MemberState], list[MembershipEvent]]:
    try:
        states = [_parse_state(s) for s in raw["members"]]
        events = [
            MembershipEvent(EventKind(e["kind"]), _parse_state(e["state"]), e["at_ms"])
            for e in raw["events"]
        ]
    except (ValueError, KeyError, TypeError) as e:
        raise FeedError(f"not a feed message: {e}") from None
    return states, events


# ---- worker 0 ------------------------------------------------------------------------------


class FeedServer:
    """Worker 0's side: serves the member table to the other workers and tells
    `on_workers` the mask of those not connected whenever it changes."""

    def __init__(
        self,
        data_dir: Path,
        workers: int,
        table: Callable[[], list[MemberState]],
        on_workers: Callable[[int], None],
    ) -> None:
        self.path = socket_path(data_dir)
        self.workers = workers
        self._table = table
        self._on_workers = on_workers
        self._writers: dict[int, asyncio.StreamWriter] = {}
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        #: what was asked and awaits an answer: (worker, kind, number) -> the answer
        self._waiting: dict[tuple[int, str, int], asyncio.Future[Any]] = {}
        self._asked = 0

    @property
    def down(self) -> int:
        """The bit mask of the workers not connected (worker 0 never is)."""
        return sum(1 << w for w in range(1, self.workers) if w not in self._writers)

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a socket a previous run left
        self._server = await asyncio.start_unix_server(
            self._serve, path=str(self.path), limit=MAX_LINE_BYTES
        )
        os.chmod(self.path, 0o600)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers.values()):
            writer.close()  # (each connection's task then sees the end of its stream)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=HELLO_TIMEOUT_S)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def publish(self, events: Iterable[MembershipEvent] = ()) -> None:
        """Send every connected worker the table and `events`."""
        if not self._writers:
            return
        line = encode(self._table(), events)
        for worker, writer in list(self._writers.items()):
            if writer.transport.get_write_buffer_size() > MAX_BUFFERED_BYTES:
                log.warning("worker %d does not read its feed: cut off", worker)
                writer.close()
                continue
            writer.write(line)

    async def scrape(self, timeout_s: float = SCRAPE_TIMEOUT_S) -> dict[int, str]:
        """Each connected worker's metrics (OpenMetrics text), by worker index; those that do
        not answer within `timeout_s` are left out."""
        return await self._ask("scrape", {}, timeout_s)

    async def handoff(
        self, hold_s: float | None, timeout_s: float, *, answer_s: float
    ) -> dict[int, int]:
        """Each connected worker hands its leaderships over within `timeout_s`
        (`Broker.hand_off_leaderships`, leaving for `hold_s` after it if not stopping): how
        many groups each still leads, by worker index; those that do not answer within
        `timeout_s` + `answer_s` are left out."""
        fields = {"hold_s": hold_s, "timeout_s": timeout_s}
        return await self._ask("handoff", fields, timeout_s + answer_s)

    async def _ask(self, kind: str, fields: dict[str, Any], timeout_s: float) -> dict[int, Any]:
        """Send `kind` (numbered, with `fields`) to every connected worker; their answers, by
        worker index, as far as they came within `timeout_s` (the others are logged)."""
        self._asked += 1
        number = self._asked
        waiting: dict[int, asyncio.Future[Any]] = {}
        loop = asyncio.get_running_loop()
        line = json.dumps({kind: number, **fields}).encode() + b"\n"
        for worker, writer in list(self._writers.items()):
            waiting[worker] = self._waiting[(worker, kind, number)] = loop.create_future()
            writer.write(line)
        try:
            if waiting:
                await asyncio.wait(list(waiting.values()), timeout=timeout_s)
        finally:
            for worker in waiting:
                self._waiting.pop((worker, kind, number), None)
        out = {w: f.result() for w, f in waiting.items() if f.done() and not f.cancelled()}
        late = sorted(set(waiting) - set(out))
        if late:
            log.warning("workers %s did not answer %s %d in time", late, kind, number)
        return out

    def _answered(self, worker: int, line: bytes) -> None:
        """A line from `worker`: the answer to a scrape or a handoff. Anything else is logged
        and dropped, never the connection (that would count the worker down, and move its
        leaderships)."""
        try:
            raw = json.loads(line)
            kind = next(k for k in _ANSWERS if k in raw)
            field, field_type = _ANSWERS[kind]
            number, value = raw[kind], raw[field]
            if not isinstance(number, int) or not isinstance(value, field_type):
                raise TypeError(f"{kind} must be a number and {field} a {field_type.__name__}")
        except (ValueError, KeyError, TypeError, StopIteration) as e:
            log.warning("worker %d sent what answers nothing asked: %r", worker, e)
            return
        waiting = self._waiting.get((worker, kind, number))
        if waiting is not None and not waiting.done():
            waiting.set_result(value)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        worker = None
        try:
            hello = await asyncio.wait_for(reader.readline(), HELLO_TIMEOUT_S)
            worker = json.loads(hello)["worker"]
            if not isinstance(worker, int) or not 1 <= worker < self.workers:
                raise FeedError(f"no worker {worker!r} here")
            previous = self._writers.get(worker)
            if previous is not None:
                previous.close()  # a restarted worker replaces the connection it left
            self._writers[worker] = writer
            table = self._table()
            writer.write(encode(table, standing_events(table, _now_ms())))
            log.info("worker %d connected", worker)
            self._on_workers(self.down)
            while line := await reader.readline():  # (until it closes)
                self._answered(worker, line)
        except (OSError, ValueError, KeyError, TypeError, FeedError, TimeoutError) as e:
            log.warning("a worker's feed connection failed: %s", e)
        finally:
            self._tasks.discard(task)
            writer.close()
            if worker is not None and self._writers.get(worker) is writer:
                del self._writers[worker]
                log.warning("worker %d disconnected", worker)
                self._on_workers(self.down)


# ---- the other workers ---------------------------------------------------------------------


class FeedClient:
    """Worker w's side: follows worker 0's member table (kept while worker 0 is away)."""

    def __init__(
        self,
        data_dir: Path,
        worker: int,
        on_table: Callable[[list[MemberState]], None],
        on_event: Callable[[MembershipEvent], None],
        metrics: Callable[[], str],
        handoff: Callable[[float | None, float], Awaitable[int]] | None = None,
    ) -> None:
        self.path = socket_path(data_dir)
        self.worker = worker
        self._on_table = on_table
        self._on_event = on_event
        #: this worker's metrics, OpenMetrics text (sent when worker 0 scrapes)
        self._metrics = metrics
        #: hands this worker's leaderships over (leaving for a hold, in seconds, if given)
        #: within a timeout in seconds; how many groups it still leads
        self._handoff = handoff
        self._handoffs: set[asyncio.Task[None]] = set()
        #: set once the first table arrived
        self.ready = asyncio.Event()

    async def run(self) -> None:
        """Follow the feed until cancelled, connecting again whenever it closes."""
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(
                    str(self.path), limit=MAX_LINE_BYTES
                )
            except OSError:
                await asyncio.sleep(RECONNECT_S)
                continue
            try:
                writer.write(json.dumps({"worker": self.worker}).encode() + b"\n")
                while line := await reader.readline():
                    message = _object(line)
                    if "scrape" in message:
                        answer = {"scrape": message["scrape"], "text": self._rendered()}
                        writer.write(json.dumps(answer).encode() + b"\n")
                        continue
                    if "handoff" in message:  # (its own task: the feed goes on meanwhile)
                        task = asyncio.create_task(self._hand_off(message, writer))
                        self._handoffs.add(task)
                        task.add_done_callback(self._handoffs.discard)
                        continue
                    states, events = _members(message)
                    self._on_table(states)
                    for event in events:
                        self._on_event(event)
                    self.ready.set()
            except (OSError, FeedError, ValueError) as e:
                log.warning("worker %d's feed: %s", self.worker, e)
            finally:
                writer.close()
            await asyncio.sleep(RECONNECT_S)

    async def _hand_off(self, message: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        """Worker 0's `{"handoff": n, "hold_s": s, "timeout_s": t}`: hand over, then answer
        how many groups this worker still leads (on the connection it came by, if still open).
        """
        number, hold_s = message["handoff"], message.get("hold_s")
        timeout_s = message.get("timeout_s")
        if self._handoff is None or not isinstance(number, int):
            return
        if not _seconds(hold_s):
            hold_s = None
        if not _seconds(timeout_s):
            log.warning("worker %d: a handoff without a valid timeout_s: %r", self.worker, message)
            return
        try:
            leading = await self._handoff(hold_s, timeout_s)
        except Exception:
            log.exception("worker %d could not hand its leaderships over", self.worker)
            return
        if not writer.is_closing():
            writer.write(json.dumps({"handoff": number, "leading": leading}).encode() + b"\n")

    def _rendered(self) -> str:
        """This worker's metrics; a failure to render them is logged and sends none (it must
        not end the feed, which tells worker 0 this worker runs)."""
        try:
            return self._metrics()
        except Exception:
            log.exception("worker %d could not render its metrics", self.worker)
            return "# EOF\n"


def _now_ms() -> int:
    return int(asyncio.get_running_loop().time() * 1000)
