"""Where clients find their token, brokers and CA file (laminar.client.config): explicit
arguments, then the environment, then a context of the client configuration file, each setting
on its own; files are read only when needed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from laminar.client import AsyncClient, ClientConfigError
from laminar.client.config import config_path, find_context, resolve, resolve_token


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, str]:
    paths = {}
    for name in ("explicit", "env", "context", "current"):
        path = tmp_path / f"{name}-token"
        path.write_text(f"lmq_{name}-token\n")
        paths[name] = str(path)
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "current-context": "current",
                "contexts": [
                    {
                        "name": "current",
                        "brokers": ["http://current:7070"],
                        "token-file": "current-token",  # relative to the file
                        "ca-file": "current-ca.pem",
                    },
                    {
                        "name": "named",
                        "brokers": "http://named-1:7070,http://named-2:7070",
                        "token": "lmq_context-inline",
                    },
                    {"name": "empty"},
                ],
            }
        )
    )
    paths["config"] = str(config)
    return paths


def test_the_token_comes_from_the_first_place_that_has_it(files: dict[str, str]) -> None:
    env = {
        "LAMINAR_CONFIG": files["config"],
        "LAMINAR_TOKEN": "lmq_env-inline",
        "LAMINAR_TOKEN_FILE": files["env"],
    }
    assert resolve_token("lmq_given", files["explicit"], "named", env) == "lmq_given"
    assert resolve_token(None, files["explicit"], "named", env) == "lmq_explicit-token"
    assert resolve_token(None, None, "named", env) == "lmq_context-inline"
    assert resolve_token(None, None, None, env) == "lmq_env-inline"
    del env["LAMINAR_TOKEN"]
    assert resolve_token(None, None, None, env) == "lmq_env-token"
    del env["LAMINAR_TOKEN_FILE"]
    assert resolve_token(None, None, None, env) == "lmq_current-token"
    assert resolve_token(None, None, None, {**env, "LAMINAR_CONTEXT": "named"}) == (
        "lmq_context-inline"
    )
    # a context without a token: the environment's, and never the current context's
    assert resolve_token(None, None, "empty", env) is None
    assert resolve_token(None, None, "empty", {**env, "LAMINAR_TOKEN": "lmq_e"}) == "lmq_e"
    assert resolve_token(None, None, None, {"LAMINAR_CONFIG": "/nonexistent.yaml"}) is None


def test_brokers_and_ca_file_follow_the_same_order(files: dict[str, str], tmp_path: Path) -> None:
    env = {"LAMINAR_CONFIG": files["config"]}
    current = resolve(environ=env)
    assert current.brokers == ("http://current:7070",)
    assert current.ca_file == str(tmp_path / "current-ca.pem")
    assert current.token == "lmq_current-token" and "current" in current.token_source
    named = resolve(context="named", environ={**env, "LAMINAR_BROKERS": "http://env:1"})
    assert named.brokers == ("http://named-1:7070", "http://named-2:7070")
    assert named.ca_file is None  # the named context has none; the current one is not asked
    env_first = resolve(environ={**env, "LAMINAR_BROKERS": "http://env:1", "LAMINAR_CA_FILE": "c"})
    assert env_first.brokers == ("http://env:1",) and env_first.ca_file == "c"
    given = resolve(brokers="http://a:1, http://b:2", ca_file="mine.pem", environ=env)
    assert given.brokers == ("http://a:1", "http://b:2") and given.ca_file == "mine.pem"
    assert "lmq_" not in repr(current)  # a token is never shown


def test_files_are_read_only_when_needed(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("contexts: [{name: x, tokn: oops}]\n")
    env = {"LAMINAR_CONFIG": str(broken), "LAMINAR_TOKEN": "lmq_env"}
    assert resolve_token(environ=env) == "lmq_env"  # the file is not needed
    with pytest.raises(ClientConfigError, match="unknown fields"):
        resolve_token(environ={"LAMINAR_CONFIG": str(broken)})
    with pytest.raises(ClientConfigError, match="cannot read the token file"):
        resolve_token(environ={"LAMINAR_TOKEN_FILE": str(tmp_path / "missing")})
    with pytest.raises(ClientConfigError, match="no context 'nope'"):
        find_context("nope", {"LAMINAR_CONFIG": str(tmp_path / "absent.yaml")})
    assert find_context(None, {"LAMINAR_CONFIG": str(tmp_path / "absent.yaml")}) is None
    both = tmp_path / "both.yaml"
    both.write_text("contexts: [{name: x, token: a, token-file: b}]\n")
    with pytest.raises(ClientConfigError, match="not both"):
        find_context("x", {"LAMINAR_CONFIG": str(both)})
    empty = tmp_path / "empty-token"
    empty.write_text("\n")
    with pytest.raises(ClientConfigError, match="is empty"):
        resolve_token(token_file=empty)


def test_the_default_configuration_file(tmp_path: Path) -> None:
    assert config_path({"XDG_CONFIG_HOME": str(tmp_path)}) == tmp_path / "laminar/config.yaml"
    assert config_path({"LAMINAR_CONFIG": "~/x.yaml"}) == Path("~/x.yaml").expanduser()
    assert config_path({}).parts[-3:] == (".config", "laminar", "config.yaml")


async def test_the_client_sends_the_token_it_resolved(
    files: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """AsyncClient(token=None) looks in the environment and the configuration file; an
    explicit context brings its CA file too."""
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    seen: list[str | None] = []

    async def topics(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        return web.json_response({"topics": []})

    app = web.Application()
    app.router.add_get("/v1/topics", topics)
    async with TestServer(app, host="127.0.0.1") as server:
        url = str(server.make_url("")).rstrip("/")
        monkeypatch.setenv("LAMINAR_CONFIG", files["config"])
        monkeypatch.setenv("LAMINAR_TOKEN_FILE", files["env"])
        async with AsyncClient([url]) as client:
            await client.topics()
        async with AsyncClient([url], token_file=files["explicit"]) as client:
            await client.topics()
        async with AsyncClient([url], context="named") as client:
            await client.topics()
        monkeypatch.delenv("LAMINAR_TOKEN_FILE")
        async with AsyncClient([url]) as client:
            await client.topics()
    assert seen == [
        "Bearer lmq_env-token",
        "Bearer lmq_explicit-token",
        "Bearer lmq_context-inline",
        "Bearer lmq_current-token",
    ]
