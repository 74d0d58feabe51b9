"""The refunds tool the framework adapter tests share: each refund appends one line to a file (the downstream)."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity

from agentlease import leased

REFUNDS_FILE = "AGENTLEASE_TEST_REFUNDS_FILE"
"""The environment variable naming the file each refund appends one line to (the downstream, for counting)."""


@leased(side_effect="idempotent", lease_ttl=timedelta(seconds=10), action_key="refund:{order_id}")
@activity.defn
async def issue_refund(order_id: str, amount_cents: int) -> dict[str, Any]:
    """Refund an order."""
    with Path(os.environ[REFUNDS_FILE]).open("a") as refunds:
        refunds.write(f"{order_id} {amount_cents} {activity.info().attempt}\n")
    return {"order_id": order_id, "refunded_cents": amount_cents}
