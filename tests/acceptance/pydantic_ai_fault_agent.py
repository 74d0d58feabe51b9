"""A Pydantic AI agent whose leased tools can be held at a stage, for the fault tests.

The tools run the pause/kill matrix's code (:func:`tests.acceptance.matrix_tools.matrix_attempt`:
hold points, a downstream that counts accepted writes) under a longer lease than the matrix's, so
that a loaded machine does not lose a held lease before the test pauses or kills its worker. The
model is the scripted one of :mod:`tests.integration.pydantic_ai_agents` (the prompt lists the
calls; the answer is what the model was told). Worker processes serve it with
``AGENTLEASE_TOOL_MODULES`` and ``AGENTLEASE_WORKFLOW_MODULES`` naming this module.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic_ai import Agent
    from pydantic_ai.durable_exec.temporal import PydanticAIWorkflow, TemporalDurability
    from pydantic_ai.models.function import FunctionModel

    from agentlease.enums import SideEffectClass
    from agentlease.pydantic_ai._toolset import LeasedToolset, run_agent
    from agentlease.tools._context import LeaseContext
    from agentlease.tools._declaration import ToolResult, tool
    from tests.acceptance.matrix_tools import MatrixArgs, matrix_attempt
    from tests.integration.pydantic_ai_agents import follow_prompt

LEASE_TTL = timedelta(seconds=5)
"""Lease TTL (= heartbeat timeout) of the agent's tools."""

WORKFLOW = "FaultAgentWorkflow"


@tool(side_effect=SideEffectClass.IDEMPOTENT, lease_ttl=LEASE_TTL, start_to_close=timedelta(minutes=2))
async def publish_document(ctx: LeaseContext, args: MatrixArgs) -> ToolResult:
    """Publish ``args.target`` under the call's idempotency key; read it back."""
    return await matrix_attempt(ctx, args)


@tool(side_effect=SideEffectClass.FENCED, lease_ttl=LEASE_TTL, start_to_close=timedelta(minutes=2))
async def publish_fenced_document(ctx: LeaseContext, args: MatrixArgs) -> ToolResult:
    """Publish ``args.target`` with the claim generation as fencing token; read it back."""
    return await matrix_attempt(ctx, args)


TOOLSET = LeasedToolset([publish_document, publish_fenced_document])

fault_agent = Agent(
    FunctionModel(follow_prompt, model_name="scripted"),
    name="fault_agent",
    toolsets=[TOOLSET],
    capabilities=[TemporalDurability()],
)


@workflow.defn(name=WORKFLOW)
class FaultAgentWorkflow(PydanticAIWorkflow):
    """Runs the fault agent on a ``prompt_for`` prompt; returns what the model was told (JSON)."""

    __pydantic_ai_agents__ = [fault_agent]  # noqa: RUF012  (read by PydanticAIPlugin)

    @workflow.init
    def __init__(self, prompt: str) -> None:
        self.calls = TOOLSET.leased_calls()

    @workflow.run
    async def run(self, prompt: str) -> str:
        return (await run_agent(fault_agent, prompt)).output
