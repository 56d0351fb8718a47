"""TLS settings and the certificate store (docs/security.md, "TLS"): the three files come as
flags or LAMINAR_TLS_* variables, all together; files that do not load stop `laminar serve` at
once; and the store swaps in changed files for new handshakes, keeping the old ones while the
new ones do not load."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from laminar.certs import KeyPair, issue, make_ca, names_of, renewal_due
from laminar.local_cluster import LocalCluster
from laminar.server.config import ConfigError, add_arguments, from_arguments, new_secret
from laminar.tls import CertificateStore, TlsError, TlsFiles, client_context

LAMINAR = [sys.executable, "-m", "laminar"]


def _write(directory: Path, pair: KeyPair, ca_pem: bytes) -> TlsFiles:
    files = TlsFiles(directory / "tls.crt", directory / "tls.key", directory / "ca.crt")
    files.cert.write_bytes(pair.cert_pem)
    files.key.write_bytes(pair.key_pem)
    files.ca.write_bytes(ca_pem)
    return files


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_tls_files_are_flags_or_environment_and_go_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(new_secret())
    base = ["--node-id", "n1", "--data-dir", str(tmp_path), "--secret-file", str(secret)]
    base += ["--allow-anonymous"]
    plain = from_arguments(_parse(base))
    assert not plain.tls and plain.api_scheme == "http" and plain.tls_files is None
    for name in ("CERT", "KEY", "CA"):
        monkeypatch.setenv(f"LAMINAR_TLS_{name}_FILE", str(tmp_path / name.lower()))
    config = from_arguments(_parse(base))
    assert config.tls and config.api_scheme == "https"
    assert config.tls_files == TlsFiles(tmp_path / "cert", tmp_path / "key", tmp_path / "ca")
    monkeypatch.delenv("LAMINAR_TLS_CA_FILE")
    with pytest.raises(ConfigError, match="go together"):
        from_arguments(_parse(base))
    with pytest.raises(ConfigError, match="go together"):
        from_arguments(_parse([*base, "--tls-key-file", ""]))


def test_serve_with_unusable_tls_files_exits_at_once(tmp_path: Path) -> None:
    ca = make_ca("test")
    other = issue(make_ca("other"), "n1", ["127.0.0.1"])
    mine = issue(ca, "n1", ["127.0.0.1"])
    files = _write(tmp_path, KeyPair(mine.cert_pem, other.key_pem), ca.cert_pem)  # mismatched
    secret = tmp_path / "secret"
    secret.write_bytes(new_secret())
    result = subprocess.run(
        [
            *LAMINAR, "serve", "--node-id", "n1", "--data-dir", str(tmp_path / "data"),
            "--secret-file", str(secret), "--allow-anonymous", "--api-port", "0",
            "--peer-port", "0", "--gossip-port", "0",
            "--tls-cert-file", str(files.cert), "--tls-key-file", str(files.key),
            "--tls-ca-file", str(files.ca),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert "laminar serve: TLS: cannot load" in result.stderr


def test_the_store_swaps_in_new_files_for_new_handshakes(tmp_path: Path) -> None:
    ca = make_ca("test")
    first = issue(ca, "n1", ["127.0.0.1"])
    files = _write(tmp_path, first, ca.cert_pem)
    store = CertificateStore(files)
    assert not store.reload()  # nothing changed

    async def served_serial() -> int:
        async def answer(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.close()

        server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=store.api_listener)
        port = server.sockets[0].getsockname()[1]
        try:
            _, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=client_context(files.ca), server_hostname="127.0.0.1"
            )
            cert = writer.get_extra_info("peercert")
            writer.close()
            return int(cert["serialNumber"], 16)
        finally:
            server.close()

    assert asyncio.run(served_serial()) == first.certificate.serial_number
    # halfway through a copy: a new certificate with the old key does not load; the old stay
    second = issue(ca, "n1", ["127.0.0.1"])
    files.cert.write_bytes(second.cert_pem)
    assert not store.reload() and "cannot load" in store.error
    assert asyncio.run(served_serial()) == first.certificate.serial_number
    files.key.write_bytes(second.key_pem)
    assert store.reload() and store.reloads == 1 and store.error == ""
    assert asyncio.run(served_serial()) == second.certificate.serial_number
    files.ca.write_bytes(b"")
    assert not store.reload() and "empty" in store.error
    with pytest.raises(TlsError):
        CertificateStore(files)


def test_certificates_name_their_hosts_and_are_renewed_with_a_third_left() -> None:
    ca = make_ca("test")
    pair = issue(ca, "n1", ["127.0.0.1", "*.demo-peers.ns.svc", "demo"])
    assert sorted(names_of(pair.cert_pem)) == ["*.demo-peers.ns.svc", "127.0.0.1", "demo"]
    start = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
    end = start + datetime.timedelta(days=90)
    assert not renewal_due(start, end, start + datetime.timedelta(days=59))
    assert renewal_due(start, end, start + datetime.timedelta(days=61))
    context = client_context(cadata=ca.cert_pem.decode())
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2


def test_local_cluster_certificates_are_made_kept_and_follow_the_address(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, 2, prefix="127.9.9", tls=True)
    assert cluster.urls == ["https://127.9.9.11:7070", "https://127.9.9.12:7070"]
    cert, key = cluster.tls_files("n1")
    first = cert.read_bytes()
    assert sorted(names_of(first)) == ["127.9.9.11", "localhost"]
    assert key.stat().st_mode & 0o777 == 0o600
    command = cluster.command(cluster.nodes["n2"])
    assert command[command.index("--tls-ca-file") + 1] == str(cluster.ca_file)
    assert cluster.tls_files("n1") == (cert, key) and cert.read_bytes() == first  # kept
    moved = LocalCluster(tmp_path, 2, prefix="127.9.8", tls=True)  # same CA, new addresses
    moved.tls_files("n1")
    assert sorted(names_of(cert.read_bytes())) == ["127.9.8.11", "localhost"]
    assert (tmp_path / "tls" / "ca.crt").read_bytes() == moved._ca().cert_pem
