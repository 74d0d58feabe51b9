"""The refund tool of the action-key tests (issue 18): an ``unsafe`` refund whose action is declared on the
tool, ``refund:{order_id}``, so that every caller (an OpenAI Agents agent, a Pydantic AI agent) keys its
calls by the order, whatever the model's tool-call id. Served in-process: :data:`REFUNDS` counts the
effects, by order."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from agentlease.tools._wrap import leased

REFUNDS: dict[str, list[int]] = {}
"""Every refund issued, by order id: the amounts (the effect a duplicate would repeat)."""


@leased(
    side_effect="unsafe",
    lease_ttl=timedelta(seconds=5),
    requires_approval=False,
    action_key="refund:{order_id}",
)
async def issue_refund(order_id: str, amount_cents: int) -> dict[str, Any]:
    """Refund an order (once per order: the action key is the order)."""
    REFUNDS.setdefault(order_id, []).append(amount_cents)
    return {"order_id": order_id, "refunded_cents": amount_cents, "refund_number": len(REFUNDS[order_id])}
