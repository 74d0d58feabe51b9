"""What a declared MCP tool carries: its :class:`ToolPolicy` and the :class:`MCPBinding` the worker reads."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from agentlease.enums import SideEffectClass
from agentlease.mcp._client import MCPServer
from agentlease.records import ApprovalRule
from agentlease.tools._declaration import ToolSpec
from agentlease.tools._probe import Probe

ResourceFunction = Callable[[str, dict[str, Any]], str]
"""``(idempotency key, arguments) -> fenced resource`` of a call; the server must name it the same."""


@dataclass(frozen=True)
class ToolPolicy:
    """How agentlease leases one MCP tool (or, as ``default``, every tool of a server). A field left ``None``
    comes from ``default``, then from the listed tool, then from the agentlease defaults.

    Attributes:
        side_effect, lease_ttl, start_to_close, max_attempts, requires_approval, approval_ttl, probe,
            settle_window: as for
            :func:`agentlease.tool` (``lease_ttl`` required here or in ``default``); ``requires_approval`` may be
            an :class:`~agentlease.records.ApprovalRule` over an argument.
        action_key: as for :func:`agentlease.tool`, a template over argument names (``"contact:{email}"``); the
            tool's own (refused in ``default``). A listed property it names must be required or have a
            default in the schema.
        args / input_schema / description: the arguments' pydantic model, or their JSON schema; what the model
            reads. Default the listed ones.
        name: the agentlease tool name (activity type). Default ``<prefix><mcp tool name>``.
        resource: a :data:`ResourceFunction`. Default ``mcp/<tool>/<key>``.
        renew_every: how often the lease is renewed while the server works. Default a third of the TTL.
        readback: read a guarded server's stored result back (``agentlease_was_applied``) before
            settling and before a retry writes again. Default: when the server advertises the guard.
    """

    side_effect: SideEffectClass | str | None = None
    lease_ttl: timedelta | None = None
    start_to_close: timedelta | None = None
    max_attempts: int | None = None
    requires_approval: bool | ApprovalRule | None = None
    args: type[BaseModel] | None = None
    input_schema: Mapping[str, Any] | None = None
    description: str | None = None
    name: str | None = None
    resource: ResourceFunction | None = None
    renew_every: timedelta | None = None
    readback: bool | None = None
    action_key: str | None = None
    approval_ttl: timedelta | None = None
    probe: Probe | None = None
    settle_window: timedelta | None = None

    def over(self, default: ToolPolicy) -> ToolPolicy:
        """This policy with its unset fields taken from ``default``."""
        taken = {
            name: getattr(default, name)
            for name in self.__dataclass_fields__
            if getattr(self, name) is None and name not in _OWN
        }
        return replace(self, **taken)


_OWN = ("name", "args", "input_schema", "description", "action_key")
"""The fields of a tool's own policy that ``default`` never gives (they name one tool or its arguments)."""


@dataclass(frozen=True)
class MCPBinding:
    """What the worker needs of one declared MCP tool (kept on the tool's ``fn``)."""

    server: MCPServer
    tool: str
    policy: ToolPolicy
    input_schema: dict[str, Any]
    guessed: bool


BINDING_ATTRIBUTE = "__agentlease_mcp__"
"""The attribute of a declared MCP tool's ``fn`` holding its :class:`MCPBinding`."""


def binding_of(spec: ToolSpec) -> MCPBinding | None:
    """The MCP binding of a tool declared by :func:`mcp_tools`, ``None`` for any other tool."""
    found = getattr(spec.fn, BINDING_ATTRIBUTE, None)
    return found if isinstance(found, MCPBinding) else None


def compare(binding: MCPBinding, listed: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """What is wrong with ``binding`` against the server's live list (missing tool, argument); empty: it fits."""
    found = listed.get(binding.tool)
    if found is None:
        return [
            f"{binding.server.name} lists no tool {binding.tool!r} (it lists {', '.join(sorted(listed)) or 'none'})"
        ]
    required = set((found.get("inputSchema") or {}).get("required") or [])
    declared = set((binding.input_schema.get("properties") or {}).keys())
    missing = sorted(required - declared)
    if missing and binding.input_schema.get("additionalProperties") is not True:
        return [f"{binding.server.name}/{binding.tool}: the server requires {missing}, which the declared schema lacks"]
    return []


__all__ = ["BINDING_ATTRIBUTE", "MCPBinding", "ResourceFunction", "ToolPolicy", "binding_of", "compare"]
