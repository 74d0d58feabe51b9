"""``LeaseGuard`` as the middleware of a low-level ``mcp.server.Server`` over stdio, driven with raw JSON-RPC lines as
a hostile client would send them: every ``tools/call`` is read as the server reads it, so no extra field lets a call
past the guard (``docs/mcp.md``, "Server side")."""

from __future__ import annotations

import json
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

SERVER = """
import sys

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.stdio import stdio_server

from agentlease.idempotency import IdempotencyStore
from agentlease.mcp import LeaseGuard

store = IdempotencyStore.from_url(f"sqlite:///{sys.argv[1]}")


async def call_tool(ctx, params):
    print("EFFECT", params.arguments["text"], file=sys.stderr, flush=True)
    return types.CallToolResult(content=[types.TextContent(type="text", text="written")])


async def list_tools(ctx, params):
    return types.ListToolsResult(tools=[types.Tool(name="write", input_schema={"type": "object"})])


server = Server("low-level", on_call_tool=call_tool, on_list_tools=list_tools)
server.middleware.append(LeaseGuard(store, require_fencing_token=True))


async def main():
    await store.create_tables()
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


anyio.run(main)
"""
ANSWER_TIMEOUT_S = 60.0
"""How long a request may take to be answered (the server's first answer waits for its imports, on 2 cores)."""


class Wire:
    """A low-level server process, spoken to in JSON-RPC lines."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        self.ids = 0
        self.log: str | None = None

    def stop(self) -> str:
        """Stop the server (once); what it wrote to stderr."""
        if self.log is None:
            self.process.kill()
            self.log = self.process.communicate(timeout=30)[1].decode()
        return self.log

    def send(self, method: str, params: dict[str, Any] | None = None, *, notify: bool = False) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, **({"params": params} if params else {})}
        if not notify:
            self.ids += 1
            message["id"] = self.ids
        assert self.process.stdin is not None
        self.process.stdin.write((json.dumps(message) + "\n").encode())
        self.process.stdin.flush()

    def answer(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], ANSWER_TIMEOUT_S)
        assert ready, f"no answer within {ANSWER_TIMEOUT_S:g}s"
        answer: dict[str, Any] = json.loads(self.process.stdout.readline())
        return answer

    def call(self, params: dict[str, Any]) -> dict[str, Any]:
        self.send("tools/call", params)
        return self.answer()


@pytest.fixture
def wire(tmp_path: Path) -> Iterator[Wire]:
    script = tmp_path / "low_level_server.py"
    script.write_text(SERVER)
    process = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "keys.db")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO_ROOT,
    )
    wire = Wire(process)
    try:
        wire.send(
            "initialize",
            {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
        )
        assert "result" in wire.answer()
        wire.send("notifications/initialized", notify=True)
        yield wire
    finally:
        wire.stop()


def meta(key: str, token: str) -> dict[str, str]:
    return {"io.agentlease/idempotency-key": key, "io.agentlease/fencing-token": token, "io.agentlease/resource": "R"}


def test_a_field_named_as_python_names_it_does_not_take_a_call_past_the_guard(wire: Wire) -> None:
    """``"meta"``, ``"request_state"``, ``"input_responses"`` (the model's Python names, which the server ignores):
    a call without a key is still refused ``missing_idempotency_key``, a superseded token still
    ``stale_fencing_token``, and a repeated key still replays; the tool wrote once (G2, G6)."""
    first = wire.call({"name": "write", "arguments": {"text": "generation 5"}, "_meta": meta("k5", "5")})
    assert not first["result"].get("isError"), first
    refused = [
        wire.call({"name": "write", "arguments": {"text": "no key"}, field: 5})
        for field in ("meta", "request_state", "input_responses")
    ]
    stale = wire.call(
        {"name": "write", "arguments": {"text": "generation 1"}, "request_state": 5, "_meta": meta("k1", "1")}
    )
    again = wire.call(
        {"name": "write", "arguments": {"text": "generation 5"}, "input_responses": 5, "_meta": meta("k5", "5")}
    )
    effects = [line for line in wire.stop().splitlines() if line.startswith("EFFECT")]
    assert [answer["error"]["data"]["error"] for answer in refused] == ["missing_idempotency_key"] * 3, refused
    assert stale["error"]["data"]["error"] == "stale_fencing_token", stale
    assert again["result"]["_meta"]["io.agentlease/replayed"] is True, again
    assert effects == ["EFFECT generation 5"]


def test_tools_call_params_the_server_cannot_read_are_refused_in_one_line(wire: Wire) -> None:
    """A ``name`` that is not a string: invalid params (-32602) in one line, the tool never runs."""
    answer = wire.call({"name": 5, "arguments": {"text": "malformed"}})
    assert answer["error"]["code"] == -32602, answer
    assert "\n" not in answer["error"]["message"]
