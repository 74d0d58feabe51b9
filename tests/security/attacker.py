"""The attacker's workflows: they run on a worker of their own and schedule agentlease's activities on
the deployment's task queue with a victim's task id, key, TTL or decision."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy


@workflow.defn(name="AttackerToolCall")
class AttackerToolCall:
    """Schedules one leased tool activity with a hand-made input and heartbeat timeout."""

    @workflow.run
    async def run(self, queue: str, tool: str, call: dict[str, Any], heartbeat_s: float) -> dict[str, Any]:
        result: dict[str, Any] = await workflow.execute_activity(
            tool,
            call,
            task_queue=queue,
            heartbeat_timeout=timedelta(seconds=heartbeat_s),
            start_to_close_timeout=timedelta(minutes=1),
            retry_policy=RetryPolicy(maximum_attempts=3),
            result_type=dict,
        )
        return result


@workflow.defn(name="AttackerDecision")
class AttackerDecision:
    """Schedules the decision activity with a hand-made decision."""

    @workflow.run
    async def run(self, queue: str, decision: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = await workflow.execute_activity(
            "agentlease.apply_decision",
            decision,
            task_queue=queue,
            start_to_close_timeout=timedelta(minutes=1),
            retry_policy=RetryPolicy(maximum_attempts=3),
            result_type=dict,
        )
        return result
