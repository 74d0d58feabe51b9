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


class ScriptedRefunds(Model):
    """The refunds script as Strands stream events."""

    def update_config(self, **model_config: Any) -> None:
        return None

    def get_config(self) -> dict[str, Any]:
        return {}

    def structured_output(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    async def stream(
        self, messages: Any, tool_specs: Any = None, system_prompt: Any = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        blocks = [block for message in messages for block in message["content"]]
        told = [block["toolResult"] for block in blocks if "toolResult" in block]
        yield {"messageStart": {"role": "assistant"}}
        if told:
            answer = " | ".join(r["content"][0]["text"] for r in told)
            yield {"contentBlockDelta": {"delta": {"text": answer}}}
            yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "end_turn"}}
            return
        prompt = " ".join(block.get("text", "") for block in blocks)
        for n, (order, cents) in enumerate(re.findall(r"refund (\S+) (\d+)", prompt), 1):
            yield {"contentBlockStart": {"start": {"toolUse": {"toolUseId": f"call-{n}", "name": "issue_refund"}}}}
            arguments = json.dumps({"order_id": order, "amount_cents": int(cents)})
            yield {"contentBlockDelta": {"delta": {"toolUse": {"input": arguments}}}}
            yield {"contentBlockStop": {}}
        yield {"messageStop": {"stopReason": "tool_use"}}


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
