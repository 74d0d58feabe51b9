"""This deployment's worker (``python worker.py``), written against agentlease's public API.

It serves the plan runner and the built-in tools with the ``AGENTLEASE_*`` settings, the way
``agentlease worker`` does; see ``examples/`` for a worker of your own agent.
"""

import sys

from agentlease.worker import main

if __name__ == "__main__":
    sys.exit(main())
