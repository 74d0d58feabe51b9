"""Adapters that turn a declared agentlease tool into an agent framework's tool (workflow code)."""
