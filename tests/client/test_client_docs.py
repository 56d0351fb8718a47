"""docs/client.md matches the client: its classes are laminar.client's, the methods it calls
exist, its Python blocks compile, and its numbers are the code's. (The blocking consumers run
against real brokers in tests/integration/test_sync_consumers.py, its SIGTERM recipe too.)"""

from __future__ import annotations

import re
from pathlib import Path

import laminar.client
from laminar.client import Client, GroupConsumer, SyncConsumer, SyncDelivery, SyncGroupConsumer
from laminar.client.sync_consumers import BUFFERED_RECORDS, SYNC_SETTLE_LINGER_MS
from laminar.contract import DEFAULT_LEASE_MS

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "client.md").read_text()
TEXT = " ".join(DOC.split())  # (line breaks as spaces)


def test_the_table_names_the_client_classes() -> None:
    rows = re.findall(r"^\| `(\w+)` \| (.*?) \|", DOC, flags=re.M)
    named = {name for name, _ in rows}
    named |= {name for _, cell in rows for name in re.findall(r"`(\w+)`", cell)}
    assert {"AsyncClient", "Client", "SyncConsumer", "SyncGroupConsumer", "SyncDelivery"} <= named
    assert all(name in laminar.client.__all__ for name in named), named


def test_the_python_blocks_compile_and_call_what_exists() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC, flags=re.S)
    assert len(blocks) >= 4
    for block in blocks:
        compile(block, "docs/client.md", "exec")
    for method in set(re.findall(r"\bclient\.(\w+)\(", DOC)):
        assert hasattr(Client, method), method
    for method in set(re.findall(r"\bconsumer\.(\w+)\(", DOC)):
        assert hasattr(SyncConsumer, method), method
    for method in set(re.findall(r"\bbilling\.(\w+)", DOC)):
        assert hasattr(SyncGroupConsumer, method), method
    for method in set(re.findall(r"\bdelivery\.(\w+)", DOC)):
        assert hasattr(SyncDelivery, method), method


def test_the_numbers_are_the_codes() -> None:
    assert BUFFERED_RECORDS == 1000 and "(up to 1,000)" in TEXT
    assert SYNC_SETTLE_LINGER_MS == 0 and "`settle_linger_ms` defaults to 0 here" in TEXT
    defaults = GroupConsumer.__init__.__kwdefaults__
    assert defaults is not None and defaults["settle_linger_ms"] == 5.0
    assert "(5 in `GroupConsumer`)" in TEXT
    assert DEFAULT_LEASE_MS == 30_000 and "`lease_ms` 30 s" in TEXT
    queue = GroupConsumer(None, "orders", "billing")  # type: ignore[arg-type]  # (no calls)
    assert queue._close_timeout_s == 6.0 and "`close_timeout_s`, 6 s by default" in TEXT
