"""Run this deployment's expired-lease sweeper until SIGTERM (``python -m reconciliation``).

The sweeper records leases that lapsed on the ledger's clock and classifies each by the recovery
policy; ``RUNBOOK.md`` beside this file says what an operator does with what it parks.
"""

import asyncio
import sys

from agentlease import AgentLeaseSettings, Ledger
from agentlease.recovery import ExpiredLeaseSweeper, SweeperSettings
from agentlease.tools import load_registry
from agentlease.worker import stop_event


async def sweep(settings: AgentLeaseSettings) -> None:
    limits = {spec.name: spec.max_attempts for spec in load_registry(settings.tool_modules).specs()}
    ledger = Ledger.from_url(settings.ledger_url)
    try:
        options = SweeperSettings(max_attempts_by_tool=limits, approval_warning=settings.approval_warning)
        await ExpiredLeaseSweeper(ledger, options).run(stop_event())
    finally:
        await ledger.close()


if __name__ == "__main__":
    try:
        asyncio.run(sweep(AgentLeaseSettings()))
    except KeyboardInterrupt:
        sys.exit(130)
