"""The asyncio UDP shell around the SWIM core: one socket, one timer, an event queue.

`SwimNode` binds a UDP socket, feeds every datagram to `Swim.receive`, ticks the core on a
short timer with `time.monotonic()` milliseconds (and the wall clock, which datagrams are
stamped with), sends whatever the core puts in its outbox and hands membership events to an
`asyncio.Queue` (and an optional callback). It resolves the host names members advertise,
both to send to them and so that the core can check that a datagram declaring a name came
from one of its addresses. All protocol decisions stay in the core.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import time
from collections.abc import Callable, Sequence

from ..swim.address import format_address, ip_of, parse_address
from ..swim.config import SwimConfig
from ..swim.core import DROP_EVENT_OVERFLOW, Swim
from ..swim.member import Addresses, Member, MembershipEvent, MemberState

__all__ = ["SwimNode", "format_address", "monotonic_ms", "parse_address", "wall_ms"]

log = logging.getLogger(__name__)

#: The core is ticked at least this often (sooner when its next timer is due sooner).
TICK_INTERVAL_MS = 50
#: Resolved host names are reused this long (to check senders: then refreshed in the
#: background while the old answer still counts).
DNS_CACHE_MS = 30_000
#: A declared sender's name whose answer did not include the source address (or did not
#: resolve) is looked up again at most this often: a restarted member may have a new address.
NAME_RECHECK_MS = 1_000
#: Host names of senders remembered; beyond it the oldest is forgotten.
MAX_SENDER_NAMES = 4096
#: Datagrams waiting for one host name to resolve; more are dropped.
MAX_PENDING_PER_HOST = 32
#: Bind addresses that are not addresses peers can send to.
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})
#: Drop reasons counted by the runtime (in the core's `dropped`).
DROP_OVERSIZED = "oversized"
DROP_UNRESOLVED = "unresolved"
DROP_SEND_ERROR = "send_error"


def _is_ip_literal(host: str) -> bool:
    return ip_of(host) is not None


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def wall_ms() -> int:
    """The wall clock in ms since the Unix epoch (what datagrams are stamped with)."""
    return time.time_ns() // 1_000_000


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, node: SwimNode) -> None:
        self._node = node

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self._node._on_datagram(data, addr)

    def error_received(self, exc: Exception) -> None:
        # ICMP errors (e.g. port unreachable after a peer died) are expected; SWIM copes.
        log.debug("gossip socket error: %s", exc)


class SwimNode:
    """A SWIM member on a UDP socket. Bind port 0 to get an ephemeral port; the gossip
    address advertised is `advertise_host` (default: the bind host) with the bound port."""

    def __init__(
        self,
        node_id: str,
        *,
        cluster_id: str,
        secret: bytes,
        seeds: Sequence[str] = (),
        bind_host: str = "127.0.0.1",
        bind_port: int = 0,
        advertise_host: str | None = None,
        api_addr: str = "",
        peer_addr: str = "",
        weight: int = 1,
        leaving: bool = False,
        workers: int = 1,
        workers_down: int = 0,
        config: SwimConfig | None = None,
        epoch: int | None = None,
        rng: random.Random | None = None,
        on_event: Callable[[MembershipEvent], None] | None = None,
        leave_linger_ms: int | None = None,
    ) -> None:
        self.config = config or SwimConfig()
        self.node_id = node_id
        self._cluster_id = cluster_id
        self._secret = secret
        self._seeds = list(seeds)
        self._bind = (bind_host, bind_port)
        self._advertise_host = advertise_host or bind_host
        if self._advertise_host in WILDCARD_HOSTS:
            raise ValueError("binding a wildcard address needs an advertise_host peers can reach")
        self._api_addr = api_addr
        self._peer_addr = peer_addr
        self._weight = weight
        self._leaving = leaving
        self._workers = (workers, workers_down)
        #: Wall-clock nanoseconds at start: larger than any earlier run's epoch.
        self.epoch = time.time_ns() if epoch is None else epoch
        self._rng = rng or random.Random()
        self._on_event = on_event
        self._leave_linger_ms = (
            3 * self.config.gossip_interval_ms if leave_linger_ms is None else leave_linger_ms
        )
        #: Membership events, bounded by config.max_pending_events (overflow is counted).
        self.events: asyncio.Queue[MembershipEvent] = asyncio.Queue(
            maxsize=self.config.max_pending_events
        )
        self._core: Swim | None = None
        self._transport: asyncio.DatagramTransport | None = None
        self._timer: asyncio.Task[None] | None = None
        self._family = socket.AF_INET
        self._resolved: dict[str, tuple[str, int]] = {}  # host -> (ip, expires_ms)
        self._pending: dict[str, list[tuple[int, bytes]]] = {}  # host -> [(port, datagram)]
        self._resolving: set[asyncio.Task[None]] = set()
        #: Senders' host names -> (their addresses, None if unresolvable; when looked up).
        self._names: dict[str, tuple[frozenset[str] | None, int]] = {}
        self._names_resolving: set[str] = set()
        self.gossip_addr = ""

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _Protocol(self), local_addr=self._bind
        )
        self._transport = transport
        sock = transport.get_extra_info("socket")
        self._family = sock.family
        host, port = sock.getsockname()[:2]
        self.gossip_addr = format_address(self._advertise_host, port)
        addresses = Addresses(
            api=self._api_addr or format_address(self._advertise_host, port),
            peer=self._peer_addr or format_address(self._advertise_host, port),
            gossip=self.gossip_addr,
        )
        me = Member(
            self.node_id, addresses, self._weight, self._leaving, self.epoch, *self._workers
        )
        try:
            self._core = Swim(
                self.config,
                me,
                self._seeds,
                self._rng,
                self._cluster_id,
                self._secret,
                check_host=self._check_host,
            )
        except ValueError:
            self.abort()
            raise
        log.info("swim %s listening on %s:%s (epoch %d)", self.node_id, host, port, self.epoch)
        self._core.tick(monotonic_ms(), wall_ms())
        self._flush()
        self._timer = asyncio.create_task(self._run_timer(), name=f"swim-{self.node_id}")
        self._timer.add_done_callback(self._timer_done)

    async def stop(self, *, leave: bool = True) -> None:
        """Leave (unless told not to), keep gossiping for the linger time so the news
        spreads, then close the socket. Safe to call more than once."""
        core = self._core
        if leave and core is not None and self._transport is not None and not core.has_left:
            core.leave(monotonic_ms(), wall_ms())
            self._flush()
            await asyncio.sleep(self._leave_linger_ms / 1000)
        self.abort()
        tasks = [task for task in (self._timer, *self._resolving) if task is not None]
        self._timer = None
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def abort(self) -> None:
        """Close the socket at once, without leaving (what a crash looks like to peers)."""
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        if self._timer is not None:
            self._timer.cancel()
        for task in list(self._resolving):
            task.cancel()

    # ---- the core's API --------------------------------------------------------------------

    @property
    def core(self) -> Swim:
        if self._core is None:
            raise RuntimeError("not started")
        return self._core

    @property
    def running(self) -> bool:
        return self._transport is not None

    def members(self) -> dict[str, MemberState]:
        return self.core.members()

    def member(self, member_id: str) -> Member | None:
        return self.core.member(member_id)

    def update_self(
        self,
        *,
        weight: int | None = None,
        leaving: bool | None = None,
        workers_down: int | None = None,
    ) -> None:
        self.core.update_self(weight=weight, leaving=leaving, workers_down=workers_down)
        self._flush()

    # ---- plumbing --------------------------------------------------------------------------

    async def _run_timer(self) -> None:
        while self._transport is not None:
            core = self.core
            now_ms = monotonic_ms()
            core.tick(now_ms, wall_ms())
            self._flush()
            delay_ms = min(TICK_INTERVAL_MS, max(0, core.next_tick_ms() - now_ms))
            await asyncio.sleep(delay_ms / 1000)

    def _timer_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("swim %s stopped ticking", self.node_id, exc_info=task.exception())

    def _on_datagram(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        core = self._core
        if core is None or self._transport is None:
            return
        if len(data) > self.config.max_datagram_bytes:
            core.dropped[DROP_OVERSIZED] = core.dropped.get(DROP_OVERSIZED, 0) + 1
            return
        host, port = str(addr[0]), int(addr[1])
        core.receive(data, format_address(host, port), monotonic_ms(), wall_ms())
        self._flush()

    def _check_host(self, name: str, ip: str) -> bool | None:
        """For the core: does sender host name `name` resolve to `ip`? Answers from the
        cache at once (None: not known yet) and looks the name up again in the background
        when the answer is old, or did not include `ip` a while ago."""
        now_ms = monotonic_ms()
        known = self._names.get(name)
        if known is None:
            self._resolve_name(name)
            return None
        addresses, looked_up_ms = known
        age_ms = now_ms - looked_up_ms
        if addresses is not None and ip in addresses:
            if age_ms > DNS_CACHE_MS:
                self._resolve_name(name)
            return True
        if age_ms > NAME_RECHECK_MS:
            self._resolve_name(name)
        return None if addresses is None else False

    def _resolve_name(self, name: str) -> None:
        if name in self._names_resolving or self._transport is None:
            return
        self._names_resolving.add(name)
        task = asyncio.get_running_loop().create_task(self._look_up_name(name))
        self._resolving.add(task)
        task.add_done_callback(self._resolving.discard)

    async def _look_up_name(self, name: str) -> None:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(name, None, type=socket.SOCK_DGRAM)
        except OSError as e:
            log.debug("swim cannot resolve sender %s: %s", name, e)
            infos = []
        finally:
            self._names_resolving.discard(name)
        addresses = {ip_of(str(info[4][0])) for info in infos}
        found = frozenset(str(address) for address in addresses if address is not None)
        self._names.pop(name, None)
        while len(self._names) >= MAX_SENDER_NAMES:
            del self._names[next(iter(self._names))]
        self._names[name] = (found or None, monotonic_ms())

    def _flush(self) -> None:
        core = self.core
        for address, datagram in core.outbox():
            self._send(address, datagram)
        for event in core.events():
            if self._on_event is not None:
                self._on_event(event)
            if self.events.full():
                self.events.get_nowait()
                core.dropped[DROP_EVENT_OVERFLOW] = core.dropped.get(DROP_EVENT_OVERFLOW, 0) + 1
            self.events.put_nowait(event)

    def _count(self, reason: str) -> None:
        core = self.core
        core.dropped[reason] = core.dropped.get(reason, 0) + 1

    def _send(self, address: str, datagram: bytes) -> None:
        transport = self._transport
        if transport is None:
            return
        try:
            host, port = parse_address(address)
        except ValueError:
            self._count(DROP_UNRESOLVED)
            return
        if _is_ip_literal(host):
            self._sendto(datagram, host, port)
            return
        cached = self._resolved.get(host)
        if cached is not None and cached[1] > monotonic_ms():
            self._sendto(datagram, cached[0], port)
            return
        pending = self._pending.setdefault(host, [])
        if len(pending) >= MAX_PENDING_PER_HOST:
            self._count(DROP_UNRESOLVED)
            return
        pending.append((port, datagram))
        if len(pending) == 1:
            task = asyncio.get_running_loop().create_task(self._resolve(host))
            self._resolving.add(task)
            task.add_done_callback(self._resolving.discard)

    def _sendto(self, datagram: bytes, ip: str, port: int) -> None:
        if self._transport is None:
            return
        try:
            self._transport.sendto(datagram, (ip, port))
        except OSError as e:
            log.debug("swim send to %s:%d failed: %s", ip, port, e)
            self._count(DROP_SEND_ERROR)

    async def _resolve(self, host: str) -> None:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, None, family=self._family, type=socket.SOCK_DGRAM)
        except OSError as e:
            log.debug("swim cannot resolve %s: %s", host, e)
            infos = []
        waiting = self._pending.pop(host, [])
        if not infos:
            for _ in waiting:
                self._count(DROP_UNRESOLVED)
            return
        ip = str(infos[0][4][0])
        self._resolved[host] = (ip, monotonic_ms() + DNS_CACHE_MS)
        for port, datagram in waiting:
            self._sendto(datagram, ip, port)
