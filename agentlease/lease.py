"""The lease of the running tool call, reachable from inside the tool the way ``temporalio.activity`` is
(``headers=lease.downstream_headers(f"refunds/{order_id}")``). Outside a leased attempt :func:`in_lease` is
false and every other function raises :class:`NotInLeaseError` (``docs/wrapping-tools.md``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from agentlease.enums import Stage
from agentlease.errors import AgentLeaseError

if TYPE_CHECKING:
    from agentlease.records import SettlementReceipt
    from agentlease.tools._context import LeaseContext

__all__ = [
    "NotInLeaseError",
    "advance",
    "context",
    "downstream_headers",
    "fencing_token",
    "idempotency_key",
    "in_lease",
    "receipt",
    "renew",
]

_current: ContextVar[LeaseContext | None] = ContextVar("agentlease_lease", default=None)


class NotInLeaseError(AgentLeaseError, RuntimeError):
    """A lease function was called outside a leased attempt (a direct call, a local run, a unit test)."""


@contextmanager
def _entered(ctx: LeaseContext) -> Iterator[LeaseContext]:
    """Make ``ctx`` the current lease until the block exits (the worker, around a tool call)."""
    token = _current.set(ctx)
    try:
        yield ctx
    finally:
        _current.reset(token)


def in_lease() -> bool:
    """Whether the caller runs inside a leased attempt (and the other functions of this module answer)."""
    return _current.get() is not None


def context() -> LeaseContext:
    """The :class:`~agentlease.tools.LeaseContext` of the running attempt (``docs/writing-tools.md``, "The context").

    Every function below raises :class:`NotInLeaseError` outside a leased attempt, as this one does.
    """
    ctx = _current.get()
    if ctx is None:
        raise NotInLeaseError("no lease: this code runs outside a leased tool call (check lease.in_lease())")
    return ctx


def fencing_token() -> int:
    """The claim generation of the running attempt, to send to a fenced downstream (``Fencing-Token``)."""
    return context().fencing_token


def idempotency_key() -> str:
    """The action's idempotency key, the same in every attempt (``Idempotency-Key``)."""
    return context().idempotency_key


async def advance(stage: Stage | str, reason: str) -> None:
    """Enter ``stage`` (a :class:`~agentlease.enums.Stage` or its value, from a leased function's
    ``external_call``: ``commit`` or ``verify``) with a specific ``reason``, as
    :meth:`~agentlease.tools.LeaseContext.advance` does (its errors; ``ValueError`` for an unknown stage too).
    """
    await context().advance(Stage(stage), reason)


async def renew(reason: str) -> None:
    """Extend the lease in the current stage with a specific reason, as :meth:`~agentlease.tools.LeaseContext.renew`
    does (its errors)."""
    await context().renew(reason)


def downstream_headers(resource: str | None = None) -> dict[str, str]:
    """The headers of a write to a downstream that follows the project's HTTP convention, as
    :meth:`~agentlease.tools.LeaseContext.downstream_headers` makes them (``docs/edge.md``)."""
    return context().downstream_headers(resource)


def receipt(external_system: str, external_id: str, status: str, **details: Any) -> SettlementReceipt:
    """A settlement receipt of what the tool just read back, verified now, to return in a ``ToolResult``
    (the arguments as for :meth:`~agentlease.tools.LeaseContext.receipt`)."""
    return context().receipt(external_system, external_id, status, **details)
