"""Where a client finds its brokers and its credentials (docs/security.md, "Clients:
authentication and authorization"): explicit arguments, the environment, or a context of the
client configuration file, in that order, each setting on its own.

The token, the first found:

1. an explicit token (`AsyncClient(token=...)`, Spark's option `token`);
2. an explicit token file (`token_file=`, the CLI's `--token-file`, Spark's `tokenFile`);
3. an explicit context (`context=`, `--context`, Spark's `context`): its `token` or `token-file`;
4. `$LAMINAR_TOKEN`;
5. `$LAMINAR_TOKEN_FILE`;
6. the context `$LAMINAR_CONTEXT` names, else the file's `current-context`: its token;
7. none: requests go without a token (only a broker run with --allow-anonymous serves them).

The brokers (the CLI's, and `AsyncClient`'s when it is given none) and the CA file (for
https:// brokers) follow the same order: `--brokers` / `--ca-file`, the explicit context,
`$LAMINAR_BROKERS` / `$LAMINAR_CA_FILE`, the environment's or current context. The brokers are
a list (comma-separated in a flag or variable) and any one that answers will do, as a Kafka
client's bootstrap servers: one broker down fails nothing. Where none is given the CLI uses
DEFAULT_BROKERS, the three brokers `laminar local-cluster up` starts by default, and so does
`AsyncClient()`.

The configuration file is `$LAMINAR_CONFIG`, else `$XDG_CONFIG_HOME/laminar/config.yaml`, else
`~/.config/laminar/config.yaml`; a missing file is no context at all:

    current-context: local
    contexts:
      - name: local
        brokers: [http://127.0.0.11:7070, http://127.0.0.12:7070]
        token-file: laminar-data/token          # relative: to this file's directory
      - name: prod
        brokers: https://laminar.example.com:7070
        token-file: /var/run/secrets/laminar/client-token
        ca-file: /etc/laminar/ca.crt
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from laminar.credentials import CredentialsError, read_token_file

TOKEN_ENV = "LAMINAR_TOKEN"
TOKEN_FILE_ENV = "LAMINAR_TOKEN_FILE"
CONTEXT_ENV = "LAMINAR_CONTEXT"
CONFIG_ENV = "LAMINAR_CONFIG"
BROKERS_ENV = "LAMINAR_BROKERS"
CA_FILE_ENV = "LAMINAR_CA_FILE"
_CONTEXT_FIELDS = {"name", "brokers", "token", "token-file", "ca-file"}
#: the CLI's brokers when none are given: `laminar local-cluster up`'s with its defaults (broker
#: i on 127.0.0.<10+i>, the API on port 7070, HTTPS), all three, so that one down fails nothing
DEFAULT_BROKERS = (
    "https://127.0.0.11:7070",
    "https://127.0.0.12:7070",
    "https://127.0.0.13:7070",
)


class ClientConfigError(ValueError):
    """A token file, the configuration file or a context is unusable (the message says why)."""


@dataclass(frozen=True)
class Context:
    name: str
    brokers: tuple[str, ...] = ()
    token: str | None = field(default=None, repr=False)
    token_file: str | None = None
    ca_file: str | None = None
    source: str = ""

    def read_token(self) -> str | None:
        if self.token is not None:
            return self.token
        if self.token_file is not None:
            return _read(self.token_file, f"token-file of context {self.name!r} ({self.source})")
        return None


def config_path(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get(CONFIG_ENV):
        return Path(env[CONFIG_ENV]).expanduser()
    base = env.get("XDG_CONFIG_HOME") or str(Path("~/.config").expanduser())
    return Path(base) / "laminar" / "config.yaml"


def load_config(path: Path) -> tuple[str | None, dict[str, Context]]:
    """The current context's name and every context of the configuration file at `path` (no
    file: none)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None, {}
    except (OSError, UnicodeDecodeError) as e:
        raise ClientConfigError(f"cannot read the client configuration {path}: {e}") from None
    try:
        document = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise ClientConfigError(f"the client configuration {path} is not YAML: {e}") from None
    if not isinstance(document, dict) or set(document) - {"current-context", "contexts"}:
        raise ClientConfigError(
            f"the client configuration {path}: want current-context and contexts (a list)"
        )
    contexts: dict[str, Context] = {}
    for n, item in enumerate(document.get("contexts") or []):
        context = _context(item, f"{path}: contexts[{n}]", path.parent)
        contexts[context.name] = context
    current = document.get("current-context")
    if current is not None and not isinstance(current, str):
        raise ClientConfigError(f"the client configuration {path}: current-context is a name")
    return current, contexts


def _context(item: Any, where: str, directory: Path) -> Context:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise ClientConfigError(f"{where}: a context is a mapping with a name")
    unknown = set(item) - _CONTEXT_FIELDS
    if unknown:
        raise ClientConfigError(f"{where}: unknown fields {sorted(map(str, unknown))}")
    if "token" in item and "token-file" in item:
        raise ClientConfigError(f"{where}: give token or token-file, not both")
    brokers = item.get("brokers") or ()
    if isinstance(brokers, str):
        brokers = [b for b in brokers.split(",") if b.strip()]
    if not isinstance(brokers, list | tuple) or not all(isinstance(b, str) for b in brokers):
        raise ClientConfigError(f"{where}: brokers is a list of URLs (or one, comma-separated)")
    for key in ("token", "token-file", "ca-file"):
        if item.get(key) is not None and not isinstance(item[key], str):
            raise ClientConfigError(f"{where}: {key} must be a string")

    def path_of(key: str) -> str | None:
        value = item.get(key)
        return None if value is None else str(directory / Path(value).expanduser())

    return Context(
        name=item["name"],
        brokers=tuple(b.strip() for b in brokers),
        token=item.get("token"),
        token_file=path_of("token-file"),
        ca_file=path_of("ca-file"),
        source=where,
    )


def find_context(
    name: str | None = None, environ: Mapping[str, str] | None = None
) -> Context | None:
    """Context `name` (ClientConfigError if there is none), or without a name the context
    `$LAMINAR_CONTEXT` names, else the current context (None when there is none)."""
    env = os.environ if environ is None else environ
    path = config_path(env)
    explicit = name or env.get(CONTEXT_ENV) or None
    current, contexts = load_config(path)
    wanted = explicit or current
    if wanted is None:
        return None
    if wanted not in contexts:
        raise ClientConfigError(
            f"no context {wanted!r} in {path} (contexts: {', '.join(sorted(contexts)) or 'none'})"
        )
    return contexts[wanted]


def _read(path: str, what: str) -> str:
    try:
        return read_token_file(path, what)
    except CredentialsError as e:
        raise ClientConfigError(str(e)) from None


@dataclass(frozen=True)
class Settings:
    """What a client uses, resolved (`resolve`)."""

    brokers: tuple[str, ...] = ()
    token: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    #: where the token came from (for messages: never the token itself)
    token_source: str = "none"


class _Resolver:
    """The explicit context (read at once) and the environment's or current one (read only
    when a setting is still missing)."""

    def __init__(self, context: str | None, environ: Mapping[str, str]) -> None:
        self.env = environ
        self.explicit = context is not None and context != ""
        self.chosen = find_context(context, environ) if self.explicit else None
        self._ambient: list[Context | None] = []

    def ambient(self) -> Context | None:
        if self.explicit:
            return None  # an explicit context replaces the environment's and the current one
        if not self._ambient:
            self._ambient.append(find_context(None, self.env))
        return self._ambient[0]

    def token(
        self, token: str | None, token_file: str | os.PathLike[str] | None
    ) -> tuple[str | None, str]:
        env, chosen = self.env, self.chosen
        if token is not None:
            return token, "the token given"
        if token_file is not None:
            return _read(str(token_file), "token file"), f"the token file {token_file}"
        if chosen is not None and (chosen.token or chosen.token_file):
            return chosen.read_token(), f"context {chosen.name!r}"
        if env.get(TOKEN_ENV, "").strip():
            return env[TOKEN_ENV].strip(), f"${TOKEN_ENV}"
        if env.get(TOKEN_FILE_ENV):
            path = env[TOKEN_FILE_ENV]
            return _read(path, f"token file {path} (${TOKEN_FILE_ENV})"), f"${TOKEN_FILE_ENV}"
        current = self.ambient()
        if current is not None and (current.token or current.token_file):
            return current.read_token(), f"context {current.name!r}"
        return None, "none"

    def brokers(self, brokers: str | None) -> tuple[str, ...]:
        if brokers:
            return _split(brokers)
        if self.chosen is not None and self.chosen.brokers:
            return self.chosen.brokers
        if self.env.get(BROKERS_ENV):
            return _split(self.env[BROKERS_ENV])
        current = self.ambient()
        return current.brokers if current is not None else ()

    def ca_file(self, ca_file: str | os.PathLike[str] | None) -> str | None:
        if ca_file is not None:
            return str(ca_file)
        if self.chosen is not None and self.chosen.ca_file:
            return self.chosen.ca_file
        if self.env.get(CA_FILE_ENV):
            return self.env[CA_FILE_ENV]
        current = self.ambient()
        return current.ca_file if current is not None else None


def _split(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def resolve(
    *,
    brokers: str | None = None,
    token: str | None = None,
    token_file: str | os.PathLike[str] | None = None,
    context: str | None = None,
    ca_file: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Each setting from the first place that has it (the module's doc); the configuration
    file is read only for an explicit context, or when a setting is still missing after the
    explicit ones and the environment (ClientConfigError for anything unreadable on the way)."""
    resolver = _Resolver(context, os.environ if environ is None else environ)
    found, source = resolver.token(token, token_file)
    return Settings(resolver.brokers(brokers), found, resolver.ca_file(ca_file), source)


def resolve_token(
    token: str | None = None,
    token_file: str | os.PathLike[str] | None = None,
    context: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> str | None:
    """The token alone (see `resolve`)."""
    if token is not None:
        return token
    resolver = _Resolver(context, os.environ if environ is None else environ)
    return resolver.token(None, token_file)[0]
