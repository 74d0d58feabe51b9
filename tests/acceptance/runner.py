"""Running the ``agentlease`` console script as a user does: a subprocess, its exit code and output."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

from tests.eventually import assert_eventually

AGENTLEASE = Path(sys.executable).parent / "agentlease"
"""The console script installed beside this interpreter."""

CLI_TIMEOUT_S = 60.0
"""Deadline of one CLI run that needs no server. Default 60s."""


def python_path(first: Path) -> str:
    """``PYTHONPATH`` with ``first`` before the caller's own (a test's tool modules, then the checkout)."""
    return os.pathsep.join(filter(None, [str(first), os.environ.get("PYTHONPATH")]))


WriteFile = Callable[[str, str], Path]
"""``write_file(name, text)``: writes a file into the working directory and returns its path."""


@dataclass(frozen=True)
class CliResult:
    """How one run of the console script ended.

    Attributes:
        args: the arguments after ``agentlease``.
        returncode: the exit code.
        stdout: everything printed on stdout.
        stderr: everything printed on stderr.
        elapsed_s: wall time of the run, in seconds.
    """

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    elapsed_s: float

    def __str__(self) -> str:
        return (
            f"agentlease {' '.join(self.args)} -> exit {self.returncode} after {self.elapsed_s:.1f}s\n"
            f"--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}"
        )


@dataclass(frozen=True)
class Cli:
    """Runs ``agentlease`` in ``cwd`` with a clean ``AGENTLEASE_*`` environment.

    Attributes:
        cwd: the working directory of every run (empty at the start of the test).
        data_dir: the value of ``AGENTLEASE_DATA_DIR``.
    """

    cwd: Path
    data_dir: Path

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The caller's environment without ``AGENTLEASE_*`` (and terminal size), plus ``extra``."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLEASE_") and k not in ("COLUMNS", "LINES")}
        env["AGENTLEASE_DATA_DIR"] = str(self.data_dir)
        env.update(extra or {})
        return env

    def __call__(self, *args: str, env: Mapping[str, str] | None = None, timeout: float = CLI_TIMEOUT_S) -> CliResult:
        started = time.monotonic()
        done = subprocess.run(
            [str(AGENTLEASE), *args],
            check=False,
            cwd=self.cwd,
            env=self.env(env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return CliResult(tuple(args), done.returncode, done.stdout, done.stderr, time.monotonic() - started)


class Background:
    """A long-running ``agentlease`` command (``dev``, ``worker``) whose stderr is read line by line.

    Args:
        cli: where and with which environment it runs.
        args: the arguments after ``agentlease``.
        env: extra environment variables.
        program: what runs; default the ``agentlease`` console script.
        stdout: read its stdout too (see :meth:`wait_for_output`); default discarded.
    """

    def __init__(
        self,
        cli: Cli,
        *args: str,
        env: Mapping[str, str] | None = None,
        program: Path = AGENTLEASE,
        stdout: bool = False,
    ) -> None:
        self.args = args
        self.cwd = cli.cwd
        """The directory it runs in."""
        self.process = subprocess.Popen(
            [str(program), *args],
            cwd=cli.cwd,
            env=cli.env(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if stdout else subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own process group: see stop(SIGKILL)
        )
        self.stderr: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._output: queue.Queue[str | None] = queue.Queue()
        if stdout:
            threading.Thread(target=self._read_output, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self._lines.put(line)
        self._lines.put(None)

    def _read_output(self) -> None:
        assert self.process.stdout is not None
        with self.process.stdout:
            for line in self.process.stdout:
                self._output.put(line)
        self._output.put(None)

    def wait_for_output_line(self, pattern: str, *, timeout: float) -> re.Match[str]:
        """Read stdout (started with ``stdout=True``) until a line matches ``pattern``; the match
        spans the whole line."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._output.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no output line matching {pattern!r} within {timeout}s") from None
            if line is None:
                raise AssertionError(f"agentlease {' '.join(self.args)} ended:\n{''.join(self.stderr)}")
            if re.search(pattern, line):
                return re.fullmatch(r".*", line.rstrip("\n"))  # type: ignore[return-value]

    def wait_for_line(self, pattern: str, *, timeout: float) -> re.Match[str]:
        """Read stderr until a line matches ``pattern``; fail if the process ends or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"no line matching {pattern!r} within {timeout}s:\n{''.join(self.stderr)}"
                ) from None
            if line is None:
                raise AssertionError(f"agentlease {' '.join(self.args)} ended:\n{''.join(self.stderr)}")
            self.stderr.append(line)
            if match := re.search(pattern, line):
                return match

    def stop(self, sig: signal.Signals = signal.SIGINT, *, timeout: float = 60.0) -> int:
        """Send ``sig``, wait for the exit (killing it after ``timeout``), drain stderr; returns the exit code.

        ``SIGKILL`` also kills the rest of the command's process group."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            code = self.process.wait(timeout=timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            if sig is signal.SIGKILL:
                # A killed command cannot stop what it started (the dev server): end its whole group,
                # or an orphan keeps the stderr pipe open and the reader never finishes.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
        self._reader.join(timeout=timeout)
        assert self.process.stderr is not None
        self.process.stderr.close()
        while not self._lines.empty():
            if (line := self._lines.get_nowait()) is not None:
                self.stderr.append(line)
        return code


def processes_mentioning(text: str) -> list[tuple[int, str]]:
    """Live processes whose command line contains ``text``, read from ``/proc``: ``(pid, cmdline)``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if text in cmdline:
            found.append((int(entry.name), cmdline))
    return found


async def wait_for_poller(
    client: Client, queue: str, identity: str, *, timeout: float, alive: Callable[[], None] | None = None
) -> None:
    """Wait until a worker of ``identity`` polls ``queue`` for activities (Temporal lists its poller).

    Args:
        alive: called on every attempt; raises when the worker process has already ended.
    """

    async def polling() -> None:
        if alive is not None:
            alive()
        described = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=queue),
                task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
            )
        )
        assert identity in {poller.identity for poller in described.pollers}

    await assert_eventually(polling, timeout=timeout, interval=0.2, message=f"{identity} polls {queue}")
