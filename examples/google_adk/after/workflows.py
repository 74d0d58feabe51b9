"""The support agent: a Google ADK agent run durably by Temporal (``GoogleAdkPlugin``)."""

from agentlease.google_adk import leased_tool, run_agent
from google.adk import Agent
from google.adk.runners import InMemoryRunner
from google.genai import types
from temporalio import workflow
from temporalio.google_adk import TemporalModel

with workflow.unsafe.imports_passed_through():
    from activities import issue_refund, lookup_order
    from model import MODEL

INSTRUCTION = "You handle refund requests: look the order up, then refund what it cost."


@workflow.defn
class SupportAgentWorkflow:
    @workflow.run
    async def run(self, prompt: str) -> str:
        agent = Agent(
            name="support",
            model=TemporalModel(MODEL),
            instruction=INSTRUCTION,
            tools=[
                leased_tool(lookup_order),
                leased_tool(issue_refund),
            ],
        )
        runner = InMemoryRunner(agent=agent, app_name="support")
        session = await runner.session_service.create_session(app_name="support", user_id="user")
        message = types.Content(role="user", parts=[types.Part(text=prompt)])
        events = await run_agent(runner, user_id="user", session_id=session.id, new_message=message)
        return "".join(part.text or "" for part in events[-1].content.parts or [])
