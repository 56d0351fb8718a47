"""The HTTP floor: what the broker's HTTP stack costs per request with nothing else to do.

    python3 bench/http_floor.py --port 18999 [--stack aiohttp]

It answers `POST /v1/topics/{topic}/partitions/{partition}/records` as an append would (reads
the body, answers a small JSON), and does nothing else: no auth, no log, no Raft, no fsync.
bench/compare.py drives it with wrk beside the broker's one-record-per-append phase, so the
broker's CPU per request is quoted against the floor of the HTTP stack it is built on,
measured in the same sitting. The stack is the broker's own (`--stack laminar`: its HTTP/1.1
fast path, laminar.server.h1, with aiohttp behind it), or aiohttp's alone (`--stack aiohttp`).
"""

from __future__ import annotations

import argparse
import asyncio

import uvloop
from aiohttp import web

from laminar.server.http import ApiRunner, ApiSite, ConnectionLimits

ANSWER = b'{"base_index":0,"count":1,"duplicate":false}'


async def append(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=ANSWER, content_type="application/json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--stack", choices=["laminar", "aiohttp"], default="laminar")
    args = parser.parse_args()
    app = web.Application()
    app.router.add_post("/v1/topics/{topic}/partitions/{partition}/records", append)
    if args.stack == "aiohttp":
        uvloop.install()
        web.run_app(app, host=args.host, port=args.port, access_log=None, print=None)
        return
    uvloop.run(serve(app, args.host, args.port))


async def serve(app: web.Application, host: str, port: int) -> None:
    """Serve `app` as the broker serves its API (until killed)."""
    runner = ApiRunner(app, ConnectionLimits())
    await runner.setup()
    await ApiSite(runner, host, port).start()
    await asyncio.Event().wait()


if __name__ == "__main__":
    main()
