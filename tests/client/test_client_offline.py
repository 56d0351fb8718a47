"""AsyncClient and Client without a broker: argument checks happen before any request, and a
cluster that cannot be reached gives `Unavailable` once the call's deadline has passed (real
connection refusals on loopback; nothing stands in for a broker)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import socket
from collections.abc import AsyncIterator, Iterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from laminar.client import AsyncClient, Client, Record, Timeout, Unavailable
from laminar.client.sync import ASYNC_ONLY
from laminar.log.batch import encode_batch


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_broker_urls_are_required_and_normalised() -> None:
    with pytest.raises(ValueError):
        AsyncClient([])
    client = AsyncClient(["http://a:1/", "http://a:1", " http://b:2 "])
    assert client.brokers == ["http://a:1", "http://b:2"]
    assert AsyncClient("http://c:3").brokers == ["http://c:3"]
    with pytest.raises(ValueError):
        AsyncClient(["http://a:1"], timeout_s=0)


async def test_append_arguments_are_checked_before_sending() -> None:
    async with AsyncClient([closed_port_url()], timeout_s=0.2) as client:
        with pytest.raises(ValueError):
            await client.append("t", 0, [])
        with pytest.raises(ValueError):
            await client.append("t", 0, [Record(b"v")], sequence=3)
        with pytest.raises(ValueError):
            await client.append("t", 0, [Record(b"v")], producer_id=5)
        with pytest.raises(ValueError):
            await client.append("t", 0, [Record(b"v")], producer_id=2**63, sequence=0)
        batch = encode_batch([Record(b"v")], producer_id=9, producer_seq=4)
        with pytest.raises(ValueError):
            await client.append("t", 0, batch, producer_id=8)
        with pytest.raises(ValueError):
            await client.append("t", 0, batch, sequence=5)
        with pytest.raises(ValueError):
            await client.append("t", 0, b"not a batch")


async def test_an_unreachable_cluster_is_unavailable_after_the_deadline() -> None:
    urls = [closed_port_url(), closed_port_url()]
    async with AsyncClient(urls, timeout_s=0.5) as client:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(Unavailable) as info:
            await client.cluster()
        elapsed = loop.time() - started
        assert info.value.status == 0 and info.value.code == "unreachable"
        assert elapsed > 0.2  # it tried until its deadline (how long after: the machine's load)
        with pytest.raises(Unavailable):
            await client.append("t", 0, [Record(b"v")], producer_id=1, sequence=0)
        with pytest.raises(Unavailable):
            await client.read("t", 0, 1)


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """The URL of `app` served on loopback (standing in for a broker)."""
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


@contextlib.contextmanager
def never_accepting() -> Iterator[str]:
    """The URL of a listener whose accept queue is full: the kernel drops further SYNs, so a
    connection to it never completes."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        address = listener.getsockname()
        filling = []
        try:
            while True:  # fill the accept queue: then the kernel drops further SYNs
                s = socket.socket()
                s.setblocking(False)
                filling.append(s)
                if s.connect_ex(address) not in (0,) and len(filling) > 2:
                    break
                if len(filling) > 16:
                    break
            yield f"http://127.0.0.1:{address[1]}"
        finally:
            for s in filling:
                s.close()


async def test_a_deadline_that_passes_while_connecting_means_unreachable() -> None:
    """A broker whose accept queue is full never completes a connection: the call's deadline
    passes while connecting, nothing was sent, so the cluster is unreachable (Unavailable),
    not a Timeout whose request may have gone out."""
    with never_accepting() as url:
        async with AsyncClient([url], timeout_s=0.5) as client:
            with pytest.raises(Unavailable) as info:
                await client.topics()
        assert info.value.code == "unreachable", info.value


async def test_a_broker_that_never_answers_is_a_timeout() -> None:
    """Connected, the request sent, no answer by the deadline: Timeout (status 0), since
    the request reached a broker."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # the kernel completes the connection; nobody reads or answers
        port = listener.getsockname()[1]
        async with AsyncClient([f"http://127.0.0.1:{port}"], timeout_s=0.5) as client:
            with pytest.raises(Timeout) as info:
                await client.topics()
        assert info.value.status == 0 and info.value.code == "connection_lost", info.value


async def test_a_handoff_waits_past_the_clients_timeout_for_the_brokers_answer() -> None:
    """A broker answers a handoff only once its leaderships moved or HANDOFF_TIMEOUT_S passed:
    the client waits longer than its own timeout (a pod's preStop failed when a loaded broker
    answered just after the CLI's 10 s). A server that answers after the client's timeout
    stands in for that broker."""

    async def slow_handoff(request: web.Request) -> web.Response:
        await asyncio.sleep(0.6)
        return web.json_response({"node": request.match_info["id"], "leading": 2})

    app = web.Application()
    app.router.add_post("/v1/nodes/{id}/handoff", slow_handoff)
    async with serving(app) as url, AsyncClient([url], timeout_s=0.3) as client:
        assert await client.handoff("n1") == 2


async def test_an_unreachable_redirect_names_where_it_pointed() -> None:
    """A broker that answers 307 to a node the client cannot reach (a worker's address whose
    name a deleted cluster's Service took with it): the error names that node, not the broker
    that was reached (it named the seed URL: a pod's failed preStop said it could not connect
    to 127.0.0.1). The node never completes a connection, so the call's one attempt ends there
    at its deadline."""
    with never_accepting() as unreachable:

        async def redirect(request: web.Request) -> web.Response:
            raise web.HTTPTemporaryRedirect(f"{unreachable}{request.path}")

        app = web.Application()
        app.router.add_get("/v1/topics/{topic}/partitions/{p}/records", redirect)
        async with serving(app) as seed, AsyncClient([seed], timeout_s=0.5) as client:
            with pytest.raises(Unavailable) as info:
                await client.read("t", 0, 0)
        assert info.value.code == "unreachable", info.value
        assert f"cannot connect to {unreachable} (where {seed} redirected)" in str(info.value)


async def test_a_redirect_target_that_could_not_be_reached_is_not_asked_first_again() -> None:
    """A broker redirects a read to a node the client cannot reach. The client forgets that
    node as the partition's route, not the broker that answered: the next read goes to the
    broker again and is served. (It forgot the broker and kept the node as the route, so the
    next call spent its whole deadline connecting to the node.)"""
    reads = 0
    with never_accepting() as unreachable:

        async def records(request: web.Request) -> web.Response:
            nonlocal reads
            reads += 1
            if reads == 1:
                raise web.HTTPTemporaryRedirect(f"{unreachable}{request.path}")
            return web.Response(body=b"", content_type="application/vnd.laminar.batch")

        app = web.Application()
        app.router.add_get("/v1/topics/{topic}/partitions/{p}/records", records)
        async with serving(app) as seed, AsyncClient([seed], timeout_s=0.5) as client:
            with pytest.raises(Unavailable) as info:
                await client.read("t", 0, 0)
            assert unreachable in str(info.value)
            result = await client.read("t", 0, 0)
    assert result.records == [] and reads == 2


async def test_a_closed_client_refuses_calls() -> None:
    client = AsyncClient([closed_port_url()], timeout_s=0.2)
    await client.close()
    await client.close()
    with pytest.raises(RuntimeError):
        await client.topics()


def test_the_sync_client_runs_calls_on_its_own_loop() -> None:
    with Client([closed_port_url()], timeout_s=0.3) as client:
        with pytest.raises(Unavailable):
            client.topics()
        with pytest.raises(ValueError):
            client.append("t", 0, [])
        with pytest.raises(Unavailable):
            client.produce("t", [b"a", b"b"], partition=0)
    client.close()  # idempotent
    with pytest.raises(RuntimeError):
        client.cluster()


async def test_the_sync_client_also_works_where_a_loop_is_running() -> None:
    client = Client([closed_port_url()], timeout_s=0.2)
    try:
        with pytest.raises(Unavailable):
            client.describe_topic("t")  # blocks this loop briefly, but does not deadlock
    finally:
        client.close()


def test_the_sync_client_has_every_call_of_the_async_one() -> None:
    """Every public coroutine method of AsyncClient is a blocking method of Client with the same
    signature and documentation (a new API call needs no change to the sync client)."""
    calls = [
        name
        for name, member in vars(AsyncClient).items()
        if not name.startswith("_") and inspect.iscoroutinefunction(member) and name != "close"
        and name not in ASYNC_ONLY
    ]  # fmt: skip
    assert all(not hasattr(Client, name) for name in ASYNC_ONLY)
    assert {"cluster", "append", "read", "acquire", "renew", "describe_group"} <= set(calls)
    with Client([closed_port_url()], timeout_s=0.2) as client:
        for name in calls:
            blocking, original = getattr(client, name), getattr(client.async_client, name)
            assert not inspect.iscoroutinefunction(blocking), name
            assert inspect.signature(blocking) == inspect.signature(original), name
            assert blocking.__doc__ == original.__doc__, name
        with pytest.raises(ValueError):
            client.acquire("t", 0, "bad group")
        with pytest.raises(Unavailable):
            client.set_weight("n1", 5)
