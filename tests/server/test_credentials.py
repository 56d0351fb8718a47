"""The credentials file, principals and their rights, the authenticator, and the `laminar
credentials` commands (laminar.credentials, laminar.server.auth)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from laminar.credentials import (
    INTERNAL_PRINCIPAL,
    Action,
    CredentialsError,
    Principal,
    Role,
    add_principal,
    derive_token,
    dump,
    entry,
    internal_token,
    load,
    new_token,
    parse,
    retire_tokens,
    token_hash,
)
from laminar.server.auth import RULES, Authenticator
from laminar.server.config import new_secret
from laminar.server.http import ApiError

LAMINAR = [sys.executable, "-m", "laminar"]
HASH = token_hash("lmq_x" * 9)


def test_tokens_are_random_and_only_their_hashes_are_kept() -> None:
    token = new_token()
    assert token.startswith("lmq_") and len(token) == 47 and token != new_token()
    assert token_hash(token).startswith("sha256:") and len(token_hash(token)) == 71
    assert token not in dump([entry("app", ["admin"], hashes=[token_hash(token)])])


def test_a_credentials_file_parses_into_principals() -> None:
    text = f"""
principals:
  - name: ops
    role: admin
    tokens: [{HASH}]
  - name: orders-app
    roles: [producer, consumer]
    topics: [orders, "events.*", "*"]
    tokens: [{token_hash("a" * 20)}, {token_hash("b" * 20)}]
"""
    ops, app = parse(text)
    assert ops == Principal("ops", frozenset({Role.ADMIN}), ("*",), (HASH,))
    assert app.roles == {Role.PRODUCER, Role.CONSUMER} and len(app.hashes) == 2
    assert app.topics == ("orders", "events.*", "*")


@pytest.mark.parametrize(
    ("principal", "problem"),
    [
        ({"name": "x", "role": "admin", "tokens": ["lmq_plain"]}, "is not a token hash"),
        ({"name": "x", "role": "admin", "tokens": []}, "at least one"),
        ({"name": "x", "role": "root", "tokens": [HASH]}, "each is one of"),
        ({"name": "x", "tokens": [HASH]}, "give role"),
        ({"name": "x", "role": "admin", "roles": ["admin"], "tokens": [HASH]}, "give role"),
        ({"name": "x", "role": "admin", "topics": ["a"], "tokens": [HASH]}, "no topics"),
        ({"name": "x", "roles": ["admin", "producer"], "tokens": [HASH]}, "no other role"),
        ({"name": "x", "role": "producer", "tokens": [HASH]}, "topics must list"),
        ({"name": "x", "role": "producer", "topics": ["a/b"], "tokens": [HASH]}, "a/b"),
        ({"name": "x", "role": "producer", "topics": ["*a"], "tokens": [HASH]}, "*a"),
        ({"name": "x", "role": "admin", "topic": ["a"], "tokens": [HASH]}, "unknown fields"),
        ({"name": "laminar-broker", "role": "admin", "tokens": [HASH]}, "brokers' own"),
        ({"name": "no spaces", "role": "admin", "tokens": [HASH]}, "name must match"),
    ],
)
def test_anything_wrong_is_refused_with_the_reason(principal: object, problem: str) -> None:
    with pytest.raises(CredentialsError, match="credentials") as refused:
        parse(yaml.safe_dump({"principals": [principal]}))
    assert problem in str(refused.value)


def test_names_and_tokens_are_unique() -> None:
    one = entry("a", ["admin"], hashes=[HASH])
    with pytest.raises(CredentialsError, match="listed twice"):
        parse(yaml.safe_dump({"principals": [one, one]}))
    other = entry("b", ["admin"], hashes=[HASH])
    with pytest.raises(CredentialsError, match="share a token"):
        parse(yaml.safe_dump({"principals": [one, other]}))
    with pytest.raises(CredentialsError, match="principals"):
        parse("users: []")
    with pytest.raises(CredentialsError, match="not valid YAML"):
        parse("principals: [")


def test_what_each_role_may_do() -> None:
    admin = Principal("a", frozenset({Role.ADMIN}))
    writer = Principal("w", frozenset({Role.PRODUCER}), ("orders", "events.*"))
    reader = Principal("r", frozenset({Role.CONSUMER}), ("*",))
    both = Principal("b", frozenset({Role.PRODUCER, Role.CONSUMER}), ("orders",))
    for action in Action:  # all but the brokers' own calls, which only they may make
        assert admin.may(action, "anything") == (action is not Action.INTERNAL), action
    brokers = Principal(INTERNAL_PRINCIPAL, frozenset({Role.ADMIN}))
    assert brokers.may(Action.INTERNAL) and not writer.may(Action.INTERNAL, "orders")
    # transactional ids are scoped as topic names are, for producers
    assert writer.may(Action.TRANSACT, "orders") and not writer.may(Action.TRANSACT, "billing")
    assert not reader.may(Action.TRANSACT, "x")
    assert writer.may(Action.PRODUCE, "orders") and writer.may(Action.PRODUCE, "events.x")
    assert not writer.may(Action.PRODUCE, "events") and not writer.may(Action.PRODUCE, "order")
    assert not writer.may(Action.CONSUME, "orders") and writer.may(Action.DESCRIBE, "orders")
    assert not writer.may(Action.ADMIN) and writer.may(Action.LIST) and writer.may(Action.CLUSTER)
    assert reader.may(Action.CONSUME, "x") and not reader.may(Action.PRODUCE, "x")
    assert both.may(Action.PRODUCE, "orders") and both.may(Action.CONSUME, "orders")
    assert not both.may(Action.CONSUME, "orders.dlq")  # a scope names it, or a prefix
    assert not reader.may(Action.ADMIN, "x")
    # every rule is one of these actions; the topic ones are on the route's {topic}
    for (method, route), action in RULES.items():
        topical = action in (Action.PRODUCE, Action.CONSUME, Action.DESCRIBE)
        unscoped = action in (Action.ADMIN, Action.INTERNAL)
        assert topical == ("{topic}" in route) or unscoped, (method, route)
        assert (action is Action.TRANSACT) == ("{txn_id}" in route), (method, route)


def test_the_authenticator_knows_the_brokers_own_principal_and_nothing_by_default(
    tmp_path: Path,
) -> None:
    secret = new_secret().strip()
    internal = internal_token(secret, "c1")
    assert internal == internal_token(secret, "c1") != internal_token(secret, "c2")
    assert internal != internal_token(new_secret().strip(), "c1")
    auth = Authenticator(internal_token=internal)
    assert auth.authenticate(f"Bearer {internal}").name == "laminar-broker"
    for header in (None, "", "Bearer", "Bearer  ", f"Basic {internal}", "Bearer lmq_other"):
        with pytest.raises(ApiError) as refused:
            auth.authenticate(header)
        assert refused.value.status == 401 and "WWW-Authenticate" in refused.value.headers
    anonymous = Authenticator(internal_token=internal, allow_anonymous=True)
    assert anonymous.authenticate(None).admin
    with pytest.raises(ApiError):  # a wrong token is wrong, even then
        anonymous.authenticate("Bearer lmq_wrong")
    compat = Authenticator(internal_token=internal, token="s" * 20)
    assert compat.authenticate("bearer " + "s" * 20).name == "token-file"


def test_the_authenticator_reloads_a_changed_file_and_keeps_the_old_on_errors(
    tmp_path: Path,
) -> None:
    path = tmp_path / "credentials.yaml"
    first = add_principal(path, "app", ["producer"], ["orders"])
    auth = Authenticator(internal_token=new_token(), credentials_file=path)
    assert auth.authenticate(f"Bearer {first}").name == "app"
    assert not auth.reload()  # unchanged
    second = add_principal(path, "app")
    assert auth.reload() and auth.authenticate(f"Bearer {second}").name == "app"
    path.write_text("principals: [oops]\n")
    assert not auth.reload()
    assert auth.authenticate(f"Bearer {second}").name == "app"  # kept
    path.unlink()
    assert not auth.reload()
    assert auth.authenticate(f"Bearer {first}").name == "app"


def test_a_token_that_authenticated_is_refused_once_retired_and_its_roles_follow_the_file(
    tmp_path: Path,
) -> None:
    """The authenticator remembers the tokens that authenticated (each is hashed once): a
    reload forgets them, so a retired token is refused and an edited principal's roles hold
    from the next request."""
    path = tmp_path / "credentials.yaml"
    first = add_principal(path, "app", ["producer"], ["orders"])
    second = add_principal(path, "app")
    auth = Authenticator(internal_token=new_token(), credentials_file=path)
    for _ in range(2):  # hashed, then remembered
        assert auth.authenticate(f"Bearer {first}").may(Action.PRODUCE, "orders")
    assert retire_tokens(path, "app") == 1  # the oldest: `first`
    assert auth.reload()
    with pytest.raises(ApiError) as refused:
        auth.authenticate(f"Bearer {first}")
    assert refused.value.status == 401
    assert auth.authenticate(f"Bearer {second}").may(Action.PRODUCE, "orders")
    path.write_text(path.read_text().replace("producer", "consumer"))
    assert auth.reload()
    app = auth.authenticate(f"Bearer {second}")
    assert app.may(Action.CONSUME, "orders") and not app.may(Action.PRODUCE, "orders")


def test_adding_and_retiring_tokens(tmp_path: Path) -> None:
    path = tmp_path / "credentials.yaml"
    first = add_principal(path, "app", ["consumer"], ["orders*"])
    assert path.stat().st_mode & 0o777 == 0o600
    second = add_principal(path, "app", ["consumer"])  # the same principal: another token
    (app,) = load(path)
    assert app.hashes == (token_hash(first), token_hash(second))
    with pytest.raises(CredentialsError, match="edit"):
        add_principal(path, "app", ["producer"])  # roles are changed by editing the file
    with pytest.raises(CredentialsError, match="needs a role"):
        add_principal(path, "new")
    assert retire_tokens(path, "app") == 1
    assert load(path)[0].hashes == (token_hash(second),)
    with pytest.raises(CredentialsError, match="no principal"):
        retire_tokens(path, "nobody")


def test_derived_tokens_depend_on_key_and_label() -> None:
    key = b"k" * 32
    assert derive_token(key, "a") == derive_token(key, "a") != derive_token(key, "b")
    assert derive_token(key, "a") != derive_token(b"j" * 32, "a")


def test_the_credentials_commands(tmp_path: Path) -> None:
    path = tmp_path / "credentials.yaml"
    added = subprocess.run(
        [*LAMINAR, "credentials", "add", str(path), "--name", "app", "--role", "producer",
         "--role", "consumer", "--topic", "orders", "--topic", "orders.dlq"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    token = added.stdout.strip()
    (app,) = load(path)
    assert app.hashes == (token_hash(token),) and app.topics == ("orders", "orders.dlq")
    assert app.roles == {Role.PRODUCER, Role.CONSUMER}
    assert "re-read it" in added.stderr
    out = tmp_path / "app-token"
    subprocess.run(
        [*LAMINAR, "credentials", "add", str(path), "--name", "app", "--token-file", str(out)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert out.stat().st_mode & 0o777 == 0o600
    assert load(path)[0].hashes[1] == token_hash(out.read_text().strip())
    hashed = subprocess.run(
        [*LAMINAR, "credentials", "hash"], input=token + "\n", capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip
    assert hashed.stdout.strip() == token_hash(token)
    subprocess.run([*LAMINAR, "credentials", "retire", str(path), "--name", "app"], check=True,
                   capture_output=True, timeout=60)  # fmt: skip
    assert load(path)[0].hashes == (token_hash(out.read_text().strip()),)
    made = tmp_path / "admin-token"
    subprocess.run([*LAMINAR, "credentials", "token", str(made)], check=True, timeout=60,
                   capture_output=True)  # fmt: skip
    assert made.read_text().startswith("lmq_") and made.stat().st_mode & 0o777 == 0o600
    again = subprocess.run([*LAMINAR, "credentials", "token", str(made)], capture_output=True,
                           text=True, timeout=60)  # fmt: skip
    assert again.returncode == 1  # never overwritten
    refused = subprocess.run(
        [*LAMINAR, "credentials", "add", str(path), "--name", "new"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 1 and "needs a role" in refused.stderr


def test_the_examples_in_the_security_guide_parse(tmp_path: Path) -> None:
    """docs/security.md's credentials file and client configuration are valid as shown."""
    import re

    from laminar.client.config import load_config
    from laminar.server.auth import RELOAD_INTERVAL_S

    guide = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", guide, flags=re.S)
    (credentials,) = [b for b in blocks if b.startswith("principals:")]
    assert [p.name for p in parse(credentials)] == ["ops", "orders-app", "analytics"]
    (config,) = [b for b in blocks if b.startswith("current-context:")]
    path = tmp_path / "config.yaml"
    path.write_text(config)
    current, contexts = load_config(path)
    assert current == "local" and set(contexts) == {"local", "prod"}
    assert contexts["local"].token_file == str(tmp_path / "laminar-data" / "token")
    assert f"every {RELOAD_INTERVAL_S:g} s" in guide
