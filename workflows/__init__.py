"""This deployment's agent workflows, written against agentlease's public API."""
