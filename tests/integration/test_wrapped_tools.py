"""Existing tools leased as they are (``agentlease.leased``): in a workflow on the real dev server, and
in agents run outside any workflow (a local run, a unit test, an eval)."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import timedelta
from typing import Any

import pytest
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from agents import Agent
    from pydantic_ai import Agent as PydanticAgent
    from pydantic_ai import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai import Tool as PydanticTool
    from pydantic_ai.durable_exec.temporal import TemporalDurability
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from temporalio import activity
    from temporalio.client import Client

    from agentlease import lease, leased
    from agentlease.demo.agents import scripted_prompt
    from agentlease.demo.agents.openai_agent import ScriptedModel
    from agentlease.enums import EventKind, Stage, TaskStatus
    from agentlease.openai_agents import leased_run_config, leased_tool, run_agent
    from agentlease.pydantic_ai import LeasedToolset
    from agentlease.settings import AgentLeaseSettings
    from agentlease.tools import ToolRegistry, ToolResult
    from agentlease.worker import build_worker
    from agentlease.workflow import call_tool
    from tests.integration.test_lease_on_temporal import opened_ledger, renewed_stages

pytestmark = pytest.mark.timeout(120)

SEEN: dict[str, dict[str, Any]] = {}
"""What each call of a wrapped tool read of its lease, by order id (in-process workers only)."""

ORDERS = {"A-1001": 4200, "A-1002": 1999}
"""Order amounts in cents."""


# -- the team's tools, as they were, each leased with one line ---------------------------------------


@leased(side_effect="fenced", lease_ttl=timedelta(seconds=10))
async def issue_refund(order_id: str, amount_cents: int) -> dict[str, Any]:
    """Refund an order through the refund service."""
    if lease.in_lease():
        SEEN[order_id] = {
            "fencing_token": lease.fencing_token(),
            "idempotency_key": lease.idempotency_key(),
            "headers": lease.downstream_headers(f"refunds/{order_id}"),
            "stage": lease.context().stage,
        }
    return {"order_id": order_id, "refunded_cents": amount_cents}


@leased(side_effect="read_only", lease_ttl=timedelta(seconds=10))
@activity.defn(name="lookup_order")
async def lookup_order(order_id: str) -> int:
    """Look an order up: what it cost, in cents."""
    return ORDERS.get(order_id, 1000)


@leased(side_effect="idempotent", lease_ttl=timedelta(seconds=10))
async def tag_order(order_id: str, tag: str) -> ToolResult:
    """Tag an order, reading the tag back for the receipt."""
    await lease.advance(Stage.VERIFY, f"reading the tags of {order_id} back")
    return ToolResult(receipt=lease.receipt("tags", f"{order_id}#{tag}", "tagged"), output={"tagged": tag})


REGISTRY = ToolRegistry([issue_refund, lookup_order, tag_order])


@workflow.defn
class RefundWorkflow:
    """Looks an order up, refunds what it cost and tags it: three wrapped tools through ``call_tool``, the
    last one by its name only."""

    @workflow.run
    async def run(self, order_id: str) -> dict[str, Any]:
        looked_up = await call_tool(lookup_order, {"order_id": order_id}, step_id="lookup")
        assert looked_up.output is not None
        amount = looked_up.output["result"]
        refunded = await call_tool(issue_refund, {"order_id": order_id, "amount_cents": amount}, step_id="refund")
        # Named, not declared: the run learns the worker's catalog beside the tools it declared.
        tagged = await call_tool("tag_order", {"order_id": order_id, "tag": "refunded"}, step_id="tag")
        return {
            step: {"status": done.view.status.value, "generation": done.view.claim_generation, "output": done.output}
            for step, done in (("lookup", looked_up), ("refund", refunded), ("tag", tagged))
        }


async def test_a_workflow_calls_wrapped_tools_that_read_their_lease_and_settle(
    client: Client, settings: AgentLeaseSettings
) -> None:
    run_id = f"wrapped-{uuid.uuid4().hex[:8]}"
    order_id = f"A-{uuid.uuid4().hex[:6]}"
    async with opened_ledger(settings) as ledger:
        worker = build_worker(client, ledger, REGISTRY, settings, identity="worker-W", workflows=[RefundWorkflow])
        async with worker:
            handle = await client.start_workflow(
                RefundWorkflow.run, order_id, id=run_id, task_queue=settings.task_queue
            )
            result = await asyncio.wait_for(handle.result(), timeout=60)

        assert result == {
            "lookup": {"status": "settled", "generation": 1, "output": {"result": 1000}},
            "refund": {
                "status": "settled",
                "generation": 1,
                "output": {"order_id": order_id, "refunded_cents": 1000},
            },
            "tag": {"status": "settled", "generation": 1, "output": {"tagged": "refunded"}},
        }
        # The function read its lease: generation 1, the run/step key, the convention's headers.
        seen = SEEN[order_id]
        assert (seen["fencing_token"], seen["idempotency_key"]) == (1, f"{run_id}:refund")
        assert seen["headers"]["Idempotency-Key"] == f"{run_id}:refund"
        assert seen["headers"]["Fencing-Token"] == "1"
        assert seen["stage"] is Stage.EXTERNAL_CALL  # recorded before the function was called

        # A plain return value settles with the default receipt: (tool, key, "returned").
        refund = await ledger.get_task(f"{run_id}/refund")
        assert (refund.status, refund.claim_generation, refund.lease_owner) == (TaskStatus.SETTLED, 1, "worker-W")
        assert refund.receipt is not None
        assert (refund.receipt.external_system, refund.receipt.external_id, refund.receipt.status) == (
            "issue_refund",
            f"{run_id}:refund",
            "returned",
        )
        stored = await ledger.receipt(f"{run_id}:refund")
        assert stored is not None and stored.receipt == refund.receipt
        assert renewed_stages(await ledger.events(f"{run_id}/refund")) == [Stage.EXTERNAL_CALL]

        # A read-only tool records no stage; the activity's name is the tool's.
        lookup = await ledger.get_task(f"{run_id}/lookup")
        assert (lookup.tool, lookup.status) == ("lookup_order", TaskStatus.SETTLED)
        assert not [e for e in await ledger.events(f"{run_id}/lookup") if e.kind is EventKind.RENEWED]
        assert lookup.receipt is not None and lookup.receipt.external_id == f"{run_id}:lookup"

        # A function that returns its own ToolResult settles with its receipt, after the stages it recorded.
        tag = await ledger.get_task(f"{run_id}/tag")
        assert tag.receipt is not None
        assert (tag.receipt.external_system, tag.receipt.external_id, tag.receipt.status) == (
            "tags",
            f"{order_id}#refunded",
            "tagged",
        )
        assert renewed_stages(await ledger.events(f"{run_id}/tag")) == [Stage.EXTERNAL_CALL, Stage.VERIFY]


# -- the same tools in agents run outside a workflow -------------------------------------------------


def _tool_results(messages: list[ModelMessage]) -> list[dict[str, Any]]:
    return [
        {"tool": part.tool_name, "content": part.content}
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]


async def test_a_pydantic_ai_agent_with_leased_tools_runs_outside_a_workflow() -> None:
    shown: dict[str, Any] = {}

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        shown.update({tool.name: tool for tool in info.function_tools})
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("lookup_order", {"order_id": "A-1002"})])
        if len(messages) == 3:
            return ModelResponse(parts=[ToolCallPart("issue_refund", {"order_id": "A-1002", "amount_cents": 1999})])
        return ModelResponse(parts=[TextPart(json.dumps(_tool_results(messages)))])

    def weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    toolset = LeasedToolset(
        [
            lookup_order,
            issue_refund,
            leased(PydanticTool(weather), side_effect="read_only", lease_ttl=timedelta(seconds=5)),
        ]
    )
    agent = PydanticAgent(
        FunctionModel(model), name="local_refunds", toolsets=[toolset], capabilities=[TemporalDurability()]
    )

    result = await agent.run("refund A-1002")

    assert json.loads(result.output) == [
        {"tool": "lookup_order", "content": {"result": 1999}},
        {"tool": "issue_refund", "content": {"order_id": "A-1002", "refunded_cents": 1999}},
    ]
    assert "A-1002" not in SEEN  # no lease: the function ran as a plain call
    # The model read the wrapped functions' docstrings and the argument models built from their signatures.
    assert shown["issue_refund"].description == "Refund an order through the refund service."
    assert shown["issue_refund"].parameters_json_schema == issue_refund.args_model.model_json_schema()
    assert shown["weather"].description == "The weather in a city."


async def test_an_openai_agent_with_leased_tools_runs_outside_a_workflow() -> None:
    agent: Agent[None] = Agent(
        name="local_refunds",
        instructions="Refund what the order cost.",
        model=ScriptedModel(),
        tools=[leased_tool(lookup_order), leased_tool(issue_refund)],
    )
    prompt = scripted_prompt(
        "refund A-1001",
        [{"tool": "lookup_order", "arguments": {"order_id": "A-1001"}}],
        [{"tool": "issue_refund", "arguments": {"order_id": "A-1001", "amount_cents": 4200}}],
    )

    result = await run_agent(agent, prompt, run_config=leased_run_config(tracing_disabled=True))

    answer = str(result.final_output).splitlines()
    assert answer[1:] == [
        '- lookup_order: {"result": 4200}',
        '- issue_refund: {"order_id": "A-1001", "refunded_cents": 4200}',
    ]
    assert "A-1001" not in SEEN
