"""Connecting to Temporal with agentlease's data converter, and clear errors when it is unreachable."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError

from agentlease.errors import AgentLeaseError
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
    settings: AgentLeaseSettings, *, identity: str | None = None, timeout: timedelta = CONNECT_TIMEOUT
) -> Client:
    """A Temporal client using the pydantic data converter.

    Args:
        settings: address and namespace.
        identity: the client's identity; default the SDK's ``<pid>@<host>``.
        timeout: how long connecting may take. Default 10s.

    Raises:
        TemporalUnavailableError: the server is unreachable, refused the connection, or did not
            answer within ``timeout``.
    """
    try:
        async with asyncio.timeout(timeout.total_seconds()):
            return await Client.connect(
                settings.temporal_address,
                namespace=settings.namespace,
                data_converter=pydantic_data_converter,
                identity=identity,
                connect_timeout=timeout,
            )
    except TimeoutError:
        raise TemporalUnavailableError(
            settings.temporal_address, f"no answer within {timeout.total_seconds():g}s"
        ) from None
    except (RuntimeError, RPCError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TemporalUnavailableError(settings.temporal_address, first) from None
