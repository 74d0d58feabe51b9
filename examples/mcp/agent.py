"""A Pydantic AI agent that adds contacts to the CRM of ``crm_server.py`` through agentlease.

Each call of ``create_contact`` is a leased activity: its idempotency key, fencing token, resource and
lease expiry travel in the request's ``_meta``, and the CRM's ``LeaseGuard`` enforces them. The model
here is scripted (it calls ``crm_create_contact`` once), so everything runs offline.

    temporal server start-dev
    export AGENTLEASE_LEDGER_URL=sqlite:///$PWD/ledger.db && agentlease db upgrade
    python agent.py worker                 # starts crm_server.py over stdio for each call
    python agent.py ask "Ada" ada@example.com
    python agent.py record                 # after the server's tools change: crm.tools.json again
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from agentlease import AgentLeasePlugin
    from agentlease.mcp import MCPServer, ToolPolicy, mcp_tools, record_server_tools
    from agentlease.pydantic_ai import LeasedToolset, run_agent
    from pydantic_ai import Agent, ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.durable_exec.temporal import PydanticAIPlugin, PydanticAIWorkflow, TemporalDurability
    from pydantic_ai.models.function import AgentInfo, FunctionModel

TASK_QUEUE = os.environ.get("AGENTLEASE_TASK_QUEUE", "crm-agent")
HERE = Path(__file__).parent  # no resolve(): this module is also imported in the workflow sandbox


CRM = MCPServer.stdio(
    "crm", "python", [str(HERE / "crm_server.py")], env={"CRM_DATABASE_URL": f"sqlite:///{HERE}/crm.db"}
)
if __name__ == "__main__" and sys.argv[1:] == ["record"]:  # before the declaration below, which reads it
    print(asyncio.run(record_server_tools(CRM, HERE / "crm.tools.json")))
    sys.exit(0)

# The arguments' schemas and descriptions come from crm.tools.json, the server's tools/list recorded beside
# this file (agentlease.mcp.record_server_tools); the policies say what the listing cannot.
crm_create_contact, crm_find_contact = mcp_tools(
    CRM,
    default=ToolPolicy(side_effect="read_only", lease_ttl=timedelta(seconds=10)),
    tools={
        "create_contact": ToolPolicy(side_effect="fenced", action_key="contact:{email}"),
        "find_contact": ToolPolicy(),
    },
    prefix="crm_",
)


def scripted(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Calls crm_create_contact with the prompt's JSON once, then answers with what it was told."""
    if len(messages) == 1:
        prompt = next(str(part.content) for part in messages[0].parts if part.part_kind == "user-prompt")
        return ModelResponse(parts=[ToolCallPart("crm_create_contact", json.loads(prompt))])
    told = [part.content for part in messages[-1].parts if part.part_kind == "tool-return"]
    return ModelResponse(parts=[TextPart(json.dumps(told))])


crm_agent = Agent(
    FunctionModel(scripted),
    name="crm_agent",
    toolsets=[LeasedToolset([crm_create_contact, crm_find_contact])],
    capabilities=[TemporalDurability()],
)


@workflow.defn
class CrmAgentWorkflow(PydanticAIWorkflow):
    __pydantic_ai_agents__ = [crm_agent]  # noqa: RUF012

    @workflow.run
    async def run(self, prompt: str) -> str:
        return (await run_agent(crm_agent, prompt)).output


async def main(argv: list[str]) -> Any:
    from temporalio.client import Client
    from temporalio.worker import Worker

    client = await Client.connect(
        os.environ.get("AGENTLEASE_TEMPORAL_ADDRESS", "localhost:7233"), plugins=[PydanticAIPlugin()]
    )
    if argv[:1] == ["worker"]:
        tools = [crm_create_contact, crm_find_contact]
        worker = Worker(
            client, task_queue=TASK_QUEUE, workflows=[CrmAgentWorkflow], plugins=[AgentLeasePlugin(tools=tools)]
        )
        await worker.run()
    name, email = argv[1:3]
    prompt = json.dumps({"name": name, "email": email})
    print(await client.execute_workflow(CrmAgentWorkflow.run, prompt, id=f"crm-{email}", task_queue=TASK_QUEUE))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
