"""Running the ``agentlease`` CLI as a separate process from an async test."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Mapping


async def agentlease(*args: str, env: Mapping[str, str], timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """``python -m agentlease.cli.app ARGS`` with ``env`` over this process's environment."""
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "agentlease.cli.app", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
