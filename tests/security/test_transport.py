"""The Temporal connection over TLS and mTLS (finding 4): the dev server cannot serve TLS, so a TLS
terminator made here (a self-signed CA and certificates from ``cryptography``) fronts it, as a
load balancer fronts a real frontend. The settings produce the TLSConfig; the right CA connects;
a wrong CA, a missing client certificate or an unreachable server is one clear line."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import ipaddress
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.service import TLSConfig

from agentlease import limits
from agentlease.errors import ConfigurationError
from agentlease.runtime.temporal import TemporalUnavailableError, connect
from agentlease.settings import AgentLeaseSettings

pytestmark = pytest.mark.timeout(60)


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> Path:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return path


def _ca(name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(
    name: str, ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey], *, server: bool
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca[0].subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.ExtendedKeyUsage(
                [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH if server else x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(name), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    return builder.sign(ca[1], hashes.SHA256()), key


def _pem(path: Path, cert: x509.Certificate) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca = _ca("agentlease test CA")
    other = _ca("some other CA")
    server = _leaf("temporal.test", ca, server=True)
    client = _leaf("worker-1", ca, server=False)
    return Pki(
        ca=_pem(tmp_path / "ca.pem", ca[0]),
        server_cert=_pem(tmp_path / "server.pem", server[0]),
        server_key=_write_key(tmp_path / "server.key", server[1]),
        client_cert=_pem(tmp_path / "client.pem", client[0]),
        client_key=_write_key(tmp_path / "client.key", client[1]),
        other_ca=_pem(tmp_path / "other-ca.pem", other[0]),
    )


@contextlib.asynccontextmanager
async def tls_frontend(pki: Pki, upstream: str, *, require_client_cert: bool) -> AsyncIterator[str]:
    """The TLS terminator (:mod:`tests.security.tls_frontend`) as its own process; yields its ``host:port``."""
    client_ca = str(pki.ca) if require_client_cert else "-"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.security.tls_frontend",
        str(pki.server_cert),
        str(pki.server_key),
        client_ca,
        upstream,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        assert process.stdout is not None
        port = int((await asyncio.wait_for(process.stdout.readline(), timeout=30)).decode())
        yield f"127.0.0.1:{port}"
    finally:
        process.kill()
        await process.wait()


def _settings(address: str, **tls: Any) -> AgentLeaseSettings:
    return AgentLeaseSettings.model_validate({"temporal_address": address, **tls})


async def test_tls_with_the_right_ca_connects_and_a_wrong_one_is_one_line(pki: Pki, temporal_address: str) -> None:
    async with tls_frontend(pki, temporal_address, require_client_cert=False) as address:
        client = await connect(
            _settings(address, temporal_tls_ca_file=pki.ca, temporal_tls_server_name="temporal.test")
        )
        assert (await client.workflow_service.get_system_info(_system_info())).server_version

        with pytest.raises(TemporalUnavailableError) as wrong:
            await connect(
                _settings(address, temporal_tls_ca_file=pki.other_ca, temporal_tls_server_name="temporal.test")
            )
        assert "\n" not in str(wrong.value) and str(wrong.value).startswith(f"cannot reach Temporal at {address}")

        with pytest.raises(TemporalUnavailableError):  # plain TCP to a TLS frontend: refused, in one line
            await connect(_settings(address))


async def test_mtls_needs_the_client_certificate(pki: Pki, temporal_address: str) -> None:
    async with tls_frontend(pki, temporal_address, require_client_cert=True) as address:
        mutual = _settings(
            address,
            temporal_tls_ca_file=pki.ca,
            temporal_tls_server_name="temporal.test",
            temporal_tls_cert_file=pki.client_cert,
            temporal_tls_key_file=pki.client_key,
        )
        client = await connect(mutual)
        assert (await client.workflow_service.get_system_info(_system_info())).server_version

        with pytest.raises(TemporalUnavailableError) as anonymous:
            await connect(_settings(address, temporal_tls_ca_file=pki.ca, temporal_tls_server_name="temporal.test"))
        assert "\n" not in str(anonymous.value)


def test_settings_make_the_tls_config(pki: Pki, tmp_path: Path) -> None:
    from agentlease.runtime.temporal import tls_config

    config = tls_config(
        _settings(
            "temporal.test:7233",
            temporal_tls_ca_file=pki.ca,
            temporal_tls_cert_file=pki.client_cert,
            temporal_tls_key_file=pki.client_key,
            temporal_tls_server_name="temporal.test",
        )
    )
    assert config == TLSConfig(
        server_root_ca_cert=pki.ca.read_bytes(),
        domain="temporal.test",
        client_cert=pki.client_cert.read_bytes(),
        client_private_key=pki.client_key.read_bytes(),
    )
    assert tls_config(_settings("localhost:7233")) is False
    assert tls_config(_settings("x.tmprl.cloud:7233", temporal_api_key="k")) is True
    with pytest.raises(ConfigurationError, match="go together"):
        tls_config(_settings("x:1", temporal_tls_cert_file=pki.client_cert))
    with pytest.raises(ConfigurationError, match="AGENTLEASE_TEMPORAL_TLS_CA_FILE: cannot read"):
        tls_config(_settings("x:1", temporal_tls_ca_file=tmp_path / "missing.pem"))
    fifo = tmp_path / "ca.fifo"
    os.mkfifo(fifo)  # was waited on for a writer forever
    with pytest.raises(ConfigurationError, match=r"TLS_CA_FILE: cannot read .*: a FIFO or a socket, not a file"):
        tls_config(_settings("x:1", temporal_tls_ca_file=fifo))
    big = tmp_path / "ca.pem"
    big.write_bytes(pki.ca.read_bytes() * (limits.MAX_KEY_FILE_BYTES // len(pki.ca.read_bytes()) + 1))
    with pytest.raises(
        ConfigurationError, match=f"TLS_CA_FILE: cannot read .*: larger than {limits.MAX_KEY_FILE_BYTES}"
    ):
        tls_config(_settings("x:1", temporal_tls_ca_file=big))
    assert "temporal_api_key='k'" not in repr(_settings("x:1", temporal_api_key="k"))


async def test_unreachable_tls_server_is_one_line(pki: Pki) -> None:
    with pytest.raises(TemporalUnavailableError) as info:
        await connect(_settings("127.0.0.1:1", temporal_tls_ca_file=pki.ca))
    assert "\n" not in str(info.value) and "127.0.0.1:1" in str(info.value)


def _system_info() -> GetSystemInfoRequest:
    return GetSystemInfoRequest()
