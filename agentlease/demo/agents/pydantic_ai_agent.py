"""A restock agent on Pydantic AI, durable on Temporal, whose three tool calls are leased, with a scripted model
(no API key) and a worker (``python -m agentlease.demo.agents.pydantic_ai_agent``). ``docs/agents.md``."""

from __future__ import annotations

import csv
import io
import re
import uuid
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.client import Client

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel, Field
    from pydantic_ai import Agent, ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.durable_exec.temporal import PydanticAIPlugin, PydanticAIWorkflow, TemporalDurability
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from agentlease.demo.agents import with_example
    from agentlease.enums import SideEffectClass
    from agentlease.pydantic_ai._toolset import LeasedToolset, run_agent
    from agentlease.settings import AgentLeaseSettings
    from agentlease.tools._context import LeaseContext
    from agentlease.tools._declaration import ToolResult, tool
    from agentlease.tools.builtin.http_get import http_get
    from agentlease.tools.builtin.http_publish import SLUG_PATTERN, HttpPublishArgs, http_publish
    from agentlease.tools.builtin.sql_upsert import sql_upsert
    from agentlease.worker import main as worker_main

MODULE = "agentlease.demo.agents.pydantic_ai_agent"
"""This module's import path (what the worker settings name)."""

WORKFLOW = "RestockAgentWorkflow"
"""The workflow type of a run of this agent."""

DEFAULT_PROMPT = "Check the stock list at files/inventory.csv and reorder every item below 100 units."

STOCK_LIST = "files/inventory.csv"
DEFAULT_THRESHOLD = 100
"""Units below which an item is reordered, unless the prompt says "below N"."""
STOCK_TABLE = "inventory"
REPORT_SLUG = "restock-report"
TARGET_UNITS = 200
"""Stock level a reorder brings an item back to."""


# -- the agent's own tool ------------------------------------------------------------------------


class LowStock(BaseModel):
    """One item below target."""

    sku: str = Field(min_length=1, max_length=64)
    name: str = Field(max_length=200)
    quantity: int = Field(ge=0)
    reorder: int = Field(gt=0)


class RestockReport(BaseModel):
    """Arguments of ``publish_restock_report``: the report's ``slug``, and the ``items`` below target."""

    slug: str = Field(pattern=SLUG_PATTERN)
    items: list[LowStock] = Field(min_length=1, max_length=100)


@tool(side_effect=SideEffectClass.FENCED, lease_ttl=timedelta(seconds=15), start_to_close=timedelta(minutes=2))
async def publish_restock_report(ctx: LeaseContext, args: RestockReport) -> ToolResult:
    """Publish the restock report (one line per item below target) once per idempotency key."""
    lines = [f"- {item.sku} {item.name}: {item.quantity} in stock, reorder {item.reorder}" for item in args.items]
    post = HttpPublishArgs(
        slug=args.slug, title=f"Restock report: {len(args.items)} item(s) below target", body="\n".join(lines)
    )
    # The publishing itself is http_publish's: read back by key, write with the fencing token, verify.
    return await http_publish.fn(ctx, post)


# -- the scripted model --------------------------------------------------------------------------


def _returns(messages: list[ModelMessage]) -> dict[str, list[ToolReturnPart]]:
    """Every tool result the model has seen, by tool name."""
    found: dict[str, list[ToolReturnPart]] = {}
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, ToolReturnPart):
                    found.setdefault(part.tool_name, []).append(part)
    return found


def _prompt(messages: list[ModelMessage]) -> str:
    first = messages[0]
    assert isinstance(first, ModelRequest)
    return " ".join(str(getattr(part, "content", "")) for part in first.parts)


def low_stock(csv_text: str, below: int) -> list[LowStock]:
    """The rows of a ``sku,name,warehouse,quantity`` list whose quantity is below ``below``."""
    rows = [(row, int(row["quantity"])) for row in csv.DictReader(io.StringIO(csv_text))]
    return [
        LowStock(sku=row["sku"], name=row["name"], quantity=quantity, reorder=TARGET_UNITS - quantity)
        for row, quantity in rows
        if quantity < below
    ]


def restock_script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The scripted model: fetch the stock list, then write from it, then answer from the outputs."""
    prompt = _prompt(messages)
    returns = _returns(messages)
    if "http_get" not in returns:
        url = re.search(r"\S+\.csv", prompt)
        return ModelResponse(parts=[ToolCallPart("http_get", {"url": url[0] if url else STOCK_LIST})])
    if not {"sql_upsert", "publish_restock_report"} & set(returns):
        fetched = returns["http_get"][-1]
        if fetched.outcome != "success" or not isinstance(fetched.content, dict):
            return ModelResponse(parts=[TextPart(f"I could not read the stock list: {fetched.content}")])
        threshold = re.search(r"below (\d+)", prompt)
        below = int(threshold[1]) if threshold else DEFAULT_THRESHOLD
        items = low_stock(fetched.content["preview"], below)
        if not items:
            return ModelResponse(parts=[TextPart(f"Every item has at least {below} units; nothing to reorder.")])
        calls: list[Any] = [
            ToolCallPart(
                "sql_upsert",
                {
                    "table": STOCK_TABLE,
                    "record_key": f"reorder:{item.sku}",
                    "row": {"sku": item.sku, "reorder": item.reorder},
                },
            )
            for item in items
        ]
        report = {"slug": REPORT_SLUG, "items": [item.model_dump() for item in items]}
        calls.append(ToolCallPart("publish_restock_report", report))
        return ModelResponse(parts=calls)
    return ModelResponse(parts=[TextPart(_answer(returns))])


def _answer(returns: dict[str, list[ToolReturnPart]]) -> str:
    """The final answer, made from what the tools returned."""
    lines = []
    for part in returns.get("sql_upsert", []):
        if part.outcome == "success" and isinstance(part.content, dict):
            lines.append(f"reorder recorded as {part.content['record_key']}")
        else:
            lines.append(f"a reorder was not recorded: {part.content}")
    for part in returns.get("publish_restock_report", []):
        if part.outcome == "success" and isinstance(part.content, dict):
            lines.append(f"report published as post {part.content['post_id']} ({part.content['slug']})")
        else:
            lines.append(f"the report was not published: {part.content}")
    return "Restock done: " + "; ".join(lines) + "."


MODEL = FunctionModel(restock_script, model_name="scripted-restock")
"""The scripted model; ``docs/agents.md`` shows how to switch to a real one."""

TOOLSET = LeasedToolset([http_get, sql_upsert, publish_restock_report])

restock_agent = Agent(
    MODEL,
    name="restock_agent",
    instructions="You restock a warehouse: read the stock list, reorder what is low, publish a report.",
    toolsets=[TOOLSET],
    capabilities=[TemporalDurability()],
)


# -- the workflow --------------------------------------------------------------------------------


@workflow.defn(name=WORKFLOW)
class RestockAgentWorkflow(PydanticAIWorkflow):
    """One run of the restock agent: the prompt in, the final answer out; its tool calls are leased tasks
    ``<workflow id>/<tool>-<tool call id>``, decided like a plan run's."""

    __pydantic_ai_agents__ = [restock_agent]  # noqa: RUF012  (read by PydanticAIPlugin)

    @workflow.init
    def __init__(self, prompt: str) -> None:
        self._calls = TOOLSET.leased_calls()

    @workflow.run
    async def run(self, prompt: str) -> str:
        return (await run_agent(restock_agent, prompt)).output


# -- running it ----------------------------------------------------------------------------------


def client_plugin() -> PydanticAIPlugin:
    """The client plugin the agent's workers and clients need (``AGENTLEASE_PLUGINS`` names this factory)."""
    return PydanticAIPlugin()


def agent_settings(settings: AgentLeaseSettings) -> AgentLeaseSettings:
    """``settings`` with this module's client plugin, workflow and tool added (once)."""
    return with_example(settings, plugin=f"{MODULE}:client_plugin", workflows=MODULE, tools=MODULE)


async def run_scripted_agent(
    client: Client, task_queue: str, *, prompt: str = DEFAULT_PROMPT, run_id: str | None = None
) -> str:
    """Run the restock agent for ``prompt`` on ``task_queue`` (polled by a worker of :func:`agent_settings`) as
    ``run_id`` (default ``restock-agent-<random>``); its final answer. WorkflowFailureError: failed or cancelled."""
    return await client.execute_workflow(
        WORKFLOW, prompt, id=run_id or f"restock-agent-{uuid.uuid4().hex[:12]}", task_queue=task_queue, result_type=str
    )


def main() -> int:
    """``python -m agentlease.demo.agents.pydantic_ai_agent``: a worker for this agent."""
    return worker_main(configure=agent_settings)


if __name__ == "__main__":
    from agentlease.demo.agents import pydantic_ai_agent  # the workflow under its module name, not __main__
    from agentlease.runtime.shutdown import exit_process

    exit_process(pydantic_ai_agent.main())
