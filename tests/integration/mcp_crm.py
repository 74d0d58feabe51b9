"""The example's CRM MCP server (``examples/mcp/crm_server.py``) with what the MCP tests add, as a process.

``python -m tests.integration.mcp_crm [--http PORT]`` (the repository as working directory). Beside
the example's guarded ``create_contact`` and ``find_contact`` it serves ``import_contacts``, a long
tool that reports progress every ``step_s`` seconds. Environment:

- ``CRM_DATABASE_URL``: the CRM's database (contacts, idempotency keys, fences).
- ``CRM_HOLD=before|after`` with ``CRM_HOLD_DIR``: a ``create_contact`` call carrying fencing token 1
  (the first attempt's) is held, outside the guard, before the guard sees it (``before``: the call is
  late) or after the guard stored its result (``after``: the answer is late). The server touches
  ``<dir>/held`` and waits for ``<dir>/resume``. A refusal of the guard is written to
  ``<dir>/refused.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import ToolAnnotations
from sqlalchemy import func, select

from agentlease.databases import create_async_database_engine
from agentlease.mcp import FENCING_TOKEN_META
from examples.mcp.crm_server import build_server, contacts
from tests.eventually import assert_eventually

REPO = Path(__file__).resolve().parents[2]
HOLD_POLL_S = 0.1
"""How often a held call looks for the resume file."""


def _hold(directory: Path, when: str) -> Any:
    """The outermost middleware: holds a generation-1 ``create_contact`` (module docstring)."""

    async def middleware(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        params = ctx.params or {}
        first = str((params.get("_meta") or {}).get(FENCING_TOKEN_META, "")).partition(".")[0] == "1"
        if ctx.method != "tools/call" or params.get("name") != "create_contact" or not first:
            return await call_next(ctx)
        if when == "before":
            await _wait(directory)
        try:
            result = await call_next(ctx)
        except MCPError as exc:
            (directory / "refused.json").write_text(json.dumps(exc.data))
            raise
        if when == "after":
            await _wait(directory)
        return result

    return middleware


async def _wait(directory: Path) -> None:
    (directory / "held").touch()
    while not (directory / "resume").exists():  # noqa: ASYNC110 - the test, another process, writes it
        await anyio.sleep(HOLD_POLL_S)


def build_test_server(database_url: str) -> MCPServer[Any]:
    server = build_server(database_url)

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, idempotent_hint=True))
    async def import_contacts(batch: str, steps: int, step_s: float, ctx: Context) -> dict[str, Any]:
        """Import a batch of contacts, reporting progress after each step."""
        for step in range(steps):
            await anyio.sleep(step_s)
            await ctx.report_progress(step + 1, steps, f"imported part {step + 1} of {batch}")
        return {"batch": batch, "steps": steps}

    hold = os.environ.get("CRM_HOLD")
    if hold:
        server.middleware.append(_hold(Path(os.environ["CRM_HOLD_DIR"]), hold))
    return server


def server_env(database_url: str, *, hold: str | None = None, hold_dir: Path | None = None) -> dict[str, str]:
    """The environment of a test CRM server process."""
    env = {"CRM_DATABASE_URL": database_url}
    if hold is not None:
        assert hold_dir is not None
        env.update(CRM_HOLD=hold, CRM_HOLD_DIR=str(hold_dir))
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@asynccontextmanager
async def running_http_crm(env: dict[str, str], *, timeout: float = 60, log: Path | None = None) -> AsyncIterator[str]:
    """A test CRM server process over streamable HTTP (its stderr to ``log``); yields its URL, killed afterwards."""
    port = free_port()
    errors = open(log, "w") if log is not None else subprocess.DEVNULL  # noqa: SIM115 - closed below
    process = subprocess.Popen(  # noqa: ASYNC220 - starts a server that outlives this call
        [sys.executable, "-m", "tests.integration.mcp_crm", "--http", str(port)],
        cwd=REPO,
        env={**os.environ, **env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=errors,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:

        async def listening() -> None:
            assert process.poll() is None, f"the CRM server exited with {process.returncode}"
            async with httpx.AsyncClient() as http:
                try:
                    await http.get(url, timeout=2)
                except httpx.TransportError as exc:
                    raise AssertionError(f"not listening yet: {exc}") from None

        await assert_eventually(listening, timeout=timeout, interval=0.2, message="the CRM server listens")
        yield url
    finally:
        process.kill()
        process.wait()
        if log is not None:
            errors.close()  # type: ignore[union-attr]


async def contacts_of(database_url: str, email: str) -> list[dict[str, Any]]:
    """The CRM's contacts with ``email`` (read from its database directly)."""
    engine = create_async_database_engine(database_url)
    try:
        async with engine.connect() as conn:
            rows = (await conn.execute(select(contacts).where(contacts.c.email == email))).mappings().all()
        return [dict(row) for row in rows]
    finally:
        await engine.dispose()


async def count_contacts(database_url: str) -> int:
    engine = create_async_database_engine(database_url)
    try:
        async with engine.connect() as conn:
            return int((await conn.execute(select(func.count()).select_from(contacts))).scalar_one())
    finally:
        await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int)
    options = parser.parse_args()
    server = build_test_server(os.environ["CRM_DATABASE_URL"])
    if options.http is None:
        server.run()
    else:
        server.run("streamable-http", host="127.0.0.1", port=options.http)


if __name__ == "__main__":
    main()
