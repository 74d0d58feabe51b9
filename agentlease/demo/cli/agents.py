"""The demo's example agents (OpenAI Agents SDK, Pydantic AI) with scripted models, each on a worker and task
queue of its own (the two frameworks bring different payload converters)."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

from temporalio.client import Client, WorkflowHandle

from agentlease.settings import AgentLeaseSettings
from agentlease.worker import running_worker


@dataclass(frozen=True)
class DemoAgent:
    """One example agent the demo runs: ``configure`` adds its plugin, workflow and tools to the settings,
    ``start`` starts one scripted run; skipped without ``module`` (installed by the ``extra``)."""

    framework: str
    configure: Callable[[AgentLeaseSettings], AgentLeaseSettings]
    start: Callable[[Client, str, str], Awaitable[WorkflowHandle[Any, Any]]]
    module: str
    extra: str

    @property
    def installed(self) -> bool:
        return importlib.util.find_spec(self.module) is not None


async def _start_openai(client: Client, task_queue: str, run_id: str) -> WorkflowHandle[Any, Any]:
    from agentlease.demo.agents.openai_agent import AgentRequest, RestockAgent, restock_prompt

    # Another row than the restock plan's (A-1002): two runs upserting one row under two idempotency
    # keys would each read back the other's key and retry.
    prompt = restock_prompt("B-2040", 8)
    return await client.start_workflow(RestockAgent.run, AgentRequest(prompt=prompt), id=run_id, task_queue=task_queue)


async def _start_pydantic_ai(client: Client, task_queue: str, run_id: str) -> WorkflowHandle[Any, Any]:
    from agentlease.demo.agents.pydantic_ai_agent import DEFAULT_PROMPT, WORKFLOW

    return await client.start_workflow(WORKFLOW, DEFAULT_PROMPT, id=run_id, task_queue=task_queue, result_type=str)


def _openai_settings(settings: AgentLeaseSettings) -> AgentLeaseSettings:
    from agentlease.demo.agents.openai_agent import agent_settings

    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # a scripted model has no key to export traces to
    return agent_settings(settings)


def _pydantic_ai_settings(settings: AgentLeaseSettings) -> AgentLeaseSettings:
    from agentlease.demo.agents.pydantic_ai_agent import agent_settings

    # Pydantic AI shows a banner (pointing at Logfire) at an agent's first run in a terminal: not the demo's story.
    os.environ.setdefault("PYDANTIC_AI_NO_BANNER", "1")

    return agent_settings(settings)


AGENTS = (
    DemoAgent("OpenAI Agents SDK", _openai_settings, _start_openai, module="agents", extra="openai-agents"),
    DemoAgent("Pydantic AI", _pydantic_ai_settings, _start_pydantic_ai, module="pydantic_ai", extra="pydantic-ai"),
)


def missing_frameworks() -> list[DemoAgent]:
    """The example agents whose framework is not installed (the demo skips them)."""
    return [agent for agent in AGENTS if not agent.installed]


@asynccontextmanager
async def agent_workers(settings: AgentLeaseSettings) -> AsyncIterator[list[tuple[DemoAgent, str]]]:
    """A worker per example agent on ``settings`` (the stack's), until the block exits: ``(agent, queue)``."""
    async with AsyncExitStack() as stack:
        serving = []
        for agent in AGENTS:
            if not agent.installed:
                continue
            queue = f"{settings.task_queue}-{agent.framework.lower().replace(' ', '-')}"
            configured = agent.configure(settings.model_copy(update={"task_queue": queue, "migrate_on_start": False}))
            await stack.enter_async_context(running_worker(configured))
            serving.append((agent, queue))
        yield serving


async def start_agent_runs(
    client: Client, serving: list[tuple[DemoAgent, str]], batch: str
) -> list[tuple[DemoAgent, WorkflowHandle[Any, Any]]]:
    """One scripted run per agent: ``demo-agent-<framework>-<batch>``."""
    started = []
    for agent, queue in serving:
        run_id = f"demo-agent-{agent.framework.lower().replace(' ', '-')}-{batch}"
        started.append((agent, await agent.start(client, queue, run_id)))
    return started
