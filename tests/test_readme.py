"""The README tells the truth: two set-up commands, CI runs the test one, the demos run, the
test command's needs are named, what the README's commands make is ignored by git. (Its Python
snippets run as scripts against a real cluster: tests/integration/test_readme_snippets.py.)"""

from __future__ import annotations

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


def test_demo_command_runs() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "laminar", "demo", "--messages", "12"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "produced 12 messages" in out and out.count(": message ") == 12
    assert "cluster status" in out and "stopped the cluster" in out
    assert "web console, while the demo runs: https://127.0.2.11:7070/ " in out


def test_log_demo_command_runs(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "laminar", "log-demo", "--records", "1000"]
    result = subprocess.run(
        [*command, "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "records_appended: 1000" in result.stdout
    assert "records_read_back: 1000" in result.stdout


def test_what_ci_installs_for_the_tests_is_named() -> None:
    """Every package .ci/run installs for the test command is one the README says it needs."""
    ci = (REPO / ".ci" / "run").read_text()
    (listed,) = re.findall(r"^packages=\((.*?)\)", ci, flags=re.S | re.M)
    packages = listed.split()
    assert len(packages) > 5, listed
    needs = README[README.index("The first needs only Python") :].split("\n\n")[0]
    named = [p for p in packages if re.search(rf"(?<![\w-]){re.escape(p)}(?![\w-])", needs)]
    assert named == packages
    assert "root" in needs and "Go" in needs and "Java" in needs and "`.ci/run`" in needs


def test_the_readme_commands_data_directory_is_ignored() -> None:
    """`laminar local-cluster up --data-dir ./laminar-data`, run in the checkout, leaves nothing
    for git to show."""
    assert "--data-dir ./laminar-data" in README
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "--no-index", "laminar-data/token"], cwd=REPO, check=False
    )
    assert ignored.returncode == 0
