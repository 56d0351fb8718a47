"""The console's sessions (laminar.server.console.session): cookies only the cluster can sign,
expiring, bound to the token they were opened with; CSRF tokens bound to the session; the
login limiter. Pure: times are given."""

from __future__ import annotations

from laminar.credentials import Principal, Role, token_hash
from laminar.server.console.session import (
    MAX_COOKIE_CHARS,
    LoginLimiter,
    Sessions,
    find_principal,
    session_key,
)

SECRET = b"a cluster secret of thirty-two bytes or more"
TOKEN = "lmq_" + "t" * 43
NOW = 1_800_000_000.0


def sessions(ttl_s: int = 3600, cluster: str = "c1", secret: bytes = SECRET) -> Sessions:
    return Sessions(session_key(secret, cluster), ttl_s)


def admin(*tokens: str) -> Principal:
    return Principal("ops", frozenset({Role.ADMIN}), ("*",), tuple(token_hash(t) for t in tokens))


def test_a_session_is_verified_until_it_expires() -> None:
    cookie = sessions().issue("ops", TOKEN, NOW)
    session = sessions().verify(cookie, NOW + 3599)  # (another broker: the same key)
    assert session is not None and session.principal == "ops" and session.cookie == cookie
    assert session.expires_s == int(NOW) + 3600
    assert sessions().verify(cookie, NOW + 3600) is None


def test_only_the_clusters_key_signs_sessions() -> None:
    cookie = sessions().issue("ops", TOKEN, NOW)
    assert sessions(cluster="c2").verify(cookie, NOW) is None
    assert sessions(secret=SECRET + b"!").verify(cookie, NOW) is None
    version, payload, mac = cookie.split(".")
    other = sessions().issue("root", TOKEN, NOW).split(".")[1]
    for forged in (
        f"{version}.{other}.{mac}",  # another payload under this signature
        f"v2.{payload}.{mac}",
        f"{version}.{payload}.{mac[:-2]}",
        f"{version}.{payload}",
        f"{version}.{payload}.{mac}.",
        "",
        "...",
        "v1.!!!.???",
        "v1." + "A" * MAX_COOKIE_CHARS,
    ):
        assert sessions().verify(forged, NOW) is None, forged
    assert sessions().verify(None, NOW) is None


def test_a_session_holds_while_its_token_is_its_principals() -> None:
    issuer = sessions()
    session = issuer.verify(issuer.issue("ops", TOKEN, NOW), NOW)
    assert session is not None
    assert issuer.holds(session, admin(TOKEN))
    assert issuer.holds(session, admin("lmq_" + "n" * 43, TOKEN))  # (rotation: still listed)
    assert not issuer.holds(session, admin("lmq_" + "n" * 43))  # (retired)
    assert not issuer.holds(session, admin())
    anonymous = issuer.verify(issuer.issue("anonymous", None, NOW), NOW)
    assert anonymous is not None
    assert issuer.holds(anonymous, Principal("anonymous", frozenset({Role.ADMIN})))
    assert not issuer.holds(anonymous, admin(TOKEN))  # (no token: not a token's principal)


def test_the_csrf_token_is_the_sessions() -> None:
    issuer = sessions()
    one = issuer.verify(issuer.issue("ops", TOKEN, NOW), NOW)
    two = issuer.verify(issuer.issue("ops", TOKEN, NOW), NOW)
    assert one is not None and two is not None
    token = issuer.csrf_token(one)
    assert issuer.check_csrf(one, token)
    assert not issuer.check_csrf(two, token)  # (each login its own)
    assert not issuer.check_csrf(one, None) and not issuer.check_csrf(one, "")
    assert not sessions(cluster="c2").check_csrf(one, token)


def test_failed_logins_are_limited_per_address() -> None:
    limiter = LoginLimiter(burst=3, refill_s=10.0, tracked=2)
    for _ in range(3):
        assert limiter.allowed("a", NOW)
        limiter.failed("a", NOW)
    assert not limiter.allowed("a", NOW)
    assert limiter.retry_after_s("a", NOW) == 10
    assert limiter.allowed("b", NOW)  # (others are not)
    assert not limiter.allowed("a", NOW + 9.9)
    assert limiter.allowed("a", NOW + 10)
    limiter.failed("b", NOW)
    limiter.failed("c", NOW)  # (two tracked: "a", the oldest, is forgotten)
    assert limiter.allowed("a", NOW) and len(limiter._buckets) == 2


def test_principals_are_found_by_name() -> None:
    first, second = admin(TOKEN), Principal("app", frozenset({Role.CONSUMER}))
    assert find_principal([first, second], "app") is second
    assert find_principal([first, second], "nobody") is None
