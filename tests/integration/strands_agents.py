"""A Strands refunds agent on Temporal for the tests: a scripted model (``StrandsPlugin(models=...)``, run as an
activity) and leased tools. The model asks for the refunds its prompt lists (``refund A-1 500; refund A-2 700``)
in one turn, then answers with what each use told it.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from strands.models.model import Model
    from temporalio.strands_agents import TemporalAgent

    from agentlease.strands import leased_tool, run_agent
    from tests.integration.file_refunds import issue_refund

MODEL = "scripted-refunds"


ScriptedTurn = str | list[tuple[str, dict[str, Any]]]
"""One turn of a scripted model: its final text, or the tool uses it asks for (name, input)."""


class ScriptedModel(Model):
    """A Strands model that follows a script: a subclass says what each turn is (:meth:`turn`), from the
    conversation's content blocks; its tool uses are ``call-1``, ``call-2``..."""

    def update_config(self, **model_config: Any) -> None:
        return None

    def get_config(self) -> dict[str, Any]:
        return {}

    def structured_output(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("a scripted model answers in text")

    def turn(self, blocks: list[dict[str, Any]]) -> ScriptedTurn:
        raise NotImplementedError

    async def stream(
        self, messages: Any, tool_specs: Any = None, system_prompt: Any = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        turn = self.turn([block for message in messages for block in message["content"]])
        yield {"messageStart": {"role": "assistant"}}
        if isinstance(turn, str):
            yield {"contentBlockDelta": {"delta": {"text": turn}}}
            yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "end_turn"}}
            return
        for n, (name, arguments) in enumerate(turn, 1):
            yield {"contentBlockStart": {"start": {"toolUse": {"toolUseId": f"call-{n}", "name": name}}}}
            yield {"contentBlockDelta": {"delta": {"toolUse": {"input": json.dumps(arguments)}}}}
            yield {"contentBlockStop": {}}
        yield {"messageStop": {"stopReason": "tool_use"}}


class ScriptedRefunds(ScriptedModel):
    """The refunds script: every refund the prompt lists, then what each use told it."""

    def turn(self, blocks: list[dict[str, Any]]) -> ScriptedTurn:
        told = [block["toolResult"] for block in blocks if "toolResult" in block]
        if told:
            return " | ".join(r["content"][0]["text"] for r in told)
        prompt = " ".join(block.get("text", "") for block in blocks)
        refunds = re.findall(r"refund (\S+) (\d+)", prompt)
        return [("issue_refund", {"order_id": order, "amount_cents": int(cents)}) for order, cents in refunds]


@workflow.defn
class StrandsRefundWorkflow:
    @workflow.run
    async def run(self, prompt: str) -> str:
        agent = TemporalAgent(
            model=MODEL,
            start_to_close_timeout=timedelta(seconds=30),
            tools=[leased_tool(issue_refund)],
            callback_handler=None,
        )
        result = await run_agent(agent, prompt)
        return str(result)
