"""The HTTP/1.1 fast path's handlers that answer without a task (laminar.server.h1,
`NOW_HANDLERS`), on a real server and raw connections: a request such a handler takes is
answered when it says so, once, in order with the requests pipelined behind it; one it
leaves goes to the route's own handler; and stopping the server waits for the answer it
owes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web

from laminar.server.h1 import NOW_HANDLERS, FastRequest
from laminar.server.http import ApiRunner, ConnectionLimits

PATH = "/v1/things"
TIMEOUT_S = 10.0


class Held:
    """A NowHandler that takes the requests whose body is b"now" and answers them when told."""

    def __init__(self) -> None:
        self.taken: asyncio.Queue[FastRequest] = asyncio.Queue()

    def __call__(self, request: FastRequest, body: bytes) -> bool:
        if body != b"now":
            return False
        self.taken.put_nowait(request)
        return True


async def by_handler(request: web.Request) -> web.Response:
    return web.Response(text=f"handler {(await request.read()).decode()}")


@asynccontextmanager
async def serving(held: Held) -> AsyncIterator[tuple[web.AppRunner, int]]:
    app = web.Application()
    app.router.add_post(PATH, by_handler)
    app[NOW_HANDLERS] = {("POST", PATH): held}
    runner = ApiRunner(app, ConnectionLimits())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield runner, port
    finally:
        await runner.cleanup()


def post(body: bytes) -> bytes:
    head = f"POST {PATH} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


async def answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    async with asyncio.timeout(TIMEOUT_S):
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        length = next(int(x.split(":")[1]) for x in lines if x.lower().startswith("content-length"))
        return int(lines[0].split()[1]), await reader.readexactly(length)


async def refused(port: int) -> None:
    """Return once connections to `port` are refused."""
    async with asyncio.timeout(TIMEOUT_S):
        while True:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except ConnectionRefusedError:
                return
            except ConnectionResetError:  # accepted as the listener closed
                continue
            writer.close()
            await asyncio.sleep(0.01)


async def taken(
    held: Held, port: int, *, behind: bytes = b""
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, FastRequest]:
    """A connection whose request `held` took (with `behind` pipelined after it)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post(b"now") + behind)
    async with asyncio.timeout(TIMEOUT_S):
        return reader, writer, await held.taken.get()


def now_answer(text: str) -> tuple[str, bytes]:
    return "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n", text.encode()


async def test_a_taken_request_is_answered_when_told_and_in_order() -> None:
    held = Held()
    async with serving(held) as (_, port):
        reader, writer, request = await taken(held, port, behind=post(b"later"))
        # answers go in order: had "later" been answered first, the first answer would be its
        request.answer(now_answer("taken"))
        assert await answer(reader) == (200, b"taken")
        assert await answer(reader) == (200, b"handler later")  # left to the route's handler
        request.answer(now_answer("twice"))  # a second answer to an answered request: dropped
        writer.write(post(b"again"))
        assert await answer(reader) == (200, b"handler again")
        writer.close()


async def test_an_answer_after_the_client_left_is_dropped() -> None:
    held = Held()
    async with serving(held) as (runner, port):
        reader, writer, request = await taken(held, port)
        writer.close()
        await writer.wait_closed()
        async with asyncio.timeout(TIMEOUT_S):  # until the server saw it go
            while runner.server._connections:  # type: ignore[union-attr]
                await asyncio.sleep(0.01)
        request.answer(now_answer("nobody"))  # no error, nothing sent
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post(b"next"))
        assert await answer(reader) == (200, b"handler next")
        writer.close()


async def test_stopping_the_server_waits_for_the_answer_it_owes() -> None:
    held = Held()
    async with serving(held) as (runner, port):
        reader, writer, request = await taken(held, port)
        stopping = asyncio.ensure_future(runner.cleanup())
        await refused(port)  # the server is stopping: it no longer listens
        request.answer(now_answer("before the end"))
        assert await answer(reader) == (200, b"before the end")
        async with asyncio.timeout(TIMEOUT_S):
            await stopping
            assert await reader.read() == b""  # then the connection closes
        writer.close()


async def test_a_request_is_answered_once_even_if_its_handler_answers_again() -> None:
    held = Held()
    async with serving(held) as (_, port):
        reader, writer, request = await taken(held, port, behind=post(b"later"))
        # more than the socket takes at once: the answer waits to drain, and the request is
        # still the connection's current one
        big = b"x" * (16 << 20)
        request.answer(("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n", big))
        request.answer(now_answer("again"))  # a handler's bug: nothing more goes out
        assert await answer(reader) == (200, big)
        assert await answer(reader) == (200, b"handler later")
        writer.close()
