"""The effect-safety benchmark's Strands agent (``temporalio.strands_agents``), native and leased: run in a virtualenv
with the ``strands`` extra (which needs ``mcp<2``; ``bench/README.md``).

The scripted model (``StrandsPlugin(models=...)``, run as the plugin's model activity) reads the trial's one call
from the prompt (:func:`bench.effects_tools.refund_prompt`), then answers with what the tool returned.
``strands-native`` runs the tool with ``activity_as_tool(refund_activity)`` (the native tools' timeouts);
``strands-leased`` with :func:`agentlease.strands.leased_tool`. Workflow code: re-imported in the sandbox.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from temporalio.strands_agents import TemporalAgent
    from temporalio.strands_agents.workflow import activity_as_tool

    from agentlease.strands import leased_tool, run_agent
    from bench.effects_tools import LEASE_TTL, NATIVE_START_TO_CLOSE, REFUND_TOOL, refund_activity
    from tests.integration.strands_agents import ScriptedModel, ScriptedTurn

MODEL = "scripted-effects"


class ScriptedEffects(ScriptedModel):
    """The prompt's one call, then the tool's answer as the final text."""

    def turn(self, blocks: list[dict[str, Any]]) -> ScriptedTurn:
        returned = [block["toolResult"]["content"][0]["text"] for block in blocks if "toolResult" in block]
        if returned:
            return returned[-1]
        prompt = next(block["text"] for block in blocks if "text" in block)
        [call] = json.loads(prompt)["turns"][0]
        return [(call["tool"], call["arguments"])]


def _agent(tool: Any) -> TemporalAgent:
    return TemporalAgent(model=MODEL, start_to_close_timeout=timedelta(seconds=60), tools=[tool], callback_handler=None)


@workflow.defn(name="EffectsStrandsNative")
class StrandsNative:
    @workflow.run
    async def run(self, prompt: str) -> str:
        timeouts = {"start_to_close_timeout": NATIVE_START_TO_CLOSE, "heartbeat_timeout": LEASE_TTL}
        return str(await _agent(activity_as_tool(refund_activity, **timeouts)).invoke_async(prompt))


@workflow.defn(name="EffectsStrandsLeased")
class StrandsLeased:
    @workflow.run
    async def run(self, prompt: str) -> str:
        return str(await run_agent(_agent(leased_tool(REFUND_TOOL)), prompt))


WORKFLOWS: dict[str, Any] = {"strands-native": StrandsNative, "strands-leased": StrandsLeased}
"""Each Strands system's workflow class."""
