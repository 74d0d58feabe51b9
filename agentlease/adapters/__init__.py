"""What the agent framework adapters share (``agentlease.openai_agents``, ``pydantic_ai``, ``langgraph``,
``google_adk``): private."""
