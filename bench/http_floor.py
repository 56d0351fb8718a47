"""The HTTP floor: what one aiohttp + uvloop process costs per request with nothing else to do.

    python3 bench/http_floor.py --port 18999

It answers `POST /v1/topics/{topic}/partitions/{partition}/records` as an append would (reads
the body, answers a small JSON), and does nothing else: no auth, no log, no Raft, no fsync.
bench/compare.py drives it with wrk beside the broker's one-record-per-append phase, so the
broker's CPU per request is quoted against the floor of the HTTP stack it is built on,
measured in the same sitting.
"""

from __future__ import annotations

import argparse

import uvloop
from aiohttp import web

ANSWER = b'{"base_index":0,"count":1,"duplicate":false}'


async def append(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=ANSWER, content_type="application/json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    app = web.Application()
    app.router.add_post("/v1/topics/{topic}/partitions/{partition}/records", append)
    uvloop.install()
    web.run_app(app, host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
