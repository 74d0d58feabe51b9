"""Temporal glue: connecting, the dev server, stopping on signals, the names of agentlease's activities,
signals and queries, and an activity's validated input."""
