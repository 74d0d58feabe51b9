"""The example's CRM MCP server (``examples/mcp/crm_server.py``) with what the MCP tests add, as a process.

``python -m tests.integration.mcp_crm [--http PORT]`` (the repository as working directory). Beside
the example's guarded ``create_contact`` and ``find_contact`` it serves ``import_contacts``, a long
tool that reports progress every ``step_s`` seconds. Environment:

- ``CRM_DATABASE_URL``: the CRM's database (contacts, idempotency keys, fences); ``EDGE_LOCK_TIMEOUT_S``:
  the key store's lock timeout (default 60).
- ``EDGE_CONTROL_DIR``: crash points of ``create_contact`` per target (the contact's email,
  :mod:`tests.acceptance.edge_holds`): ``before`` (at the server, before the guard saw it), ``inside`` (the
  tool holds the key, before its transaction: its first progress report), ``committed`` (the contact and
  its key committed, before the tool answers: its second progress report), ``answered`` (the guard stored
  the answer, which is then withheld), ``after`` (the client's readback of the answered call). Every answer
  is logged (``mcp_answer``: the tool, the request's fencing token, the refusal or error).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import httpx
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, ToolAnnotations
from sqlalchemy import func, select

from agentlease.ledger.engine import create_async_database_engine
from agentlease.mcp import FENCING_TOKEN_META, IDEMPOTENCY_KEY_META, READBACK_TOOL, current_call
from examples.mcp.crm_server import build_server, contacts
from tests.acceptance import edge_holds
from tests.eventually import assert_eventually

REPO = Path(__file__).resolve().parents[2]

_targets: dict[str, str] = {}
"""The target (email) of each idempotency key this process saw, for the tool's and the readback's crash points."""


def _answer_error(result: Any) -> str | None:
    if isinstance(result, CallToolResult) and result.is_error:
        return " ".join(getattr(block, "text", "") for block in result.content)[:300] or "error"
    return None


async def _crash_points(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
    """The outermost middleware: the ``before``, ``answered`` and ``after`` crash points, and the answers' log."""
    params = ctx.params or {}
    name = params.get("name")
    if ctx.method != "tools/call" or name not in ("create_contact", READBACK_TOOL):
        return await call_next(ctx)
    meta = params.get("_meta") or {}
    key = str(meta.get(IDEMPOTENCY_KEY_META, ""))
    if name == "create_contact":
        target = _targets[key] = str((params.get("arguments") or {}).get("email", ""))
    else:
        target = _targets.get(key, "")
    token = meta.get(FENCING_TOKEN_META)
    await edge_holds.at("after" if name == READBACK_TOOL else "before", target)
    try:
        result = await call_next(ctx)
    except MCPError as exc:
        data = exc.data if isinstance(exc.data, dict) else {}
        edge_holds.log("mcp_answer", target, tool=name, token=token, error=data.get("error", exc.message), data=data)
        raise
    except BaseException as exc:  # the client went away: the guard ran the call to its end all the same
        edge_holds.log("mcp_answer", target, tool=name, token=token, error=f"not answered: {type(exc).__name__}")
        raise
    edge_holds.log("mcp_answer", target, tool=name, token=token, error=_answer_error(result))
    if name == "create_contact":
        await edge_holds.at("answered", target)
    return result


_report_progress = Context.report_progress


async def _reported(self: Context, progress: float, total: float | None = None, message: str | None = None) -> None:
    """``Context.report_progress`` with the tool's crash points: its first report is before its transaction
    (``inside``), its second after the commit (``committed``)."""
    call = current_call()
    target = _targets.get(call.idempotency_key or "", "") if call is not None else ""
    await edge_holds.at("inside" if progress == 0 else "committed", target)
    await _report_progress(self, progress, total, message)


NAMED_CALLERS_ENV = "CRM_NAMED_CALLERS"
"""Set to ``1``: the test CRM's guard refuses HTTP callers without credentials (``LeaseGuard(anonymous=False)``)."""


def build_test_server(database_url: str) -> MCPServer[Any]:
    lock_timeout = timedelta(seconds=float(os.environ.get("EDGE_LOCK_TIMEOUT_S", "60")))
    anonymous = os.environ.get(NAMED_CALLERS_ENV) != "1"
    server = build_server(database_url, lock_timeout=lock_timeout, anonymous=anonymous)

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, idempotent_hint=True))
    async def import_contacts(batch: str, steps: int, step_s: float, ctx: Context) -> dict[str, Any]:
        """Import a batch of contacts, reporting progress after each step."""
        for step in range(steps):
            await anyio.sleep(step_s)
            await ctx.report_progress(step + 1, steps, f"imported part {step + 1} of {batch}")
        return {"batch": batch, "steps": steps}

    if edge_holds.control_dir() is not None:
        server.middleware.append(_crash_points)
        Context.report_progress = _reported  # type: ignore[method-assign,assignment]
    return server


def server_env(
    database_url: str,
    *,
    control_dir: Path | None = None,
    lock_timeout_s: float | None = None,
    named_callers: bool = False,
) -> dict[str, str]:
    """The environment of a test CRM server process."""
    env = {"CRM_DATABASE_URL": database_url}
    if named_callers:
        env[NAMED_CALLERS_ENV] = "1"
    if control_dir is not None:
        env[edge_holds.CONTROL_ENV] = str(control_dir)
    if lock_timeout_s is not None:
        env["EDGE_LOCK_TIMEOUT_S"] = str(lock_timeout_s)
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
