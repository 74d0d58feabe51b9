"""The support agent's two tools, Temporal activities: look an order up, refund it."""

import os
from datetime import timedelta
from typing import Any

import httpx
from agentlease import leased
from temporalio import activity

REFUND_SERVICE_URL = os.environ.get("REFUND_SERVICE_URL", "http://127.0.0.1:8000")

ORDERS = {"A-1001": 4200, "A-1002": 1999}
"""The shop's orders and what they cost, in cents (a stand-in for its order database)."""


@leased(side_effect="read_only", lease_ttl=timedelta(seconds=10))
@activity.defn
async def lookup_order(order_id: str) -> dict[str, Any]:
    """Look an order up: what it cost and whether it can be refunded."""
    return {"order_id": order_id, "amount_cents": ORDERS.get(order_id, 1000), "refundable": True}


@leased(side_effect="fenced", lease_ttl=timedelta(seconds=5), action_key="refund:{order_id}", fenced=REFUND_SERVICE_URL)
@activity.defn
async def issue_refund(order_id: str, amount_cents: int) -> dict[str, Any]:
    """Refund an order through the refund service."""
    async with httpx.AsyncClient(base_url=REFUND_SERVICE_URL, timeout=60) as http:
        response = await http.post(
            "/refunds",
            json={"order_id": order_id, "amount_cents": amount_cents},
        )
    response.raise_for_status()
    refund: dict[str, Any] = response.json()
    return refund
