"""Declaring tools (:func:`tool`, or :func:`leased` for an existing function) and serving them from a
:class:`ToolRegistry`: the activity side of agentlease (``docs/writing-tools.md``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentlease._lazy import exports

if TYPE_CHECKING:
    from agentlease.records import ApprovalRule
    from agentlease.tools._context import LeaseContext
    from agentlease.tools._declaration import ToolResult, ToolSpec, tool
    from agentlease.tools._fenced_http import FencedClient, FencingTransport
    from agentlease.tools._registry import ToolRegistry, load_registry
    from agentlease.tools._wrap import leased

_EXPORTS = {
    "ApprovalRule": "agentlease.records",
    "LeaseContext": "agentlease.tools._context",
    "ToolResult": "agentlease.tools._declaration",
    "ToolSpec": "agentlease.tools._declaration",
    "FencedClient": "agentlease.tools._fenced_http",
    "FencingTransport": "agentlease.tools._fenced_http",
    "tool": "agentlease.tools._declaration",
    "ToolRegistry": "agentlease.tools._registry",
    "load_registry": "agentlease.tools._registry",
    "leased": "agentlease.tools._wrap",
}
__all__ = [
    "ApprovalRule",
    "FencedClient",
    "FencingTransport",
    "LeaseContext",
    "ToolRegistry",
    "ToolResult",
    "ToolSpec",
    "leased",
    "load_registry",
    "tool",
]
__getattr__, __dir__ = exports(__name__, _EXPORTS)
