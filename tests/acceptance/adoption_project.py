"""A user's project made of an example's ``after/`` (or ``before/``) directory, run with the installed wheel.

The project is a copy of ``examples/<framework>/after/`` (its own ``activities.py``,
``workflows.py``, ``worker.py`` side by side) in a directory of its own. Every process runs there
with the wheel's virtualenv's Python and an environment that points at nothing in this checkout:
``python worker.py`` as separate OS processes, ``python starter.py`` to ask the agent, and
``agentlease db upgrade`` (the console script) to create the ledger.
"""

from __future__ import annotations

import asyncio
import importlib.util
import shutil
import signal
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from temporalio.client import Client

from tests.acceptance.fleet import Worker
from tests.acceptance.runner import Background, Cli, wait_for_poller
from tests.acceptance.wheel_install import REPO, InstalledWheel, clean_env

EXAMPLES = REPO / "examples"
STRANDS_RUN = importlib.util.find_spec("strands") is not None
"""Whether these tests run in the Strands virtualenv (``.ci/run``): the strands extra needs ``mcp<2``, so its wheel is
installed alone and the Strands project is the one adopted there; any other run adopts the rest."""
FRAMEWORKS = ("strands",) if STRANDS_RUN else ("openai_agents", "pydantic_ai", "langgraph", "google_adk")
WHEEL_EXTRAS = "strands" if STRANDS_RUN else "openai-agents,pydantic-ai,langgraph,google-adk"
"""The extras the adopting projects' wheel is installed with."""

WORKER_START_TIMEOUT_S = 120.0
"""Deadline for a worker process to poll its task queue (imports, ledger check, search attributes,
on 2 shared cores). Default 120s."""

KNOWN_EXIT_CRASH = "Fatal Python error: PyGILState_Release"
"""A short-lived Temporal client process (``python starter.py``) sometimes aborts in the interpreter's
teardown, after its work is done and printed: temporalio/sdk-python#300, the Rust bridge's threads
outliving the interpreter. Such an exit (SIGABRT, this on stderr, the answer on stdout) counts as
done, and so does the same teardown ending in SIGSEGV (seen once in about 30 runs: no stderr, the answer
on stdout); any other non-zero exit fails."""

STARTER_TIMEOUT_S = 180.0
"""Deadline of ``python starter.py``: a whole agent run. Default 180s."""


@dataclass(frozen=True)
class ProjectCli(Cli):
    """:class:`Cli` whose environment is :func:`clean_env`: no ``PYTHONPATH`` to this checkout."""

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        return clean_env({"AGENTLEASE_DATA_DIR": str(self.data_dir), **(extra or {})})


@dataclass
class Project:
    """One user's project: its directory, the wheel it runs on, its settings.

    Attributes:
        directory: the copy of ``after/`` (the working directory of every process).
        wheel: the installed wheel.
        env: the environment of its processes beyond :func:`clean_env`: the Temporal address, the
            task queue, the refund service, the ledger.
    """

    directory: Path
    wheel: InstalledWheel
    env: dict[str, str]
    workers: list[Worker] = field(default_factory=list)

    @classmethod
    def copy(
        cls, framework: str, root: Path, wheel: InstalledWheel, env: dict[str, str], *, variant: str = "after"
    ) -> Project:
        """Copy ``examples/<framework>/<variant>/`` to ``root/project``; its ledger is ``root/ledger.db``."""
        directory = root / "project"
        shutil.copytree(EXAMPLES / framework / variant, directory, ignore=shutil.ignore_patterns("__pycache__"))
        ledger = {"AGENTLEASE_LEDGER_URL": f"sqlite:///{root / 'ledger.db'}", "OPENAI_AGENTS_DISABLE_TRACING": "1"}
        return cls(directory, wheel, {**ledger, **env})

    @property
    def ledger_url(self) -> str:
        return self.env["AGENTLEASE_LEDGER_URL"]

    @property
    def cli(self) -> ProjectCli:
        return ProjectCli(cwd=self.directory, data_dir=self.directory.parent / "data")

    async def run(self, program: Path, *args: str, timeout: float) -> str:
        """Run ``program args`` in the project; its stdout. Fails on a non-zero exit."""
        process = await asyncio.create_subprocess_exec(
            str(program),
            *args,
            cwd=self.directory,
            env=self.cli.env(self.env),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(process.communicate(), timeout)
        except TimeoutError:
            process.kill()
            out, err = await process.communicate()
            ran = f"{program.name} {' '.join(args)}"
            raise AssertionError(f"{ran} still ran after {timeout}s:\n{err.decode()}") from None
        said = err.decode(errors="replace")
        torn_down = (process.returncode == -signal.SIGABRT and KNOWN_EXIT_CRASH in said) or (
            process.returncode == -signal.SIGSEGV and "Traceback" not in said
        )
        if torn_down and out:
            return out.decode()  # it finished its work; only the interpreter's teardown crashed (see above)
        assert process.returncode == 0, f"{program.name} {' '.join(args)} -> {process.returncode}:\n{err.decode()}"
        return out.decode()

    async def upgrade_ledger(self) -> None:
        """``agentlease db upgrade``, once, as the README's first steps say."""
        await self.run(self.wheel.bin("agentlease"), "db", "upgrade", timeout=120)

    async def ask(self, prompt: str) -> str:
        """``python starter.py PROMPT``: the agent's answer."""
        return await self.run(self.wheel.python, "starter.py", prompt, timeout=STARTER_TIMEOUT_S)

    def start_worker(self) -> Worker:
        """``python worker.py`` as a process of its own (its Temporal identity is ``<pid>@<host>``)."""
        command = Background(self.cli, "worker.py", env=self.env, program=self.wheel.python)
        started = Worker(f"{command.process.pid}@{socket.gethostname()}", command)
        self.workers.append(started)
        return started

    async def polling(self, client: Client, worker: Worker) -> Worker:
        """Wait until ``worker`` polls the project's task queue for activities."""

        def alive() -> None:
            if not worker.alive:
                worker.command.stop()  # drains its stderr
                raise RuntimeError(f"worker {worker.identity} exited:\n{worker.stderr_tail(40)}")

        queue = self.env["AGENTLEASE_TASK_QUEUE"]
        await wait_for_poller(client, queue, worker.identity, timeout=WORKER_START_TIMEOUT_S, alive=alive)
        return worker

    def stop_workers(self) -> None:
        for worker in self.workers:
            worker.stop()
