"""The ``agentlease`` command line."""
