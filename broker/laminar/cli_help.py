"""How the `laminar` command presents itself: every option's help says its default, and the
shell completion scripts are generated (shtab) from the same parser, so that neither can drift
from the options themselves."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

#: the shells `laminar completion` writes a script for
COMPLETION_SHELLS = ("bash", "zsh")


class HelpFormatter(argparse.HelpFormatter):
    """Ends an option's help with "(default: X)" unless its help says it already
    (`%(default)s`) or there is nothing worth saying (`shows_default`): as
    argparse.ArgumentDefaultsHelpFormatter, without its "(default: None)", "(default: False)"
    on every switch and "(default: [])"."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "%(default)" in text or not shows_default(action):
            return text
        if action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"
        return text


def shows_default(action: argparse.Action) -> bool:
    """Whether `action`'s help names its default: when it has one that tells something (not
    None, not a switch's state when not given, not an empty list)."""
    default = action.default
    if default is None or default is argparse.SUPPRESS:
        return False
    if action.nargs == 0 and default != action.const:
        return False  # --json, --no-wait: off unless given (but on when set by the environment)
    return not (isinstance(default, list | tuple | set | dict) and not default)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose help, and its subcommands' (they are made of the parser's
    class), says the options' defaults."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def subcommands(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """`parser` and every parser of its subcommands, theirs too, depth first (an alias's
    parser once)."""
    seen: set[int] = set()
    stack = [parser]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        for action in current._actions:
            if isinstance(action, argparse._SubParsersAction):
                stack.extend(reversed(list(action.choices.values())))


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The `shell` completion script of `parser`'s command. Values of options named for a file
    (`file`, `*_file`) complete as paths, of those named for a directory (`*_dir`) as
    directories: the names say what they are, so no option needs marking by hand."""
    import shtab

    for command in subcommands(parser):
        for action in command._actions:
            if action.nargs == 0 or action.choices is not None or hasattr(action, "complete"):
                continue
            if action.dest == "file" or action.dest.endswith("_file"):
                action.complete = shtab.FILE  # type: ignore[attr-defined]
            elif action.dest.endswith("_dir"):
                action.complete = shtab.DIRECTORY  # type: ignore[attr-defined]
    return shtab.complete(parser, shell)
