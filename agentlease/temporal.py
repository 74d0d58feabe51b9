"""Connecting to Temporal, with the plugins, interceptors and data converter a deployment wants, and
clear errors when it is unreachable."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import socket
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from temporalio.client import Client, Interceptor, Plugin
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.service import RPCError

from agentlease import tracing
from agentlease.errors import AgentLeaseError, ConfigurationError
from agentlease.settings import AgentLeaseSettings

CONNECT_TIMEOUT = timedelta(seconds=10)
"""How long connecting to Temporal may take, TCP and the first RPC together. Default 10s.

The SDK bounds the TCP connect only when asked (``connect_timeout``), and its first RPC
(``GetSystemInfo``) waits 30s for a server that accepts connections but does not answer.
"""


class TemporalUnavailableError(AgentLeaseError):
    """The Temporal frontend cannot be reached.

    Attributes:
        address: the ``host:port`` that was tried.
    """

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
    """A Temporal client for agentlease.

    Args:
        settings: address and namespace; ``settings.plugins`` and ``settings.data_converter`` name
            further plugins and a converter to load (``module:attribute``).
        identity: the client's identity; default the SDK's ``<pid>@<host>``.
        timeout: how long connecting may take. Default 10s.
        plugins: client plugins (an agent framework's, which may set its own converter), before
            those of ``settings``.
        interceptors: client interceptors (tracing, ...).
        data_converter: the converter; default ``settings.data_converter``, else the pydantic
            converter when no plugin is given, else the SDK's default (a framework plugin replaces
            it with its own). agentlease's payloads are plain JSON, so any JSON converter reads them.
        runtime: the SDK runtime (``temporalio.runtime.Runtime``: its telemetry, e.g. the worker's
            Temporal metrics, see :mod:`agentlease.runtime_metrics`); default the SDK's.

    With ``settings.tracing`` the client (and every worker made from it) also carries Temporal's
    ``TracingInterceptor`` (:mod:`agentlease.tracing`, ``docs/tracing.md``).

    Raises:
        TemporalUnavailableError: the server is unreachable, refused the connection, or did not
            answer within ``timeout``.
        ConfigurationError: a plugin or converter named in ``settings`` cannot be loaded.
    """
    every_plugin = [*plugins, *(load_object(path, "plugin") for path in settings.plugins)]
    converter = data_converter
    if converter is None and settings.data_converter:
        converter = load_object(settings.data_converter, "data converter")
    if converter is None and not every_plugin:
        converter = pydantic_data_converter
    options: dict[str, Any] = {"data_converter": converter} if converter is not None else {}
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


def prometheus_runtime() -> tuple[Runtime, str]:
    """An SDK runtime whose metrics (``temporal_*``) Temporal serves on a free loopback port, and that
    endpoint's URL, for :func:`agentlease.metrics.serving_metrics` to re-export (``docs/metrics.md``).

    Counters carry the ``_total`` suffix and durations are in seconds, like the lease metrics.

    Raises:
        ConfigurationError: the runtime could not bind its port.
    """
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


def load_object(path: str, what: str) -> Any:
    """The object named ``module:attribute``; a function there is called (a factory, no arguments).

    Raises:
        ConfigurationError: not ``module:attribute``, or it cannot be imported.
    """
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigurationError(f"bad {what} {path!r}: expected module:attribute")
    try:
        value = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"cannot load {what} {path!r}: {exc}") from None
    return value() if inspect.isfunction(value) else value  # a factory: ``def plugin() -> Plugin``
