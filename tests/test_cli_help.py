"""The `laminar` command's help and shell completion (issue 26): every option of every
subcommand has a help text that says its default, read from the help as printed; the
completion scripts (`laminar completion bash|zsh`) parse, and bash completes with them."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from laminar.cli import build_parser
from laminar.cli_help import COMPLETION_SHELLS, subcommands

TIMEOUT_S = 60


def laminar(*args: str) -> subprocess.CompletedProcess[str]:
    """`python3 -m laminar ARGS`, outside any LAMINAR_* environment."""
    return subprocess.run(
        [sys.executable, "-m", "laminar", *args],
        input="",
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={k: v for k, v in os.environ.items() if not k.startswith("LAMINAR_")},
    )


def help_entries(text: str) -> dict[str, str]:
    """Each entry of a parser's help (an option or argument: its invocation, 2 spaces in)
    → its help text (the rest of its line and the lines indented under it), spaces joined."""
    entries: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        indent = len(line) - len(line.lstrip(" "))
        if indent == 2:
            invocation, _, rest = line.strip().partition("  ")
            current = entries.setdefault(invocation, [])
            current.append(rest)
        elif indent > 2 and current is not None:
            current.append(line)
        else:
            current = None  # a section's title, a blank line, the usage
    return {key: " ".join(" ".join(parts).split()) for key, parts in entries.items()}


def entry_of(entries: dict[str, str], action: argparse.Action) -> str | None:
    """`action`'s help text in `entries` (None: it has no entry)."""
    if action.option_strings:  # "--partition P [P ...], -p P [P ...]"
        for invocation, text in entries.items():
            if invocation.split(",")[0].split(" ")[0] == action.option_strings[0]:
                return text
        return None
    name = action.metavar or action.dest  # "topic", "INDEX [INDEX ...]", "{up,down,status}"
    if action.metavar is None and action.choices is not None:
        name = "{" + ",".join(map(str, action.choices)) + "}"
    return next((text for key, text in entries.items() if key.split(" ")[0] == name), None)


def says_default(action: argparse.Action) -> bool:
    """Does `action` have a default that its help must name: not none, not the state of a
    switch that is not given (--json off, --no-wait on), not an empty list."""
    default = action.default
    if default is None or default is argparse.SUPPRESS:
        return False
    if action.nargs == 0 and default != action.const:
        return False
    return not (isinstance(default, list | tuple) and not default)


def test_every_option_of_every_command_has_help_and_says_its_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # one line per entry: no default cut by the wrapping
    for name in [k for k in os.environ if k.startswith("LAMINAR_")]:
        monkeypatch.delenv(name)  # (serve's defaults read them)
    parsers = list(subcommands(build_parser()))
    progs = {parser.prog for parser in parsers}
    assert {"laminar serve", "laminar bench", "laminar local-cluster", "laminar completion"} <= (
        progs
    )
    assert {"laminar topic create", "laminar queue consume", "laminar node drain"} <= progs
    problems: list[str] = []
    checked = 0
    for parser in parsers:
        text = parser.format_help()
        entries = help_entries(text)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                # each subcommand is listed, 4 spaces in, with its help
                listed = {
                    line.split()[0]: line.split(maxsplit=1)[1:]
                    for line in text.splitlines()
                    if line.startswith("    ") and not line.startswith("     ")
                }
                for command in action.choices:
                    if not listed.get(command):
                        problems.append(f"{parser.prog} {command}: not listed with its help")
                continue
            help_text = entry_of(entries, action)
            checked += 1
            label = f"{parser.prog} {action.option_strings or action.dest}"
            if not help_text:
                problems.append(f"{label}: no help")
            elif says_default(action) and str(action.default) not in help_text:
                problems.append(f"{label}: the help does not say its default {action.default!r}")
    assert not problems, "\n".join(problems)
    assert checked > 200  # (every command's every option was seen)


def test_bash_completion_script_is_valid_and_completes(tmp_path: Path) -> None:
    bash = shutil.which("bash")
    assert bash is not None
    result = laminar("completion", "bash")
    assert result.returncode == 0, result.stderr
    script = tmp_path / "laminar.bash"
    script.write_text(result.stdout)
    checked = subprocess.run([bash, "-n", str(script)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr

    ca_file = tmp_path / "ca-bundle.pem"
    ca_file.write_text("")

    def complete(*words: str) -> list[str]:
        """What bash offers for the last of `words` (the command line so far)."""
        line = " ".join(words)
        program = (
            f"source {script} && complete -p laminar >/dev/null && "
            f"COMP_WORDS=({' '.join(repr(w) for w in words)}) && "
            f"COMP_CWORD={len(words) - 1} && COMP_LINE={line!r} && COMP_POINT={len(line)} && "
            "_shtab_laminar && printf '%s\\n' \"${COMPREPLY[@]}\""
        )
        done = subprocess.run(
            [bash, "-c", program], capture_output=True, text=True, timeout=TIMEOUT_S
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    assert complete("laminar", "to") == ["topic"]
    assert "completion" in complete("laminar", "")
    assert complete("laminar", "topic", "create", "orders", "--par") == ["--partitions"]
    assert complete("laminar", "local-cluster", "") == ["up", "down", "status"]
    assert complete("laminar", "bench", "produce", "--brok") == ["--brokers"]
    # an option for a file completes as a path
    assert complete("laminar", "topic", "list", "--ca-file", f"{tmp_path}/ca-") == [str(ca_file)]


@pytest.mark.parametrize("shell", COMPLETION_SHELLS)
def test_completion_script_for_each_shell(shell: str, tmp_path: Path) -> None:
    result = laminar("completion", shell)
    assert result.returncode == 0, result.stderr
    assert "_shtab_laminar" in result.stdout and "serve" in result.stdout
    if shell == "zsh":
        assert result.stdout.startswith("#compdef laminar")  # for a file in $fpath
    interpreter = shutil.which(shell)
    if interpreter is not None:  # (zsh is not everywhere: bash is checked above in any case)
        script = tmp_path / f"laminar.{shell}"
        script.write_text(result.stdout)
        checked = subprocess.run([interpreter, "-n", str(script)], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr


def test_completion_refuses_an_unknown_shell() -> None:
    result = laminar("completion", "cmd.exe")
    assert result.returncode == 2
    assert "invalid choice" in result.stderr and "bash" in result.stderr
