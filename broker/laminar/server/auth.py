"""Who may call what on the HTTP API (docs/security.md, "Clients: authentication and
authorization").

Every `/v1/...` request is authenticated (`Authenticator.authenticate`: its bearer token, hashed
and looked up among the known hashes, or found among the tokens that authenticated before; 401
`unauthorized` without a known one),
then authorized by its route's rule in `RULES` (403 `forbidden`): the `access` of its
`laminar.contract` route. A route served without a rule is a bug that `check_routes` refuses
when the application is built. /healthz, /readyz and /metrics are open (their `access` is None).

The principals: those of the credentials file (`--credentials-file`, re-read on SIGHUP and
every RELOAD_INTERVAL_S when it changed; a file that became invalid is logged and the previous
principals stay), the compatibility admin token (`--token-file`), the brokers' own
`laminar-broker` (its token derived from the cluster secret: internal calls and the dead-letter
mover), and with `--allow-anonymous` the admin `anonymous` for requests without a token.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Iterable
from pathlib import Path

from aiohttp import web

from ..contract import ROUTES
from ..credentials import (
    ANONYMOUS_PRINCIPAL,
    INTERNAL_PRINCIPAL,
    TOKEN_FILE_PRINCIPAL,
    Action,
    CredentialsError,
    Principal,
    Role,
    load,
    parse,
    token_hash,
)
from .http import ApiError

log = logging.getLogger(__name__)
#: How often the credentials file is looked at for changes (SIGHUP: at once).
RELOAD_INTERVAL_S = 3.0
PRINCIPAL_KEY = web.RequestKey("principal", Principal)
#: (method, route) -> what it does. HEAD follows GET. The route's {topic}, when it has one, is
#: the topic the action is on.
RULES: dict[tuple[str, str], Action] = {
    (route.method, route.path): route.access for route in ROUTES if route.access is not None
}
OPEN_ROUTES = {route.path for route in ROUTES if route.access is None}
VERBS = {
    Action.DESCRIBE: "describe",
    Action.PRODUCE: "append to",
    Action.CONSUME: "read from (or use the consumer groups of)",
}


def rule_of(method: str, route: str) -> Action | None:
    return RULES.get(("GET" if method == "HEAD" else method, route))


def check_routes(router: web.UrlDispatcher) -> None:
    """Every route is open (OPEN_ROUTES) or has its rule, and every rule its route (RuntimeError
    otherwise: a route nobody decided about must not be served)."""
    served = set()
    for route in router.routes():
        path = route.resource.canonical if route.resource is not None else ""
        if route.method == "HEAD" or path in OPEN_ROUTES:
            continue
        if rule_of(route.method, path) is None:
            raise RuntimeError(
                f"{route.method} {path} has no authorization rule: declare the route, with "
                "its access, in laminar/contract.py (and docs/security.md's table)"
            )
        served.add((route.method, path))
    missing = set(RULES) - served
    if missing:
        raise RuntimeError(f"authorization rules for routes that do not exist: {sorted(missing)}")


def unauthorized(message: str) -> ApiError:
    return ApiError(
        401, "unauthorized", message, headers={"WWW-Authenticate": 'Bearer realm="laminar"'}
    )


class Authenticator:
    """The principals a broker knows, and the check of each /v1 request."""

    def __init__(
        self,
        *,
        internal_token: str,
        credentials_file: Path | None = None,
        token: str | None = None,
        allow_anonymous: bool = False,
    ) -> None:
        self.internal_token = internal_token
        self.credentials_file = credentials_file
        #: --allow-anonymous: requests without a token act as this admin
        self.anonymous = (
            Principal(ANONYMOUS_PRINCIPAL, frozenset({Role.ADMIN})) if allow_anonymous else None
        )
        admin = frozenset({Role.ADMIN})
        #: the brokers' own principal, and the compatibility admin token's
        self._fixed = [Principal(INTERNAL_PRINCIPAL, admin, ("*",), (token_hash(internal_token),))]
        if token is not None:
            self._fixed.append(Principal(TOKEN_FILE_PRINCIPAL, admin, ("*",), (token_hash(token),)))
        self._file_text: str | None = None
        #: each known SHA-256 digest's principal
        self._by_digest: dict[bytes, Principal] = {}
        #: the tokens that authenticated since the principals last changed, so that a token is
        #: hashed once, not on every request. Only a token whose digest is known enters, so
        #: this holds at most one token per known digest.
        self._tokens: dict[str, Principal] = {}
        self.principals: list[Principal] = []
        from_file: list[Principal] = []
        if credentials_file is not None:
            try:
                self._file_text = credentials_file.read_text()
            except (OSError, UnicodeDecodeError):
                load(credentials_file)  # raises CredentialsError, with the reason
                raise
            from_file = parse(self._file_text, f"the credentials file {credentials_file}")
        self._install(from_file)
        self.reloads = 0
        if credentials_file is not None:
            log.info("credentials: %d principals from %s", len(from_file), credentials_file)

    def _install(self, from_file: Iterable[Principal]) -> None:
        principals = [*self._fixed, *from_file]
        self._by_digest = {
            bytes.fromhex(digest.removeprefix("sha256:")): principal
            for principal in principals
            for digest in principal.hashes
        }
        self._tokens = {}  # (a token retired or a principal changed: hashed and found again)
        self.principals = principals

    def reload(self) -> bool:
        """Re-read the credentials file if it changed (True when new principals are in use).
        A file that cannot be read or is invalid is logged, and the principals in use stay."""
        path = self.credentials_file
        if path is None:
            return False
        try:
            text = path.read_text()
            if text == self._file_text:
                return False
            principals = parse(text, f"the credentials file {path}")
        except (OSError, UnicodeDecodeError) as e:
            log.error("credentials: cannot read %s (%s); keeping the principals in use", path, e)
            return False
        except CredentialsError as e:
            log.error("credentials: %s; keeping the principals in use", e)
            self._file_text = text  # logged once, until it changes again
            return False
        self._install(principals)
        self._file_text = text
        self.reloads += 1
        log.info("credentials: %d principals from %s (reloaded)", len(principals), path)
        return True

    async def watch(self, interval_s: float = RELOAD_INTERVAL_S) -> None:
        """Re-read the credentials file whenever it changed, until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            self.reload()

    def authenticate(self, header: str | None) -> Principal:
        """The principal of a request's Authorization header (ApiError 401 when unknown)."""
        if header is None:
            if self.anonymous is not None:
                return self.anonymous
            raise unauthorized("this API needs a bearer token: Authorization: Bearer <token>")
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise unauthorized("the Authorization header must be: Bearer <token>")
        # (dictionaries hash their keys with a per-process random key: how long a lookup takes
        # tells nothing of how a wrong token resembles a known one)
        found = self._tokens.get(token)
        if found is not None:
            return found
        digest = hashlib.sha256(token.encode(errors="surrogateescape")).digest()
        found = self._by_digest.get(digest)
        if found is None:
            raise unauthorized("unknown bearer token")
        self._tokens[token] = found
        return found

    def authorize(self, request: web.Request) -> Principal:
        """Authenticate and authorize one /v1 request (ApiError 401 or 403); its principal."""
        principal = self.authenticate(request.headers.get("Authorization"))
        match = request.match_info
        if match.http_exception is not None:
            return principal  # no such route (404, 405): nothing to authorize
        action = rule_of(request.method, match.route.resource.canonical)  # type: ignore[union-attr]
        if action is None:  # check_routes makes this unreachable
            raise ApiError(403, "forbidden", f"no rule authorizes {request.method} {request.path}")
        topic = match.get("txn_id") if action is Action.TRANSACT else match.get("topic")
        if not principal.may(action, topic):
            if action is Action.INTERNAL:
                why = f"{request.method} {request.path[:100]}: only the brokers may"
            elif action is Action.ADMIN or topic is None:
                why = f"{request.method} {request.path[:100]}: it needs the admin role"
            elif action is Action.TRANSACT:
                why = f"use the transactional id {topic[:60]!r} (a producer in scope may)"
            else:
                why = f"{VERBS[action]} topic {topic[:60]!r}"
            raise ApiError(403, "forbidden", f"{principal.describe()} may not {why}")
        return principal
