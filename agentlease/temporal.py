"""Connecting to Temporal with agentlease's data converter, and clear errors when it is unreachable."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError

from agentlease.errors import AgentLeaseError
from agentlease.settings import AgentLeaseSettings


class TemporalUnavailableError(AgentLeaseError):
    """The Temporal frontend cannot be reached.

    Attributes:
        address: the ``host:port`` that was tried.
    """

    def __init__(self, address: str, cause: str) -> None:
        super().__init__(f"cannot reach Temporal at {address}: {cause}")
        self.address = address


async def connect(settings: AgentLeaseSettings, *, identity: str | None = None) -> Client:
    """A Temporal client using the pydantic data converter.

    Raises:
        TemporalUnavailableError: the server is unreachable or refused the connection.
    """
    try:
        return await Client.connect(
            settings.temporal_address,
            namespace=settings.namespace,
            data_converter=pydantic_data_converter,
            identity=identity,
        )
    except (RuntimeError, RPCError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TemporalUnavailableError(settings.temporal_address, first) from None
