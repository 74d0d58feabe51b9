"""Worker processes as a user runs them (``agentlease worker``), to signal, kill and restart.

Shared by the pause/kill matrix, the recovery benchmark (``bench/recovery.py``) and the chaos run
(``bench/chaos.py``): each worker is the console script beside this interpreter, configured by
``AGENTLEASE_*`` variables, with the repository on ``PYTHONPATH`` so that tool modules of the tests
and benchmarks import.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from signal import SIGCONT, SIGKILL, Signals

from temporalio.client import Client

from tests.acceptance.runner import AGENTLEASE, Background, Cli, wait_for_poller

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Worker:
    """An ``agentlease worker`` process."""

    identity: str
    command: Background

    @property
    def pid(self) -> int:
        return self.command.process.pid

    @property
    def alive(self) -> bool:
        return self.command.process.poll() is None

    def signal(self, sig: Signals) -> None:
        os.kill(self.pid, sig)

    def stop(self, sig: Signals = SIGKILL, *, timeout: float = 30) -> int:
        """SIGCONT (it may be stopped), then ``sig``, and wait; a no-op for one already gone."""
        if self.alive:
            self.signal(SIGCONT)
        return self.command.stop(sig, timeout=timeout)

    def stderr_tail(self, lines: int = 15) -> str:
        return "".join(self.command.stderr[-lines:])


@dataclass
class Fleet:
    """Starts workers as a user does and stops every one of them.

    Attributes:
        temporal_address / ledger_url: where every worker connects.
        cli: the working directory and clean environment of the processes.
        tool_modules: ``AGENTLEASE_TOOL_MODULES`` of every worker.
        env: more ``AGENTLEASE_*`` settings for every worker; a ``PYTHONPATH`` there comes before the
            repository's.
    """

    temporal_address: str
    ledger_url: str
    cli: Cli
    tool_modules: str = "tests.acceptance.matrix_tools"
    env: Mapping[str, str] = field(default_factory=dict)
    started: list[Worker] = field(default_factory=list)

    def start(
        self,
        queue: str,
        identity: str,
        *,
        slots: int = 100,
        env: Mapping[str, str] | None = None,
        program: Path = AGENTLEASE,
        args: Sequence[str] = ("worker",),
        **extra: str,
    ) -> Worker:
        """Start a worker process (``agentlease worker``, or ``program`` with ``args``) on ``queue``;
        ``env`` and ``extra`` add to or override its ``AGENTLEASE_*`` settings."""
        settings = {**self.env, **(env or {}), **extra}
        paths = [settings.pop("PYTHONPATH", None), str(REPO), os.environ.get("PYTHONPATH")]
        env = {
            "PYTHONPATH": os.pathsep.join(filter(None, paths)),
            "AGENTLEASE_TEMPORAL_ADDRESS": self.temporal_address,
            "AGENTLEASE_TASK_QUEUE": queue,
            "AGENTLEASE_LEDGER_URL": self.ledger_url,
            "AGENTLEASE_TOOL_MODULES": self.tool_modules,
            "AGENTLEASE_WORKER_IDENTITY": identity,
            "AGENTLEASE_MAX_CONCURRENT_ACTIVITIES": str(slots),
            "AGENTLEASE_SHUTDOWN_GRACE": "1",
            **settings,
        }
        self.started.append(Worker(identity, Background(self.cli, *args, env=env, program=program)))
        return self.started[-1]

    async def stop_all(self) -> None:
        await asyncio.gather(*(asyncio.to_thread(worker.stop) for worker in self.started))


async def wait_polling(client: Client, queue: str, worker: Worker, *, timeout: float) -> None:
    """Wait until ``worker`` polls ``queue`` for activities (Temporal lists it among the pollers)."""

    def alive() -> None:
        assert worker.alive, f"{worker.identity} exited:\n{worker.stderr_tail()}"

    await wait_for_poller(client, queue, worker.identity, timeout=timeout, alive=alive)
