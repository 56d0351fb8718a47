"""Client credentials (docs/security.md, "Clients: authentication and authorization"): bearer
tokens, the brokers' credentials file, and what a principal may do.

A token is `lmq_` and 43 characters of URL-safe base64 (256 random bits). The brokers never
store one: the credentials file lists each principal's tokens as `sha256:<hex>`, and a request's
token is hashed and compared, in constant time, with every listed hash.

    # laminar credentials file (YAML; `laminar credentials add FILE ...` writes it)
    principals:
      - name: ops
        role: admin                      # may do everything
        tokens: [sha256:9f86d0...]
      - name: orders-app
        roles: [producer, consumer]
        topics: [orders, orders.dlq]     # exact names, prefixes ending in *, or * for all
        tokens: [sha256:1b4f0e..., sha256:60303a...]   # several: rotation without downtime

Roles: `admin` may do everything (topic and node administration, every topic's records and
queues); `producer` may append to the topics in its scope; `consumer` may read them and use
their consumer groups (acquire, accept, release, reject, renew, describe). Both may describe the
topics in their scope, list topics (they see only those in their scope) and read the cluster's
membership (`GET /v1/cluster`, which clients route with).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

TOKEN_PREFIX = "lmq_"
TOKEN_BYTES = 32
HASH_PREFIX = "sha256:"
HASH = re.compile(r"sha256:[0-9a-f]{64}")
#: A token given in plain text (`laminar serve --token-file`) must be at least this long: a
#: short one can be guessed over the network.
MIN_TOKEN_CHARS = 16
PRINCIPAL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:-]{0,99}")
#: A topic scope: `*` (every topic), a topic name, or a topic-name prefix followed by `*`.
TOPIC_PATTERN = re.compile(
    r"\*|[A-Za-z0-9][A-Za-z0-9._-]{0,199}|[A-Za-z0-9][A-Za-z0-9._-]{0,198}\*"
)
#: The principals the brokers make themselves (never in a credentials file).
INTERNAL_PRINCIPAL = "laminar-broker"
ANONYMOUS_PRINCIPAL = "anonymous"
TOKEN_FILE_PRINCIPAL = "token-file"
_INTERNAL_LABEL = "laminar internal API token v1\x00"


class CredentialsError(ValueError):
    """A credentials file (or token) is unusable; the message says where and why."""


class Role(StrEnum):
    ADMIN = "admin"
    PRODUCER = "producer"
    CONSUMER = "consumer"


class Action(StrEnum):
    """What a request does, as authorization sees it (every route's `access`, laminar.contract)."""

    #: read the cluster's membership (`GET /v1/cluster`): any principal
    CLUSTER = "cluster"
    #: list topics: any principal, who sees the topics in its scope
    LIST = "list"
    #: describe a topic: a producer or consumer of it
    DESCRIBE = "describe"
    #: append records to a topic
    PRODUCE = "produce"
    #: read a topic's records, use its consumer groups
    CONSUME = "consume"
    #: run a transactional id's transactions (its partitions need PRODUCE each): a producer
    #: whose scope holds the id
    TRANSACT = "transact"
    #: create, alter, delete topics; drain, weigh, hand off nodes; list a node's replicas
    ADMIN = "admin"
    #: the brokers' own calls (transaction markers): their principal alone, not an admin
    INTERNAL = "internal"


@dataclass(frozen=True)
class Principal:
    """Who a request comes from, and what it may do."""

    name: str
    roles: frozenset[Role]
    #: topic scopes (TOPIC_PATTERN); admins: ("*",)
    topics: tuple[str, ...] = ("*",)
    #: the hashes of its tokens (`sha256:<hex>`)
    hashes: tuple[str, ...] = field(default=(), repr=False)

    @property
    def admin(self) -> bool:
        return Role.ADMIN in self.roles

    def in_scope(self, topic: str) -> bool:
        """Is `topic` one of the topics this principal's scopes name?"""
        if self.admin:
            return True
        for pattern in self.topics:
            if pattern == "*" or pattern == topic:
                return True
            if pattern.endswith("*") and topic.startswith(pattern[:-1]):
                return True
        return False

    def may(self, action: Action, topic: str | None = None) -> bool:
        """May this principal do `action` (on `topic`, for the topic actions; on the
        transactional id, for TRANSACT: ids are scoped as topic names are)?"""
        if action is Action.INTERNAL:
            return self.name == INTERNAL_PRINCIPAL
        if self.admin or action in (Action.CLUSTER, Action.LIST):
            return True
        if action is Action.ADMIN or topic is None or not self.in_scope(topic):
            return False
        if action in (Action.PRODUCE, Action.TRANSACT):
            return Role.PRODUCER in self.roles
        if action is Action.CONSUME:
            return Role.CONSUMER in self.roles
        return bool(self.roles & {Role.PRODUCER, Role.CONSUMER})  # DESCRIBE

    def describe(self) -> str:
        roles = ",".join(sorted(self.roles))
        return f"principal {self.name!r} ({roles})"


# ---- tokens ------------------------------------------------------------------------------------


def new_token() -> str:
    """A fresh random token: `lmq_` and 256 random bits, URL-safe base64."""
    return TOKEN_PREFIX + secrets.token_urlsafe(TOKEN_BYTES)


def token_hash(token: str) -> str:
    """What a credentials file lists for `token`: `sha256:` and the hex SHA-256 of its UTF-8."""
    return HASH_PREFIX + hashlib.sha256(token.encode()).hexdigest()


def derive_token(key: bytes, label: str) -> str:
    """A token derived from `key` for `label` (HMAC-SHA256): whoever holds the key computes it
    again, and the token tells nothing about the key or other labels' tokens."""
    digest = hmac.new(key, label.encode(), hashlib.sha256).digest()
    return TOKEN_PREFIX + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def internal_token(secret: bytes, cluster_id: str) -> str:
    """The token the brokers of a cluster use with each other's API (principal
    `laminar-broker`, an admin): derived from the cluster secret, which every broker has."""
    return derive_token(secret, _INTERNAL_LABEL + cluster_id)


def token_problem(token: str) -> str | None:
    """Why a token given in plain text is unusable, or None."""
    if len(token) < MIN_TOKEN_CHARS:
        return f"is {len(token)} characters long; at least {MIN_TOKEN_CHARS} are required"
    if any(c.isspace() for c in token) or not token.isprintable():
        return "contains whitespace or unprintable characters"
    return None


def read_token_file(path: str | os.PathLike[str], what: str = "token file") -> str:
    """The token in a text file, without surrounding whitespace (CredentialsError if the file
    cannot be read, is empty or holds more than one word)."""
    try:
        text = Path(path).read_bytes().strip().decode()
    except OSError as e:
        raise CredentialsError(f"cannot read the {what} {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise CredentialsError(f"the {what} {path} is not UTF-8 text") from None
    if not text:
        raise CredentialsError(f"the {what} {path} is empty")
    if any(c.isspace() for c in text):
        raise CredentialsError(f"the {what} {path} holds more than one word")
    return text


# ---- the credentials file ----------------------------------------------------------------------

_PRINCIPAL_FIELDS = {"name", "role", "roles", "topics", "tokens"}


def parse(text: str, source: str = "the credentials") -> list[Principal]:
    """The principals of a credentials file's text (CredentialsError, naming `source` and the
    principal, for anything wrong: an unknown field is refused, never ignored)."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise CredentialsError(f"{source} is not valid YAML: {e}") from None
    if not isinstance(document, dict) or set(document) - {"principals", "version"}:
        raise CredentialsError(f'{source}: want a mapping with "principals" (a list)')
    if document.get("version", 1) != 1:
        raise CredentialsError(f"{source}: version {document['version']!r} is not 1")
    items = document.get("principals")
    if not isinstance(items, list):
        raise CredentialsError(f'{source}: "principals" must be a list')
    principals = [_principal(item, n, source) for n, item in enumerate(items)]
    names: set[str] = set()
    owners: dict[str, str] = {}  # token hash -> principal
    for principal in principals:
        if principal.name in names:
            raise CredentialsError(f"{source}: principal {principal.name!r} is listed twice")
        names.add(principal.name)
        for digest in principal.hashes:
            if digest in owners:
                raise CredentialsError(
                    f"{source}: principals {owners[digest]!r} and {principal.name!r} share a token"
                )
            owners[digest] = principal.name
    return principals


def _principal(item: Any, n: int, source: str) -> Principal:
    where = f"{source}: principals[{n}]"
    if not isinstance(item, dict):
        raise CredentialsError(f"{where} must be a mapping")
    name = item.get("name")
    if not isinstance(name, str) or not PRINCIPAL_NAME.fullmatch(name):
        raise CredentialsError(f"{where}: name must match {PRINCIPAL_NAME.pattern}")
    where = f"{source}: principal {name!r}"
    if name in (INTERNAL_PRINCIPAL, ANONYMOUS_PRINCIPAL):
        raise CredentialsError(f"{where}: the name is the brokers' own; choose another")
    unknown = set(item) - _PRINCIPAL_FIELDS
    if unknown:
        raise CredentialsError(f"{where}: unknown fields {sorted(map(str, unknown))}")
    if ("role" in item) == ("roles" in item):
        raise CredentialsError(f"{where}: give role (one) or roles (a list)")
    listed = [item["role"]] if "role" in item else item["roles"]
    if not isinstance(listed, list) or not listed:
        raise CredentialsError(f"{where}: roles must be a non-empty list")
    try:
        roles = frozenset(Role(r) for r in listed)
    except ValueError:
        raise CredentialsError(
            f"{where}: roles {listed!r}: each is one of {', '.join(r.value for r in Role)}"
        ) from None
    topics = item.get("topics")
    if Role.ADMIN in roles:
        if topics not in (None, ["*"]) or len(roles) > 1:
            raise CredentialsError(
                f"{where}: an admin may do everything, on every topic: give it no other role "
                "and no topics"
            )
        topics = ["*"]
    if not isinstance(topics, list) or not topics:
        raise CredentialsError(
            f"{where}: topics must list the topics it may use (names, prefixes ending in *, "
            "or * for all)"
        )
    for pattern in topics:
        if not isinstance(pattern, str) or not TOPIC_PATTERN.fullmatch(pattern):
            raise CredentialsError(
                f"{where}: topic scope {pattern!r} is not a topic name, a prefix ending in *, or *"
            )
    tokens = item.get("tokens")
    if not isinstance(tokens, list) or not tokens:
        raise CredentialsError(f"{where}: tokens must list at least one sha256:<hex> hash")
    for digest in tokens:
        if not isinstance(digest, str) or not HASH.fullmatch(digest):
            raise CredentialsError(
                f"{where}: {str(digest)[:12]!r}... is not a token hash (sha256: and 64 lowercase "
                "hex digits; never the token itself: `laminar credentials add` hashes it)"
            )
    if len(set(tokens)) != len(tokens):
        raise CredentialsError(f"{where}: a token hash is listed twice")
    return Principal(name, roles, tuple(topics), tuple(tokens))


def load(path: str | os.PathLike[str]) -> list[Principal]:
    """The principals of the credentials file at `path` (CredentialsError)."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise CredentialsError(f"cannot read the credentials file {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise CredentialsError(f"the credentials file {path} is not UTF-8 text") from None
    return parse(text, f"the credentials file {path}")


def entry(
    name: str, roles: Iterable[Role | str], topics: Sequence[str] = (), hashes: Sequence[str] = ()
) -> dict[str, Any]:
    """One principal as a credentials file lists it."""
    listed = sorted(Role(r).value for r in roles)
    document: dict[str, Any] = {"name": name}
    if len(listed) == 1:
        document["role"] = listed[0]
    else:
        document["roles"] = listed
    if Role.ADMIN not in listed:
        document["topics"] = list(topics)
    document["tokens"] = list(hashes)
    return document


def dump(entries: Sequence[Mapping[str, Any]]) -> str:
    """A credentials file's text (checked: it parses)."""
    text = (
        '# Laminar client credentials: docs/security.md, "Clients: authentication and '
        'authorization"\n'
        + yaml.safe_dump({"principals": [dict(e) for e in entries]}, sort_keys=False)
    )
    parse(text)
    return text


def write_new_file(path: str | os.PathLike[str], text: str) -> None:
    """Create `path` with `text`, readable by its owner only (FileExistsError if it exists)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(text)


def replace_file(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` to `path` atomically (a new file, then rename), keeping its mode (600 for a
    new one): a broker re-reading it meanwhile sees the old file or the new, never half."""
    target = Path(path)
    mode = target.stat().st_mode & 0o777 if target.exists() else 0o600
    temporary = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(descriptor, "w") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


# ---- editing a credentials file ----------------------------------------------------------------


def _entries(path: Path) -> list[dict[str, Any]]:
    """The principals of the file at `path` as mappings (checked; none when it is missing)."""
    if not path.exists():
        return []
    load(path)  # valid, or CredentialsError
    document = yaml.safe_load(path.read_text())
    return [dict(item) for item in document["principals"]]


def add_principal(
    path: str | os.PathLike[str],
    name: str,
    roles: Sequence[Role | str] = (),
    topics: Sequence[str] = (),
) -> str:
    """A new token for principal `name` in the credentials file at `path` (made, mode 600,
    when missing), returned (only its hash is written). A new principal needs `roles` (and
    `topics`, unless an admin); an existing one gets one more token (rotation: its old tokens
    stay valid until retired), and `roles` and `topics`, if given, must be its own."""
    target = Path(path)
    entries = _entries(target)
    token = new_token()
    existing = next((e for e in entries if e.get("name") == name), None)
    if existing is None:
        if not roles:
            raise CredentialsError(f"a new principal {name!r} needs a role")
        entries.append(entry(name, roles, topics, [token_hash(token)]))
    else:
        (principal,) = parse(dump([existing]))
        wanted = entry(name, roles or principal.roles, topics or principal.topics)
        have = entry(name, principal.roles, principal.topics)
        if wanted != have:
            raise CredentialsError(
                f"principal {name!r} exists with {principal.describe()} and topics "
                f"{list(principal.topics)}: edit {target} to change them"
            )
        existing["tokens"] = [*existing["tokens"], token_hash(token)]
    text = dump(entries)
    if target.exists():
        replace_file(target, text)
    else:
        write_new_file(target, text)
    return token


def retire_tokens(path: str | os.PathLike[str], name: str, keep: int = 1) -> int:
    """Keep only the newest `keep` tokens (the last listed) of principal `name`; how many were
    removed (the brokers refuse them once they re-read the file)."""
    if keep < 1:
        raise CredentialsError("keep at least one token (remove the principal to disable it)")
    target = Path(path)
    entries = _entries(target)
    existing = next((e for e in entries if e.get("name") == name), None)
    if existing is None:
        raise CredentialsError(f"no principal {name!r} in {target}")
    removed = max(0, len(existing["tokens"]) - keep)
    existing["tokens"] = existing["tokens"][-keep:]
    replace_file(target, dump(entries))
    return removed
