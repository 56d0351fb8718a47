"""docs/console.md matches the console: its pages are the console's routes, its numbers the
code's constants, and the screenshots it shows exist."""

from __future__ import annotations

import re
from pathlib import Path

from laminar.server.console import PATHS, routes, session
from laminar.server.console.data import MAX_BROWSE_RECORDS

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "console.md").read_text()
STATIC = REPO / "broker" / "laminar" / "server" / "console" / "static"


def test_the_pages_table_names_the_console_pages() -> None:
    table = re.findall(r"^\| [A-Z][A-Za-z ]+ \| `(/console/[^`]*)` \|", DOC, flags=re.M)
    pages = {href for href, _ in routes.NAV} | {
        "/console/topics/{topic}",
        "/console/topics/{topic}/groups",
    }
    assert set(table) == pages
    assert pages <= set(PATHS)
    for path in ("/openapi.yaml", "/openapi.json", "/console/api/rates"):
        assert path in PATHS and f"`{path}`" in DOC


def test_the_numbers_are_the_codes() -> None:
    assert session.SESSION_TTL_S == 8 * 3600 and "lasts 8 hours" in DOC
    assert (session.LOGIN_BURST, session.LOGIN_REFILL_S) == (10, 6.0)
    assert "10 in a burst, then one every 6\nseconds" in DOC
    assert MAX_BROWSE_RECORDS == 200 and "up to 200 records" in DOC
    assert routes.SHOWN_BYTES == 2048 and "the first 2 KiB of each" in DOC
    assert f"the last {routes.CHART_POINTS} points every {routes.CHART_POLL_S} seconds" in DOC
    script = (STATIC / "console.js").read_text()
    assert "const REFRESH_MS = 4000;" in script and "refreshes its data every 4\nseconds" in DOC
    policy = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    assert routes.CONTENT_SECURITY_POLICY.startswith(policy) and policy in " ".join(DOC.split())
    assert "frame-ancestors 'none'" in routes.CONTENT_SECURITY_POLICY


def test_the_screenshots_exist() -> None:
    images = re.findall(r"!\[[^\]]+\]\((images/[^)]+\.png)\)", DOC)
    assert len(images) == 2
    for image in images:
        assert (REPO / "docs" / image).read_bytes().startswith(b"\x89PNG"), image
