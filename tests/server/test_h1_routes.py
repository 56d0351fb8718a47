"""The fast path's routing (laminar.server.h1.FastRoutes): the matches of paths with
parameters are kept for the next request on the same path, within a bound."""

from __future__ import annotations

from aiohttp import web

from laminar.server.h1 import MAX_MATCHED_PATHS, FastRoutes


async def handler(_: web.Request) -> web.Response:
    return web.Response()


def test_matches_are_kept_within_a_bound_and_each_request_gets_its_own() -> None:
    app = web.Application()
    app.router.add_get("/v1/topics/{topic}", handler)
    app.router.add_post("/v1/topics/{topic}/partitions/{partition}/records", handler)
    routes = FastRoutes(app)
    for n in range(MAX_MATCHED_PATHS + 10):  # a client choosing paths cannot grow it
        found = routes.find("GET", f"/v1/topics/t{n}")
        assert found is not None and found[0] == {"topic": f"t{n}"}
        assert len(routes._matched) <= MAX_MATCHED_PATHS
    path = "/v1/topics/t/partitions/3/records"
    first = routes.find("POST", path)
    assert first is not None and first[0] == {"topic": "t", "partition": "3"}
    first[0]["topic"] = "changed by its handler"
    again = routes.find("POST", path)  # kept, and not the same mapping
    assert again is not None and again[0] == {"topic": "t", "partition": "3"}
    assert again[0].route is first[0].route
    assert routes.find("GET", path) is None  # no GET route there
