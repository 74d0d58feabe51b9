"""Where an MCP server is and how to reach it: :class:`MCPServer`, and the sessions opened to it (one per
attempt of a leased call, closed with it: nothing of a session outlives its attempt).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from agentlease.errors import ConfigurationError


@dataclass(frozen=True)
class MCPServer:
    """An MCP server agentlease calls tools of: a command it starts (stdio) or a URL (streamable HTTP). Make one
    with :meth:`stdio` or :meth:`http`; nothing connects until a tool is called (workflow code may build one).
    ``name`` is the server's name in tool names, receipts and messages (``crm``).
    """

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] | None = field(default=None, hash=False)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] | None = field(default=None, hash=False, repr=False)

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "_").replace(".", "_").isidentifier():
            raise ConfigurationError(f"MCP server name {self.name!r}: use letters, digits, '_', '-' or '.'")
        if self.command == "" or self.url == "":
            raise ConfigurationError(f"MCP server {self.name!r}: an empty command or url")
        if (self.command is None) == (self.url is None):
            raise ConfigurationError(
                f"MCP server {self.name!r}: give a command (MCPServer.stdio) or a url (MCPServer.http), not both"
            )

    @classmethod
    def stdio(
        cls,
        name: str,
        command: str,
        args: tuple[str, ...] | list[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> MCPServer:
        """A server the worker starts as a subprocess and talks to over stdio: ``command`` (``"python"`` is this
        interpreter) with ``args``, ``env`` merged over the SDK's safe default environment, in ``cwd``."""
        return cls(name, command=command, args=tuple(args), env=env, cwd=cwd)

    @classmethod
    def http(cls, name: str, url: str, *, headers: Mapping[str, str] | None = None) -> MCPServer:
        """A server reached over streamable HTTP at ``url``, ``headers`` sent with every request (credentials: the
        server scopes keys by them)."""
        return cls(name, url=url, headers=headers)

    @property
    def transport(self) -> str:
        """``stdio`` or ``streamable-http``."""
        return "stdio" if self.command is not None else "streamable-http"

    def _stdio(self) -> StdioServerParameters:
        assert self.command is not None
        command = sys.executable if self.command == "python" else self.command
        env = dict(self.env) if self.env else None
        return StdioServerParameters(command=command, args=list(self.args), env=env, cwd=self.cwd)


@asynccontextmanager
async def session(server: MCPServer) -> AsyncIterator[Client]:
    """A connected client of ``server`` (the SDK's ``mcp.Client``), closed on exit."""
    if server.url is None:
        async with Client(server._stdio(), cache=None) as client:
            yield client
        return
    http = create_mcp_http_client(headers=dict(server.headers or {}))  # closed here: the SDK leaves a given one open
    async with http, Client(streamable_http_client(server.url, http_client=http), cache=None) as client:
        yield client


async def list_tools(client: Client) -> dict[str, dict[str, Any]]:
    """Every tool the connected server lists (``tools/list``, all pages), by name, as JSON."""
    tools: dict[str, dict[str, Any]] = {}
    cursor: str | None = None
    while True:
        page = await client.list_tools(cursor=cursor, cache_mode="bypass")
        tools.update((tool.name, tool.model_dump(mode="json", by_alias=True, exclude_none=True)) for tool in page.tools)
        cursor = page.next_cursor
        if cursor is None:
            return tools


async def list_server_tools(server: MCPServer) -> list[dict[str, Any]]:
    """The server's ``tools/list`` answer as JSON objects (name, description, ``inputSchema``, ``annotations``):
    what :func:`~agentlease.mcp.mcp_tools` takes as ``listed=`` so the declaration needs no I/O.

    Raises:
        OSError, mcp.MCPError, ...: the server could not be reached.
    """
    async with session(server) as client:
        return list((await list_tools(client)).values())


__all__ = ["MCPServer", "list_server_tools", "list_tools", "session"]
