"""Shared fixtures: every generic log test runs against the in-memory and the file backend."""

from __future__ import annotations

import asyncio
import inspect
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from laminar.log import Directory, FileDirectory, MemoryDirectory

ASYNC_TEST_TIMEOUT_S = 120
# Hermetic client credentials: no token or context of the shell running the tests, and no
# client configuration file of the user's (laminar.client.config) reaches the clients under
# test, nor the commands they run; tests that want them set them.
for _name in ("LAMINAR_TOKEN", "LAMINAR_TOKEN_FILE", "LAMINAR_CONTEXT", "LAMINAR_BROKERS"):
    os.environ.pop(_name, None)
os.environ["LAMINAR_CONFIG"] = os.devnull + ".laminar-tests-have-no-client-config.yaml"


@pytest.fixture(params=["memory", "file"])
def directory_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Directory]:
    """Returns a function giving the same log directory each call (so tests can reopen)."""
    if request.param == "memory":
        memory = MemoryDirectory()
        return lambda: memory
    path = str(tmp_path / "log")
    return lambda: FileDirectory(path)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run `async def` tests in a fresh event loop (no plugin needed)."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    kwargs = {name: pyfuncitem.funcargs[name] for name in names}
    asyncio.run(asyncio.wait_for(pyfuncitem.obj(**kwargs), timeout=ASYNC_TEST_TIMEOUT_S))
    return True


def sim_first_lines(*args: str) -> list[str]:
    """`python -m laminar.sim ARGS` under two PYTHONHASHSEED values: the first output line of
    each (a replay must not depend on string hashing)."""
    outputs = []
    for hash_seed in ("1", "2"):
        result = subprocess.run(
            [sys.executable, "-m", "laminar.sim", *args],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
        )
        assert result.returncode == 0, result.stderr[-3000:]
        outputs.append(result.stdout.splitlines()[0])
    return outputs


def pytest_collection_finish(session: pytest.Session) -> None:
    """pytest-xdist schedules items by node id: two items with one id would run once, and the
    other would be dropped without a word (tests/fuzz/conftest.py gives schemathesis' items
    theirs). So collection refuses a repeated node id."""
    counts = Counter(item.nodeid for item in session.items)
    repeated = sorted(nodeid for nodeid, count in counts.items() if count > 1)
    if repeated:
        raise pytest.UsageError(f"node ids collected more than once: {repeated[:5]}")
