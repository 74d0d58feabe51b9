"""Crash points of the edge matrix (:mod:`tests.acceptance.edge_matrix`), driven by files in one directory.

Every process of a matrix run (the worker's tools, the HTTP service, the MCP server) finds the directory in
``EDGE_CONTROL_DIR``. A call is named by its target (the charge's target, the contact's email: one per
cell); for each target the driver may write ``<name>.point``, the crash point where the first call that
reaches it holds. That call creates ``<name>.held`` (exclusively: any later call for the target runs
through), writes its process id to ``<name>.pid`` and waits until ``<name>.resume`` exists, its process is
killed or stopped, or its client is gone.
What happened at the downstream is appended to ``log.jsonl`` (one JSON object a line, ``O_APPEND``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

CONTROL_ENV = "EDGE_CONTROL_DIR"
POLL_S = 0.1
"""How often a held call looks for its resume file."""


def _name(target: str) -> str:
    return hashlib.sha256(target.encode()).hexdigest()[:20]


def control_dir() -> Path | None:
    value = os.environ.get(CONTROL_ENV)
    return Path(value) if value else None


def plan(directory: Path, target: str, point: str) -> None:
    """Hold the first call with ``target`` that reaches ``point``."""
    (directory / f"{_name(target)}.point").write_text(point)


def is_held(directory: Path, target: str) -> bool:
    return (directory / f"{_name(target)}.held").exists()


def held_pid(directory: Path, target: str) -> int | None:
    found = directory / f"{_name(target)}.pid"
    return int(found.read_text()) if found.exists() and found.read_text() else None


def resume(directory: Path, target: str) -> None:
    (directory / f"{_name(target)}.resume").touch()


def claims(point: str, target: str) -> bool:
    """Whether this call holds at ``point``: planned there for ``target``, and no call held there before."""
    directory = control_dir()
    if directory is None:
        return False
    planned = directory / f"{_name(target)}.point"
    if not planned.exists() or planned.read_text().strip() != point:
        return False
    try:
        os.close(os.open(directory / f"{_name(target)}.held", os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    (directory / f"{_name(target)}.pid").write_text(str(os.getpid()))
    return True


async def hold(target: str, keep_alive: Callable[[], Awaitable[object]] | None = None, every_s: float = 0.5) -> None:
    """Wait until the driver resumes ``target``; ``keep_alive`` runs every ``every_s`` meanwhile (a lease renewal)."""
    directory = control_dir()
    assert directory is not None
    resumed = directory / f"{_name(target)}.resume"
    next_alive = time.monotonic()
    while not resumed.exists():
        if keep_alive is not None and time.monotonic() >= next_alive:
            next_alive = time.monotonic() + every_s
            try:
                await keep_alive()
            except Exception as exc:  # a renewal refused after a pause: the call carries on, as a resumed process
                log("keep_alive_refused", target, error=type(exc).__name__)
                keep_alive = None
        await asyncio.sleep(POLL_S)


async def at(point: str, target: str, keep_alive: Callable[[], Awaitable[object]] | None = None) -> None:
    """Hold here if ``point`` is planned for ``target`` and nothing held there before."""
    if claims(point, target):
        await hold(target, keep_alive)


def log(event: str, target: str, **facts: Any) -> None:
    """Append what happened to the call with ``target`` to ``log.jsonl``."""
    directory = control_dir()
    if directory is None:
        return
    line = json.dumps({"t": time.time(), "event": event, "target": target, "pid": os.getpid(), **facts})
    fd = os.open(directory / "log.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def logged(directory: Path, target: str) -> list[dict[str, Any]]:
    """What ``log.jsonl`` holds of ``target``, oldest first."""
    path = directory / "log.jsonl"
    if not path.exists():
        return []
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [entry for entry in entries if entry["target"] == target]
