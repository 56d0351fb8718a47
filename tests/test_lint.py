"""The tree stays ruff-clean and formatted, and the sans-I/O cores pass mypy --strict."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(
    shutil.which("ruff") is None, reason="ruff is not installed (pip install -e '.[dev]')"
)
def test_ruff_check() -> None:
    result = run("ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(
    shutil.which("ruff") is None, reason="ruff is not installed (pip install -e '.[dev]')"
)
def test_ruff_format() -> None:
    result = run("ruff", "format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_on_the_cores() -> None:
    result = run(sys.executable, "-m", "mypy")
    assert result.returncode == 0, result.stdout + result.stderr


#: The sans-I/O cores: no module here may import a clock, sockets or an event loop.
CORES = ("raft", "swim", "queue", "metadata", "node", "placement.py", "partition/status_table.py")
IO_MODULES = {"asyncio", "socket", "time", "selectors", "threading"}


def test_the_sans_io_cores_import_no_clock_socket_or_event_loop() -> None:
    import ast

    package = REPO / "broker" / "laminar"
    offenders = []
    for core in CORES:
        path = package / core
        for source in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            for node in ast.walk(ast.parse(source.read_text())):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                bad = {name.split(".")[0] for name in names} & IO_MODULES
                if bad:
                    offenders.append(f"{source.relative_to(REPO)}:{node.lineno} {sorted(bad)}")
    assert not offenders, offenders
