"""The support agent: a Google ADK agent run durably by Temporal (``GoogleAdkPlugin``)."""

from datetime import timedelta

from google.adk import Agent
from google.adk.runners import InMemoryRunner
from google.genai import types
from temporalio import workflow
from temporalio.google_adk import TemporalModel
from temporalio.google_adk.workflow import activity_as_tool

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
                activity_as_tool(lookup_order, start_to_close_timeout=timedelta(seconds=30)),
                activity_as_tool(issue_refund, start_to_close_timeout=timedelta(seconds=30)),
            ],
        )
        runner = InMemoryRunner(agent=agent, app_name="support")
        session = await runner.session_service.create_session(app_name="support", user_id="user")
        message = types.Content(role="user", parts=[types.Part(text=prompt)])
        events = [event async for event in runner.run_async(user_id="user", session_id=session.id, new_message=message)]
        return "".join(part.text or "" for part in events[-1].content.parts or [])
