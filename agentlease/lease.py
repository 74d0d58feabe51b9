"""The lease of the running tool call, reachable from inside the tool the way ``temporalio.activity`` is::

    @leased(side_effect="fenced", lease_ttl=timedelta(seconds=10), action_key="refund:{order_id}")
    async def issue_refund(order_id: str, amount_cents: int) -> dict[str, Any]:
        response = await http.post("/refunds", json=..., headers=lease.downstream_headers(f"refunds/{order_id}"))

Outside a leased attempt :func:`in_lease` is false and every other function raises :class:`NotInLeaseError`
(``docs/wrapping-tools.md``).
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
    """The :class:`~agentlease.tools.LeaseContext` of the running attempt: its claim, recovery
    decision, settings, secrets and resources (``docs/writing-tools.md``, "The context").

    Raises:
        NotInLeaseError: not inside a leased attempt.
    """
    ctx = _current.get()
    if ctx is None:
        raise NotInLeaseError("no lease: this code runs outside a leased tool call (check lease.in_lease())")
    return ctx


def fencing_token() -> int:
    """The claim generation of the running attempt, to send to a fenced downstream (``Fencing-Token``).

    Raises:
        NotInLeaseError: not inside a leased attempt.
    """
    return context().fencing_token


def idempotency_key() -> str:
    """The action's idempotency key, the same in every attempt (``Idempotency-Key``).

    Raises:
        NotInLeaseError: not inside a leased attempt.
    """
    return context().idempotency_key


async def advance(stage: Stage | str, reason: str) -> None:
    """Enter ``stage`` (from a leased function's ``external_call``: ``commit`` or ``verify``), as
    :meth:`~agentlease.tools.LeaseContext.advance` does.

    Args:
        stage: a :class:`~agentlease.enums.Stage` or its value (``"commit"``); never back, never ``settled``.
        reason: what the tool is about to do, specifically ("refund 42 accepted, reading it back").

    Raises:
        NotInLeaseError: not inside a leased attempt.
        LeaseLostError: the lease lapsed or was superseded; stop and start no new side effect.
        LedgerUnavailableError: the ledger could not be reached; the stage is not recorded.
        ValueError: an unknown stage, a stage that goes back, or ``settled``.
    """
    await context().advance(Stage(stage), reason)


async def renew(reason: str) -> None:
    """Extend the lease in the current stage with a specific reason ("18 of 24 documents").

    Raises:
        NotInLeaseError: not inside a leased attempt.
        LeaseLostError: the lease lapsed or was superseded.
        LedgerUnavailableError: the ledger could not be reached; the lease is not confirmed.
    """
    await context().renew(reason)


def downstream_headers(resource: str | None = None) -> dict[str, str]:
    """The headers of a write to a downstream that follows the project's HTTP convention, as
    :meth:`~agentlease.tools.LeaseContext.downstream_headers` makes them (``docs/edge.md``).

    Args:
        resource: the fenced resource (``Fencing-Resource``); omitted: the idempotency key itself.

    Returns:
        ``Idempotency-Key`` and ``Fencing-Token`` (signed with a fencing key), and ``Fencing-Resource``.

    Raises:
        NotInLeaseError: not inside a leased attempt.
    """
    return context().downstream_headers(resource)


def receipt(external_system: str, external_id: str, status: str, **details: Any) -> SettlementReceipt:
    """A settlement receipt of what the tool just read back, verified now, to return in a ``ToolResult``.

    Args:
        external_system: what was written (``"refunds"``, ``"sql:inventory"``).
        external_id: the target's own id of the outcome.
        status: what the readback observed (``"refunded"``, ``"present"``).
        **details: small JSON-able facts from the readback.

    Raises:
        NotInLeaseError: not inside a leased attempt.
    """
    return context().receipt(external_system, external_id, status, **details)
