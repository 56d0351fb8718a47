"""The web console's sessions: signed cookies, their CSRF tokens, and the login limiter.

A session is a cookie the broker signs (HMAC-SHA256) with a key derived from the cluster
secret under a label of its own, so that every broker of the cluster accepts a session any of
them issued (the console works through any broker) and the key tells nothing about the
secret or the other keys derived from it (the brokers' internal token). A session names its
principal, its expiry, and a tag of the token it was opened with: each request resolves the
principal by name from the broker's current credentials, and a principal removed, or a token
retired, since the login ends the session there.

Pure: no clock (callers pass `now_s`), no I/O.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import orjson

from ...credentials import Principal, token_hash

COOKIE_NAME = "laminar_console"
#: How long a session lasts after its login.
SESSION_TTL_S = 8 * 3600
#: A cookie longer than this is not ours (and is not parsed).
MAX_COOKIE_CHARS = 1024
_VERSION = "v1"
_KEY_LABEL = b"laminar console session v1\x00"
#: The tag of a session opened without a token (--allow-anonymous).
NO_TOKEN = ""
#: Failed logins one client address may make in a burst, and how fast that allowance
#: comes back: a token (256 random bits) cannot be guessed anyway; this keeps logs and CPU
#: quiet under a guessing script.
LOGIN_BURST = 10
LOGIN_REFILL_S = 6.0
#: Client addresses the limiter remembers (the least recently seen are forgotten first).
LOGIN_TRACKED_ADDRESSES = 4096


def session_key(secret: bytes, cluster_id: str) -> bytes:
    """The console's signing key: HMAC-SHA256 of the cluster secret over a label of its own."""
    return hmac.new(secret, _KEY_LABEL + cluster_id.encode(), hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class Session:
    """A verified session cookie."""

    principal: str
    expires_s: int
    #: the tag of the login's token (`Sessions.token_tag`), NO_TOKEN for anonymous
    token_tag: str
    #: the cookie's value, which the CSRF token is bound to
    cookie: str


class Sessions:
    """Issues and checks the console's session cookies and CSRF tokens."""

    def __init__(self, key: bytes, ttl_s: int = SESSION_TTL_S) -> None:
        self._key = key
        self.ttl_s = ttl_s

    def _mac(self, purpose: bytes, data: bytes) -> bytes:
        return hmac.new(self._key, purpose + b"\x00" + data, hashlib.sha256).digest()

    def token_tag(self, digest: str) -> str:
        """What a session keeps of its token: a keyed tag of the token's hash
        (`sha256:<hex>`), enough to tell whether that token is still one of its principal's."""
        return _b64(self._mac(b"token", digest.encode())[:12])

    def issue(self, principal: str, token: str | None, now_s: float) -> str:
        """A new session cookie for `principal`, logged in with `token` (None: anonymous)."""
        tag = NO_TOKEN if token is None else self.token_tag(token_hash(token))
        payload = orjson.dumps(
            {
                "p": principal,
                "e": int(now_s) + self.ttl_s,
                "t": tag,
                "n": secrets.token_urlsafe(9),
            }
        )
        body = f"{_VERSION}.{_b64(payload)}"
        return f"{body}.{_b64(self._mac(b'session', body.encode()))}"

    def verify(self, cookie: str | None, now_s: float) -> Session | None:
        """The session of a cookie: None unless it is one this cluster signed, unexpired."""
        if not cookie or len(cookie) > MAX_COOKIE_CHARS:
            return None
        version, _, rest = cookie.partition(".")
        payload_text, _, mac_text = rest.partition(".")
        if version != _VERSION or not payload_text or not mac_text:
            return None
        body = f"{version}.{payload_text}"
        try:
            mac = _unb64(mac_text)
            payload = orjson.loads(_unb64(payload_text))
        except ValueError:  # (binascii.Error and orjson's JSONDecodeError are ValueErrors)
            return None
        if not hmac.compare_digest(mac, self._mac(b"session", body.encode())):
            return None
        if not isinstance(payload, dict):
            return None
        name, expires, tag = payload.get("p"), payload.get("e"), payload.get("t")
        if not (isinstance(name, str) and isinstance(tag, str) and type(expires) is int):
            return None
        if expires <= now_s:
            return None
        return Session(name, expires, tag, cookie)

    def holds(self, session: Session, principal: Principal) -> bool:
        """Is the session's token still one of `principal`'s (always, for a session opened
        without a token: the anonymous admin's, which exists while --allow-anonymous does)?"""
        if session.token_tag == NO_TOKEN:
            return not principal.hashes
        tags = (self.token_tag(digest) for digest in principal.hashes)
        return any(hmac.compare_digest(session.token_tag, tag) for tag in tags)

    def csrf_token(self, session: Session) -> str:
        """The CSRF token of the session's forms: a keyed MAC of the session cookie (a page
        of another site can neither read the cookie nor compute this)."""
        return _b64(self._mac(b"csrf", session.cookie.encode()))

    def check_csrf(self, session: Session, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(token, self.csrf_token(session))


class LoginLimiter:
    """Failed logins per client address: a bucket of LOGIN_BURST tries, one back every
    LOGIN_REFILL_S."""

    def __init__(
        self,
        burst: int = LOGIN_BURST,
        refill_s: float = LOGIN_REFILL_S,
        tracked: int = LOGIN_TRACKED_ADDRESSES,
    ) -> None:
        self.burst = burst
        self.refill_s = refill_s
        self.tracked = tracked
        #: address -> (tries left, when counted)
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def _left(self, address: str, now_s: float) -> float:
        left, at = self._buckets.get(address, (float(self.burst), now_s))
        return min(float(self.burst), left + max(0.0, now_s - at) / self.refill_s)

    def allowed(self, address: str, now_s: float) -> bool:
        """May `address` try to log in now?"""
        return self._left(address, now_s) >= 1.0

    def failed(self, address: str, now_s: float) -> None:
        """Count a failed login of `address`."""
        self._buckets[address] = (max(0.0, self._left(address, now_s) - 1.0), now_s)
        self._buckets.move_to_end(address)
        while len(self._buckets) > self.tracked:
            self._buckets.popitem(last=False)

    def retry_after_s(self, address: str, now_s: float) -> int:
        """Whole seconds until `address` may try again."""
        missing = 1.0 - self._left(address, now_s)
        return max(1, int(missing * self.refill_s + 0.999))


def find_principal(principals: Iterable[Principal], name: str) -> Principal | None:
    """The principal named `name` (the first, should a file list one twice)."""
    return next((p for p in principals if p.name == name), None)
