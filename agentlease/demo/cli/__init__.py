"""The demo's commands (``agentlease demo``, ``agentlease dev``): the local stack, the takeover story and the
example agents."""
