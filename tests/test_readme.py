"""The README tells the truth: two set-up commands, CI runs the test one, the example runs."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def code_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def test_exactly_two_setup_commands_and_ci_runs_the_test_one() -> None:
    commands = [block.strip() for block in code_blocks("sh")]
    assert len(commands) == 2
    demo, tests = commands
    assert "laminar demo" in demo and "pytest" in tests
    assert tests in (REPO / ".ci" / "run").read_text().splitlines()


def test_demo_command_runs(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "laminar", "demo", "--records", "1000", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "records_read_back: 1001" in result.stdout


def test_python_example_runs(tmp_path: Path, capsys) -> None:
    (example,) = code_blocks("python")
    body = example.replace("/var/lib/laminar/p0", str(tmp_path / "p0"))
    source = "async def example():\n" + "".join(f"    {line}\n" for line in body.splitlines())
    namespace: dict[str, object] = {}
    exec(source, namespace)
    asyncio.run(namespace["example"]())  # type: ignore[operator]
    assert capsys.readouterr().out.strip() == "0 b'k' b'hello'"
