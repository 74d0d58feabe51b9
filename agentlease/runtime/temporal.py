"""Connecting to Temporal with the plugins, interceptors, TLS and payload codec a deployment sets, and one clear
error when it is unreachable (``docs/deployment.md``)."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.client import Client, Interceptor, Plugin
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter, DefaultFailureConverterWithEncodedAttributes, PayloadCodec
from temporalio.plugin import SimplePlugin
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.service import RPCError, TLSConfig

from agentlease import limits
from agentlease.errors import AgentLeaseError, ConfigurationError
from agentlease.observability import tracing
from agentlease.settings import AgentLeaseSettings, load_object

CONNECT_TIMEOUT = timedelta(seconds=10)
"""How long connecting to Temporal may take, TCP and the first RPC together (the SDK's first RPC alone would wait
30s for a server that does not answer). Default 10s."""


class TemporalUnavailableError(AgentLeaseError):
    """The Temporal frontend at ``address`` (``host:port``) cannot be reached."""

    def __init__(self, address: str, cause: str) -> None:
        super().__init__(f"cannot reach Temporal at {address}: {cause}")
        self.address = address


async def connect(
    settings: AgentLeaseSettings,
    *,
    identity: str | None = None,
    timeout: timedelta = CONNECT_TIMEOUT,
    plugins: Sequence[Plugin] = (),
    interceptors: Sequence[Interceptor] = (),
    data_converter: DataConverter | None = None,
    runtime: Any = None,
) -> Client:
    """A Temporal client for agentlease, as ``settings`` say: address, namespace, plugins and converter to load,
    TLS and API key (:func:`tls_config`), payload codec (:func:`payload_codec`), tracing (``docs/tracing.md``).

    ``identity`` defaults to the SDK's ``<pid>@<host>``; ``timeout`` to 10s; ``plugins`` (an agent framework's)
    come before those of ``settings``; ``data_converter`` defaults to ``settings.data_converter``, else pydantic's
    when no plugin is given, else the SDK's; ``runtime``: e.g. :func:`prometheus_runtime`.

    Raises:
        TemporalUnavailableError: the server is unreachable, refused, or did not answer within ``timeout``.
        ConfigurationError: a plugin, converter, codec, TLS file or codec key in ``settings`` is bad.
    """
    loaded = [_loaded(path, "plugin", Plugin, "a temporalio client Plugin") for path in settings.plugins]
    every_plugin = [*plugins, *loaded]
    converter = data_converter
    if converter is None and settings.data_converter:
        converter = _loaded(settings.data_converter, "data converter", DataConverter, "a temporalio DataConverter")
    if converter is None and not every_plugin:
        converter = pydantic_data_converter
    codec = payload_codec(settings)
    if codec is None and converter is not None and converter.payload_codec is None:
        from agentlease.security.codec import KeysMissingCodec

        # No keys here: an encrypted payload is refused in one line instead of the SDK's KeyError.
        converter = dataclasses.replace(converter, payload_codec=KeysMissingCodec())
    if codec is not None:
        if converter is not None:
            converter = with_codec(converter, codec)
        else:  # a framework plugin sets the converter: the codec wraps whatever it set, last
            every_plugin.append(
                SimplePlugin(
                    "agentlease.payload-codec",
                    data_converter=lambda found: with_codec(found or DataConverter.default, codec),
                )
            )
    options: dict[str, Any] = {"data_converter": converter} if converter is not None else {}
    tls = tls_config(settings)
    if settings.temporal_api_key:
        options["api_key"] = settings.temporal_api_key
    if runtime is not None:
        options["runtime"] = runtime
    every_interceptor = list(interceptors)
    if settings.tracing:
        if not tracing.enabled():
            tracing.configure_tracing()
        every_interceptor += tracing.temporal_interceptors()
    try:
        async with asyncio.timeout(timeout.total_seconds()):
            return await Client.connect(
                settings.temporal_address,
                namespace=settings.namespace,
                identity=identity,
                connect_timeout=timeout,
                tls=tls,
                plugins=every_plugin,
                interceptors=every_interceptor,
                **options,
            )
    except TimeoutError:
        raise TemporalUnavailableError(
            settings.temporal_address, f"no answer within {timeout.total_seconds():g}s"
        ) from None
    except (RuntimeError, RPCError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TemporalUnavailableError(settings.temporal_address, first) from None


def tls_config(settings: AgentLeaseSettings) -> TLSConfig | bool:
    """The TLS of the Temporal connection: a :class:`TLSConfig` when a CA, client certificate or server name is
    set; ``True`` (the system's CAs) with ``temporal_tls`` or an API key; else ``False`` (plain TCP).
    ConfigurationError: a file cannot be read, or only one of client certificate and key is set."""
    s = settings
    if (s.temporal_tls_cert_file is None) != (s.temporal_tls_key_file is None):
        raise ConfigurationError(
            "AGENTLEASE_TEMPORAL_TLS_CERT_FILE and AGENTLEASE_TEMPORAL_TLS_KEY_FILE go together: set both or neither"
        )
    if s.temporal_tls_ca_file or s.temporal_tls_cert_file or s.temporal_tls_server_name:
        return TLSConfig(
            server_root_ca_cert=_read(s.temporal_tls_ca_file, "AGENTLEASE_TEMPORAL_TLS_CA_FILE"),
            domain=s.temporal_tls_server_name,
            client_cert=_read(s.temporal_tls_cert_file, "AGENTLEASE_TEMPORAL_TLS_CERT_FILE"),
            client_private_key=_read(s.temporal_tls_key_file, "AGENTLEASE_TEMPORAL_TLS_KEY_FILE"),
        )
    return bool(s.temporal_tls or s.temporal_api_key)


def _read(path: Path | None, setting: str) -> bytes | None:
    if path is None:
        return None
    try:
        return limits.read_file(path, limits.MAX_KEY_FILE_BYTES)
    except OSError as exc:
        raise ConfigurationError(f"{setting}: cannot read {path}: {exc.strerror or exc}") from None


def payload_codec(settings: AgentLeaseSettings) -> PayloadCodec | None:
    """``settings.payload_codec`` (``module:attribute``) if set, else the ``EncryptionCodec`` of ``codec_keys``,
    else ``None``. ConfigurationError: the codec cannot be loaded, or the keys are malformed."""
    if settings.payload_codec:
        codec = load_object(settings.payload_codec, "payload codec")
        if not isinstance(codec, PayloadCodec):
            raise ConfigurationError(f"payload codec {settings.payload_codec!r} is not a temporalio PayloadCodec")
        return codec
    if settings.codec_keys:
        from agentlease.security.codec import EncryptionCodec

        return EncryptionCodec.from_text(settings.codec_keys)
    return None


def worker_client(client: Client) -> Client:
    """``client`` with its ``EncryptionCodec`` made lenient (:meth:`~agentlease.security.codec.EncryptionCodec.lenient`)
    for a worker; any other client as it is."""
    from agentlease.security.codec import EncryptionCodec

    config = client.config()
    converter = config["data_converter"]
    codec = converter.payload_codec
    if not isinstance(codec, EncryptionCodec) or codec.is_lenient:
        return client
    config["data_converter"] = dataclasses.replace(converter, payload_codec=codec.lenient())
    return Client(**config)


def with_codec(converter: DataConverter, codec: PayloadCodec) -> DataConverter:
    """``converter`` whose payloads go through ``codec``, failure messages and stack traces included."""
    return dataclasses.replace(
        converter, payload_codec=codec, failure_converter_class=DefaultFailureConverterWithEncodedAttributes
    )


def prometheus_runtime() -> tuple[Runtime, str]:
    """An SDK runtime serving its ``temporal_*`` metrics (``_total`` counters, seconds) on a free loopback port,
    and that endpoint's URL, to re-export (``docs/metrics.md``). ConfigurationError: the port could not be bound."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = f"127.0.0.1:{port}"
    prometheus = PrometheusConfig(bind_address=address, counters_total_suffix=True, durations_as_seconds=True)
    try:
        runtime = Runtime(telemetry=TelemetryConfig(metrics=prometheus))
    except RuntimeError as exc:  # how the SDK's core reports a port it cannot bind
        raise ConfigurationError(f"cannot serve Temporal's runtime metrics on {address}: {exc}") from None
    return runtime, f"http://{address}/metrics"


def _loaded(path: str, what: str, kind: type, expected: str) -> Any:
    value = load_object(path, what)
    if not isinstance(value, kind):
        raise ConfigurationError(f"bad {what} {path!r}: {type(value).__name__}, not {expected}")
    return value
