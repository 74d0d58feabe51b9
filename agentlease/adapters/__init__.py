"""What the agent framework adapters share (``agentlease.openai_agents``, ``agentlease.pydantic_ai``): private."""
