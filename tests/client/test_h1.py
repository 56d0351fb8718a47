"""The client's HTTP/1.1 transport (laminar.client.h1) against real servers on loopback: a
scripted socket server that sends exact bytes (every framing of an answer, broken ones), and
aiohttp's own server. The parser's split-point property is checked by feeding its protocol
the bytes in pieces."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import time
from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from laminar.client import h1


class Server:
    """A socket server on loopback that answers each request with the next scripted bytes."""

    def __init__(self, answers: list[bytes], pause_s: float = 0.0, cap: int | None = None) -> None:
        self.answers = answers
        self.pause_s = pause_s
        #: as a broker's cap on one client address's connections: one more is answered
        #: REFUSED at once, before anything is read, and closed
        self.cap = cap
        self.refused = 0
        self.connections = 0
        self.open = 0
        self.most_open = 0
        self.requests: list[bytes] = []
        self.url = ""
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cap is not None and self.open >= self.cap:
            self.refused += 1
            writer.write(REFUSED)
            writer.close()
            return
        self.connections += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            while self.answers:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                self.requests.append(head + await reader.readexactly(length))
                if self.pause_s:
                    await asyncio.sleep(self.pause_s)
                answer = self.answers.pop(0)
                if answer == b"":  # close without an answer
                    break
                writer.write(answer)
                await writer.drain()
                if answer.endswith(b"<close>"):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open -= 1
            writer.close()


async def until(condition: Callable[[], object], what: str, timeout_s: float = 5.0) -> None:
    """Wait for `condition` (polled every millisecond), failing after `timeout_s`."""
    give_up = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > give_up:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.001)


def deadline(seconds: float = 5.0) -> float:
    return asyncio.get_running_loop().time() + seconds


@contextlib.asynccontextmanager
async def pool(limit: int = 8) -> AsyncIterator[h1.Pool]:
    p = h1.Pool(limit, connect_timeout_s=2.0)
    try:
        yield p
    finally:
        p.close()


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
#: a broker's answer to a connection over its cap (laminar.server.http)
REFUSED = (
    b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 2\r\nConnection: close\r\n"
    b"Retry-After: 1\r\nLaminar-Connection-Limit: 256\r\n\r\n{}"
)


@pytest.mark.parametrize(
    ("answer", "body", "kept"),
    [
        (OK, b"ok", True),
        (b"HTTP/1.1 201 Created\r\ncontent-length: 0\r\n\r\n", b"", True),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3;ext=1\r\nabc\r\nA\r\n0123456789\r\n0\r\nX-Trailer: t\r\n\r\n",
            b"abc0123456789",
            True,
        ),
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", b"ok", False),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", b"ok", False),
        (b"HTTP/1.1 200 OK\r\n\r\nuntil the end<close>", b"until the end<close>", False),
        (b"HTTP/1.1 100 Continue\r\n\r\n" + OK, b"ok", True),
        (b"HTTP/1.1 204 No Content\r\nContent-Length: 9\r\n\r\n", b"", True),
    ],
)
async def test_an_answer_is_read_as_its_framing_says_and_its_connection_kept_if_it_may_be(
    answer: bytes, body: bytes, kept: bool
) -> None:
    async with Server([answer, OK]) as server, pool() as p:
        status, _, got = await p.request("GET", server.url + "/a", {}, None, deadline())
        assert (status, got) == (int(answer.rpartition(b"HTTP/1.")[2][2:5]), body)
        assert await p.request("GET", server.url + "/b", {}, None, deadline()) == (
            200,
            {"Content-Length": "2"},
            b"ok",
        )
        assert server.connections == (1 if kept else 2)


async def test_a_request_carries_its_headers_host_and_length() -> None:
    async with Server([OK]) as server, pool() as p:
        await p.request("POST", server.url + "/x?q=1", {"A": "b"}, b"body", deadline())
        port = server.url.rsplit(":", 1)[1]
        assert server.requests == [
            f"POST /x?q=1 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nA: b\r\n"
            "Content-Length: 4\r\n\r\nbody".encode()
        ]


@pytest.mark.parametrize(
    ("method", "url", "headers"),
    [
        ("GET", "/a b", {}),
        ("GET", "/a\r\nX: y", {}),
        ("GET", "/", {"X": "a\r\nInjected: 1"}),
        ("GET", "/", {"X y": "a"}),
        ("GET", "/", {"X": "é€"}),
        ("G T", "/", {}),
    ],
)
async def test_a_request_http_cannot_carry_is_refused_before_anything_is_sent(
    method: str, url: str, headers: dict[str, str]
) -> None:
    async with Server([OK]) as server, pool() as p:
        with pytest.raises(ValueError):
            await p.request(method, server.url + url, headers, None, deadline())
        assert server.connections == 0


@pytest.mark.parametrize(
    "answer",
    [
        b"SSH-2.0-OpenSSH\r\n\r\n",
        b"HTTP/1.1 2x0 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokXY0\r\n\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: " + b"x" * (h1.MAX_HEAD_BYTES + 10) + b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * (h1.MAX_HEADERS + 1) + b"\r\n",
        b"",  # the connection closed with no answer
        b"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\nshort<close>",
    ],
)
async def test_an_answer_that_is_not_http_breaks_the_request(answer: bytes) -> None:
    async with Server([answer, OK]) as server, pool() as p:
        with pytest.raises(h1.Broken):
            await p.request("GET", server.url + "/", {}, None, deadline())
        # the next request works, on a new connection
        assert (await p.request("GET", server.url + "/", {}, None, deadline()))[2] == b"ok"
        assert server.connections == 2


async def test_no_answer_by_the_deadline_breaks_the_request_and_drops_its_connection() -> None:
    async with Server([OK, OK], pause_s=0.5) as server, pool() as p:
        with pytest.raises(h1.Broken) as info:
            await p.request("GET", server.url + "/", {}, None, deadline(0.1))
        assert isinstance(info.value.cause, TimeoutError)
        assert (await p.request("GET", server.url + "/", {}, None, deadline()))[2] == b"ok"
        assert server.connections == 2


async def test_a_refused_connection_is_not_connected() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with pool() as p:
        with pytest.raises(h1.NotConnected):
            await p.request("GET", f"http://127.0.0.1:{port}/", {}, None, deadline())


async def test_a_cancelled_request_closes_its_connection() -> None:
    async with Server([OK, OK], pause_s=0.3) as server, pool() as p:
        task = asyncio.ensure_future(p.request("GET", server.url + "/", {}, None, deadline()))
        await until(lambda: server.requests, "the request to arrive")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await p.request("GET", server.url + "/", {}, None, deadline()))[2] == b"ok"
        assert server.connections == 2


async def test_the_pool_opens_at_most_its_limit_of_connections() -> None:
    async with Server([OK] * 6, pause_s=0.05) as server, pool(limit=2) as p:
        answers = await asyncio.gather(
            *(p.request("GET", server.url + "/", {}, None, deadline()) for _ in range(6))
        )
        assert [a[2] for a in answers] == [b"ok"] * 6
        assert server.most_open <= 2 and server.connections == 2


async def test_a_full_pool_closes_an_idle_connection_of_another_origin() -> None:
    async with Server([OK, OK]) as one, Server([OK]) as two, pool(limit=1) as p:
        await p.request("GET", one.url + "/", {}, None, deadline())
        assert one.open == 1
        await p.request("GET", two.url + "/", {}, None, deadline())
        # the idle connection to `one` was closed for `two`'s
        await until(lambda: not one.open, "the idle connection to close")


async def test_a_connection_gone_idle_goes_to_a_request_for_its_own_origin_first() -> None:
    """With the pool full, a request for `b` waits, then one for `a`: the connection to `a`
    that comes free serves the second (closing it for `b`'s would open a new one to `a`
    after), and `b`'s request takes the room after."""
    async with (
        Server([OK, OK], pause_s=0.2) as a,
        Server([OK]) as b,
        pool(limit=1) as p,
    ):
        first = asyncio.ensure_future(p.request("GET", a.url + "/", {}, None, deadline()))
        await until(lambda: a.requests, "the request to arrive")
        for_b = asyncio.ensure_future(p.request("GET", b.url + "/", {}, None, deadline()))
        await until(lambda: len(p._waiters) >= 1, "a waiter")
        second = asyncio.ensure_future(p.request("GET", a.url + "/", {}, None, deadline()))
        await until(lambda: len(p._waiters) >= 2, "two waiters")
        answers = await asyncio.gather(first, for_b, second)
        assert [answer[2] for answer in answers] == [b"ok"] * 3
        assert (a.connections, b.connections) == (1, 1)


async def test_a_pool_kept_full_by_one_origin_still_serves_another_in_turn() -> None:
    """Three requests for `a` at a time, each followed at once by the next, keep a pool of 2
    full with one of them always waiting: a request for `b` gets its turn after at most
    MAX_SKIPS of theirs (taking a freed connection of `a` saves a reconnect), not once they
    stop."""
    async with Server([OK] * 600) as a, Server([OK]) as b, pool(limit=2) as p:
        done = 0
        a_port = int(a.url.rsplit(":", 1)[1])

        async def load() -> None:
            nonlocal done
            for _ in range(150):
                await p.request("GET", a.url + "/", {}, None, deadline())
                done += 1

        loads = [asyncio.ensure_future(load()) for _ in range(3)]
        await until(lambda: done >= 6 and p._waiters, "a full pool with a request waiting")
        before = done
        for_b = asyncio.ensure_future(p.request("GET", b.url + "/", {}, None, deadline()))
        await asyncio.sleep(0)  # (its first step ran: it waits, the pool being full)
        (waiting_b,) = [w for w in p._waiters if w.origin.port != a_port]
        assert (await for_b)[2] == b"ok"
        assert waiting_b.skips <= h1.MAX_SKIPS  # passed over that often at most, then served
        # served while the load goes on (on the pool before: 281 of its requests, until one of
        # its loops ended); the margin is the load's requests already on the wire meanwhile
        assert done - before <= 2 * h1.MAX_SKIPS + 3
        await asyncio.gather(*loads)
        assert done == 450


async def test_a_server_that_refuses_connections_over_its_cap_caps_the_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """8 requests at once open 8 connections; a server that holds 2 of one client refuses the
    6 others. Each refusal tells the pool to hold no more than it has open, so the pool comes
    down to 2 without a refusal more, and the refused requests are sent again on those."""
    monkeypatch.setattr(h1, "CAP_PROBE_S", 3600.0)  # (no try of one more in this test)
    async with Server([OK] * 40, pause_s=0.01, cap=2) as server, pool(limit=8) as p:

        async def load() -> list[bytes]:
            return [
                (await p.request("GET", server.url + "/", {}, None, deadline()))[2]
                for _ in range(5)
            ]

        answers = await asyncio.gather(*(load() for _ in range(8)))
        assert answers == [[b"ok"] * 5] * 8
        assert server.refused == 6
        assert server.connections == 2
        assert p.cap_of(server.url) == 2
        assert len(server.requests) == 40  # (each request read once)


async def test_a_capped_pool_tries_one_more_connection_every_probe_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cap is shared with the address's other clients, which may close theirs: while
    requests wait, one connection more is tried every CAP_PROBE_S, until one is refused."""
    monkeypatch.setattr(h1, "CAP_PROBE_S", 0.02)
    async with Server([OK] * 2000, pause_s=0.005, cap=1) as server, pool(limit=8) as p:
        await asyncio.gather(
            *(p.request("GET", server.url + "/", {}, None, deadline()) for _ in range(3))
        )
        assert p.cap_of(server.url) == 1
        server.cap = 3  # (as if other clients closed two)
        refused = server.refused
        stop = False

        async def load() -> None:
            for _ in range(400):
                if stop:
                    return
                await p.request("GET", server.url + "/", {}, None, deadline())

        loads = [asyncio.ensure_future(load()) for _ in range(4)]
        # grown to 3, then a fourth tried and refused
        await until(lambda: server.refused > refused, "a connection over the new cap")
        stop = True
        await asyncio.gather(*loads)
        assert server.most_open == 3
        assert p.cap_of(server.url) == 3


async def test_a_cap_held_by_other_clients_answers_the_refusal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With none of its own connections open, a refused request gets the 429 (the client
    backs off); once the others close theirs, the next try gets through."""
    monkeypatch.setattr(h1, "CAP_PROBE_S", 0.02)
    async with Server([OK], cap=1) as server, pool() as p:
        host, port = server.url.removeprefix("http://").split(":")
        other = socket.create_connection((host, int(port)))  # another client's
        try:
            await until(lambda: server.open == 1, "the other client's connection")
            status, headers, _ = await p.request("GET", server.url + "/", {}, None, deadline())
            assert status == 429 and headers["Laminar-Connection-Limit"] == "256"
            assert p.cap_of(server.url) == 0
        finally:
            other.close()
        await until(lambda: server.open == 0, "the other client's connection to close")
        assert (await p.request("GET", server.url + "/", {}, None, deadline()))[2] == b"ok"
        assert p.cap_of(server.url) == 1


async def test_a_tls_connection_closed_in_its_handshake_with_none_other_held_is_not_a_cap() -> None:
    """A server that closes a TLS connection before its handshake, when the pool holds no
    other connection to it, may be down or refusing: NotConnected, and no cap learned."""

    async def close_at_once(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.transport.abort()  # (a reset, as a broker's listener closes one over its cap)

    server = await asyncio.start_server(close_at_once, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with pool() as p:
            with pytest.raises(h1.NotConnected) as refused:
                await p.request("GET", f"https://127.0.0.1:{port}/", {}, None, deadline())
            assert not isinstance(refused.value, h1.Refused)
            assert p.cap_of(f"https://127.0.0.1:{port}") is None
    finally:
        server.close()


async def test_a_request_waiting_for_a_connection_ends_when_the_pool_closes() -> None:
    async with Server([OK], pause_s=0.3) as server:
        p = h1.Pool(1, connect_timeout_s=2.0)
        first = asyncio.ensure_future(p.request("GET", server.url + "/", {}, None, deadline()))
        await until(lambda: server.requests, "the request to arrive")
        waiting = [
            asyncio.ensure_future(p.request("GET", server.url + "/", {}, None, deadline()))
            for _ in range(2)
        ]
        await until(lambda: len(p._waiters) >= 2, "two waiters")
        p.close()
        with pytest.raises(h1.Broken):
            await first
        for request in waiting:
            with pytest.raises(RuntimeError, match="closed"):
                await asyncio.wait_for(request, 1.0)


async def test_a_full_pool_waits_no_longer_than_the_deadline() -> None:
    async with Server([OK, OK], pause_s=0.5) as server, pool(limit=1) as p:
        first = asyncio.ensure_future(p.request("GET", server.url + "/", {}, None, deadline()))
        await until(lambda: server.requests, "the request to arrive")
        with pytest.raises(h1.NotConnected):
            await p.request("GET", server.url + "/", {}, None, deadline(0.1))
        assert (await first)[2] == b"ok"


async def test_against_aiohttps_server_a_kept_connection_serves_every_kind_of_answer() -> None:
    async def plain(request: web.Request) -> web.Response:
        return web.Response(body=await request.read())

    async def streamed(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)  # no length: chunked
        for piece in (b"one ", b"two ", b"three"):
            await response.write(piece)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/echo", plain)
    app.router.add_get("/stream", streamed)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = f"http://127.0.0.1:{port}"
    try:
        async with pool(limit=1) as p:
            big = bytes(range(256)) * 4096  # 1 MiB: more than one write and one read
            for _ in range(3):
                status, _, body = await p.request("POST", url + "/echo", {}, big, deadline())
                assert (status, body) == (200, big)
                status, headers, body = await p.request(
                    "GET", url + "/stream", {}, None, deadline()
                )
                assert (status, headers.get("Transfer-Encoding"), body) == (
                    200,
                    "chunked",
                    b"one two three",
                )
                status, _, body = await p.request("HEAD", url + "/stream", {}, None, deadline())
                assert (status, body) == (200, b"")  # (add_get answers HEAD too)
                status, _, body = await p.request("GET", url + "/missing", {}, None, deadline())
                assert status == 404 and b"Not Found" in body
    finally:
        await runner.cleanup()


ANSWER = (
    b"HTTP/1.1 100 Continue\r\n\r\n"
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-A: 1\r\n\r\n"
    b"5\r\nhello\r\n1;x=y\r\n \r\n6\r\nworld!\r\n0\r\nT: t\r\n\r\n"
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=len(ANSWER) - 1), unique=True))
def test_an_answer_parses_the_same_whatever_pieces_its_bytes_arrive_in(cuts: list[int]) -> None:
    async def run() -> tuple[int, str | None, bytes]:
        p = h1.Pool(1, 1.0)
        connection = h1._Connection(p, h1.parse_origin("http://127.0.0.1:1"))
        connection._answer = asyncio.get_running_loop().create_future()
        edges = [0, *sorted(cuts), len(ANSWER)]
        for start, end in itertools.pairwise(edges):
            assert not connection._answer.done()
            connection.data_received(ANSWER[start:end])
        status, headers, body = connection._answer.result()
        assert connection.keep
        return status, headers.get("x-a"), body

    assert asyncio.run(run()) == (200, "1", b"hello world!")


def test_requests_go_and_connections_are_kept_on_uvloop_too() -> None:
    """uvloop's transports are not asyncio.Transport subclasses (the brokers run on uvloop, and
    so may the client's users)."""
    uvloop = pytest.importorskip("uvloop", reason="uvloop is not installed")

    async def run() -> None:
        async with Server([OK, OK]) as server, pool() as p:
            for _ in range(2):
                assert await p.request("GET", server.url + "/", {}, None, deadline()) == (
                    200,
                    {"Content-Length": "2"},
                    b"ok",
                )
            assert server.connections == 1

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(run())
