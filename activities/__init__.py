"""This deployment's tools, written as any agentlease user writes them (``docs/writing-tools.md``)."""
