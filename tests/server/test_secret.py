"""The cluster secret: `laminar serve` refuses to start without one (there is no built-in
default any more), weak secrets are refused with a clear reason, secret files are read as
docs/security.md says, and `laminar secret` makes good ones."""

from __future__ import annotations

import argparse
import base64
import os
import secrets
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from laminar.server import config as config_module
from laminar.server.config import (
    BrokerConfig,
    ConfigError,
    add_arguments,
    from_arguments,
    new_secret,
    read_secret_file,
    secret_problem,
)

LAMINAR = [sys.executable, "-m", "laminar"]


@pytest.mark.parametrize(
    "secret, problem",
    [
        (b"laminar-insecure-default-secret", "31 bytes long; at least 32"),  # the old default
        (b"", "0 bytes long"),
        (b"x" * 32, "only 1 distinct byte values"),
        (b"password" * 4, "only 7 distinct byte values"),
        (b"0123456789abcdef" * 2, "a 16-byte sequence repeated"),
        (b"correct horse battery staple" * 2, "a 28-byte sequence repeated"),
        (b"abcdefghijabcdefghijabcdefghijab", "a 10-byte sequence repeated"),  # a cut repeat
    ],
)
def test_weak_secrets_are_refused_with_the_reason(secret: bytes, problem: str) -> None:
    found = secret_problem(secret)
    assert found is not None and problem in found, found
    with pytest.raises(ConfigError, match="laminar secret"):
        BrokerConfig("n1", Path("/nonexistent"), secret=secret)


@pytest.mark.parametrize(
    "secret",
    [
        new_secret().strip(),  # `laminar secret`: base64 of 32 random bytes
        secrets.token_hex(32).encode(),  # `openssl rand -hex 32`: only 16 symbols
        secrets.token_hex(16).encode(),  # 32 hex digits (128 bits) still pass
        os.urandom(32),  # raw bytes, as the operator's Secret holds
        base64.b64encode(os.urandom(24)),  # `head -c 24 /dev/urandom | base64`
    ],
    # ids of the shapes, not of the random values: every pytest-xdist worker collects the same
    ids=["laminar-secret", "hex-32-bytes", "hex-16-bytes", "raw-32-bytes", "base64-24-bytes"],
)
def test_random_secrets_of_the_usual_shapes_pass(secret: bytes) -> None:
    assert secret_problem(secret) is None
    config = BrokerConfig("n1", Path("/nonexistent"), secret=secret, allow_anonymous=True)
    assert config.secret == secret


def test_there_is_no_default_secret_and_the_config_does_not_print_it() -> None:
    assert not hasattr(config_module, "DEFAULT_SECRET")
    with pytest.raises(ConfigError, match="no cluster secret"):
        BrokerConfig("n1", Path("/nonexistent"))
    secret = new_secret().strip()
    config = BrokerConfig("n1", Path("/nonexistent"), secret=secret, token="api-token")
    assert secret.decode() not in repr(config) and "api-token" not in repr(config)


def arguments(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    # (an open API: client credentials are tests/integration/test_auth.py's subject)
    required = ["--node-id", "n1", "--data-dir", "/nonexistent", "--allow-anonymous"]
    return parser.parse_args([*required, *argv])


def test_serve_arguments_without_a_secret_file_are_refused() -> None:
    with pytest.raises(ConfigError) as refused:
        from_arguments(arguments())
    message = str(refused.value)
    assert "--secret-file (or LAMINAR_SECRET_FILE) is required" in message
    assert "laminar secret FILE" in message and "/dev/urandom" in message


def test_secret_files_text_or_binary(tmp_path: Path) -> None:
    text = tmp_path / "text"
    text.write_bytes(b"  " + new_secret())  # surrounding whitespace is not part of it
    assert read_secret_file(str(text)) == text.read_bytes().strip()
    assert len(read_secret_file(str(text))) == 44
    raw = os.urandom(30) + b"\x80\n"  # not UTF-8: every byte counts, the newline too
    binary = tmp_path / "binary"
    binary.write_bytes(raw)
    assert read_secret_file(str(binary)) == raw
    assert from_arguments(arguments("--secret-file", str(binary))).secret == raw
    weak = tmp_path / "weak"
    weak.write_text("changeme\n")
    with pytest.raises(ConfigError, match=rf"secret in {weak} is 8 bytes long"):
        read_secret_file(str(weak))
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        read_secret_file(str(empty))
    with pytest.raises(ConfigError, match="cannot read"):
        read_secret_file(str(tmp_path / "missing"))


def test_the_secret_file_comes_from_the_environment_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "secret"
    path.write_bytes(new_secret())
    monkeypatch.setenv("LAMINAR_SECRET_FILE", str(path))
    assert from_arguments(arguments()).secret == path.read_bytes().strip()


def test_laminar_serve_without_a_secret_exits_at_once_saying_how_to_make_one(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAMINAR_")}
    ports = ["--api-port", "0", "--peer-port", "0", "--gossip-port", "0"]
    result = subprocess.run(
        [*LAMINAR, "serve", "--node-id", "n1", "--data-dir", str(tmp_path / "data"), *ports],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,  # before, it served with the public default secret until stopped
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--secret-file (or LAMINAR_SECRET_FILE) is required" in result.stderr
    assert "laminar secret FILE" in result.stderr
    assert not (tmp_path / "data").exists()


def test_laminar_secret_prints_or_creates_a_private_file(tmp_path: Path) -> None:
    printed = subprocess.run([*LAMINAR, "secret"], capture_output=True, timeout=60, check=True)
    assert secret_problem(printed.stdout.strip()) is None
    assert len(base64.b64decode(printed.stdout.strip(), validate=True)) == 32
    path = tmp_path / "secret"
    subprocess.run([*LAMINAR, "secret", str(path)], capture_output=True, timeout=60, check=True)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    first = read_secret_file(str(path))
    assert first != printed.stdout.strip()
    again = subprocess.run(
        [*LAMINAR, "secret", str(path)], capture_output=True, text=True, timeout=60
    )
    assert again.returncode == 1 and "cannot create" in again.stderr
    assert read_secret_file(str(path)) == first  # never overwritten
