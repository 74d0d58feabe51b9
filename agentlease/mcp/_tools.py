"""Declaring an MCP server's tools as agentlease tools: :func:`mcp_tools`, static (no I/O: the same tools on
every replay), and :func:`check_tools` against the live server (``docs/mcp.md``).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from agentlease.enums import SideEffectClass
from agentlease.errors import ConfigurationError
from agentlease.mcp._client import MCPServer, list_tools, session
from agentlease.mcp._convention import READBACK_TOOL
from agentlease.mcp._listing import Listed, args_model, optional_key_fields, read_listed, recorded_path
from agentlease.mcp._policy import MCPBinding, ToolPolicy, binding_of, compare
from agentlease.records import DEFAULT_MAX_ATTEMPTS, DEFAULT_START_TO_CLOSE, action_key_fields
from agentlease.tools._declaration import LeaseOptions, ToolSpec, side_effect_class

logger = logging.getLogger("agentlease.mcp")


def guess_side_effect(listed: Mapping[str, Any] | None, *, guarded: bool = False) -> SideEffectClass:
    """The side-effect class a tool's ``tools/list`` annotations suggest (``guarded``: the server guards it); a
    guess, never proof."""
    hints = (listed or {}).get("annotations") or {}
    if hints.get("readOnlyHint") is True:
        return SideEffectClass.READ_ONLY
    if hints.get("idempotentHint") is True:
        return SideEffectClass.IDEMPOTENT
    if guarded:
        return SideEffectClass.FENCED
    return SideEffectClass.UNSAFE


def mcp_tools(
    server: MCPServer,
    *,
    default: ToolPolicy = ToolPolicy(),  # noqa: B008 - a frozen dataclass
    tools: Mapping[str, ToolPolicy] | None = None,
    listed: Listed | None = None,
    guarded: Sequence[str] | None = None,
    prefix: str = "",
) -> list[ToolSpec]:
    """Declare an MCP server's tools as leased agentlease tools, which go where any tool goes (``docs/mcp.md``).
    No I/O.

    Args:
        default: the policy of every tool, under each tool's own.
        tools: per tool name at the server, its policy. With ``listed`` given, every listed tool is declared
            (those not named here with ``default``); otherwise exactly the named ones, in that order (every
            tool of the recorded listing when none is named).
        listed: the server's ``tools/list`` answer, recorded (a list of tool objects, or the path of a
            JSON file holding it or ``{"tools": [...]}``), from :func:`~agentlease.mcp.list_server_tools`.
            Default: ``<server name>.tools.json`` beside the module calling ``mcp_tools``, when it exists
            (written by :func:`~agentlease.mcp.record_server_tools`); it gives each tool's argument schema,
            description and side-effect guess unless the policy declares them.
        guarded: the tools the server guards (``io.agentlease/lease``), for the side-effect guess.
        prefix: put before each tool's name to make the agentlease tool name (``crm_``).

    Raises:
        ConfigurationError: a tool without a side-effect class (declared, or guessed from ``listed``), lease
            TTL or argument schema; a bad ``action_key``, ``requires_approval``, ``approval_ttl`` or ``probe``
            (the checks of :func:`agentlease.tool`), or an ``action_key`` in ``default``; two tools with one
            name; unreadable ``listed``.
        MissingHeartbeatTimeoutError: a lease TTL that is not positive.
    """
    from agentlease.mcp._call import leased_mcp_call, unleased_mcp_call

    if default.action_key is not None:
        raise ConfigurationError(
            f"MCP server {server.name!r}: action_key names one tool's arguments; set it in tools=, not default="
        )
    policies = dict(tools or {})
    every_listed = listed is not None or not policies
    if listed is None:
        listed = _recorded(server, sys._getframe(1).f_globals.get("__file__"))
    known = read_listed(listed)
    # A recording of a guarded server lists the guard's readback tool: agentlease's own, not the model's.
    unnamed = [name for name in known if name not in policies and name != READBACK_TOOL]
    names = list(policies) + (unnamed if every_listed else [])
    guarded_names = set(guarded or ())
    specs: list[ToolSpec] = []
    for tool in names:
        own = policies.get(tool, ToolPolicy())
        policy = own.over(default)
        listed_tool = known.get(tool)
        if policy.side_effect is None and listed_tool is None:
            raise ConfigurationError(
                f"MCP tool {tool!r} of {server.name!r} has no side_effect: declare it in tools= or default=, "
                "or give listed= so it is guessed from the tool's annotations"
            )
        guessed = policy.side_effect is None
        side_effect = guess_side_effect(listed_tool, guarded=tool in guarded_names) if guessed else policy.side_effect
        assert side_effect is not None
        if policy.lease_ttl is None:
            raise ConfigurationError(
                f"MCP tool {tool!r} of {server.name!r} has no lease_ttl: set it in tools= or default="
            )
        if policy.renew_every is not None and not timedelta(0) < policy.renew_every < policy.lease_ttl:
            raise ConfigurationError(
                f"MCP tool {tool!r} of {server.name!r}: renew_every must be above 0 and under lease_ttl "
                f"({policy.lease_ttl}), not {policy.renew_every}: a lease renewed less often than its TTL lapses"
            )
        schema: Mapping[str, Any] | None
        if own.args is not None:
            model = own.args
            schema = model.model_json_schema()
        else:
            schema = own.input_schema or (listed_tool or {}).get("inputSchema")
            if schema is None:
                raise ConfigurationError(
                    f"MCP tool {tool!r} of {server.name!r} has no argument schema: give args= (a pydantic model), "
                    "input_schema=, or listed= (the server's tools/list answer, recorded by record_server_tools)"
                )
            model = args_model(tool, schema)
        name = own.name or f"{prefix}{tool}"
        options = LeaseOptions(
            side_effect_class(side_effect),
            policy.lease_ttl,
            policy.start_to_close or DEFAULT_START_TO_CLOSE,
            policy.max_attempts or DEFAULT_MAX_ATTEMPTS,
            policy.requires_approval,
            action_key=policy.action_key,
            approval_ttl=policy.approval_ttl,
            probe=policy.probe,
            settle_window=policy.settle_window,
        )
        options.check(name)
        assert policy.action_key is None or isinstance(policy.action_key, str)  # checked above
        optional = optional_key_fields(model, action_key_fields(policy.action_key) if policy.action_key else [])
        if optional:
            raise ConfigurationError(
                f"tool {name!r}: action_key {policy.action_key!r} names {', '.join(optional)}, which the server's "
                "schema neither requires nor gives a default: a call leaving it out would have no key"
            )
        binding = MCPBinding(server, tool, replace(policy, side_effect=side_effect), dict(schema), guessed)
        description = own.description or (listed_tool or {}).get("description") or f"{tool} (MCP server {server.name})"
        specs.append(
            options.spec(
                name,
                args_model=model,
                fn=leased_mcp_call(binding),
                settings=None,
                description=description,
                direct=unleased_mcp_call(binding, model),
            )
        )
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise ConfigurationError(f"two MCP tools are declared as {spec.name!r}; give one name= or a prefix=")
        seen.add(spec.name)
    return specs


def _recorded(server: MCPServer, declared_in: object) -> Path | None:
    """The listing of ``server`` recorded beside the module at ``declared_in`` (its ``__file__``), if any."""
    if not isinstance(declared_in, str):
        return None
    found = recorded_path(server, Path(declared_in).parent)
    return found if found.is_file() else None


async def check_tools(specs: Sequence[ToolSpec]) -> None:
    """Check declared MCP tools against each server's live ``tools/list`` (when the worker starts), logging a
    guessed side-effect class and one the annotations contradict (the declaration wins). ``ConfigurationError``:
    a server lists no such tool, requires an argument the declaration lacks, or cannot be reached."""
    by_server: dict[MCPServer, list[MCPBinding]] = {}
    for spec in specs:
        binding = binding_of(spec)
        if binding is not None:
            by_server.setdefault(binding.server, []).append(binding)
    problems: list[str] = []
    for server, bindings in by_server.items():
        try:
            async with session(server) as client:
                live = await list_tools(client)
        except Exception as exc:  # noqa: BLE001 - reported, one line per server
            problems.append(f"cannot list the tools of MCP server {server.name!r}: {type(exc).__name__}: {exc}")
            continue
        for binding in bindings:
            problems.extend(compare(binding, live))
            _log_hints(binding, live.get(binding.tool))
    if problems:
        raise ConfigurationError("; ".join(problems))


def _log_hints(binding: MCPBinding, listed: Mapping[str, Any] | None) -> None:
    declared = SideEffectClass(binding.policy.side_effect)  # type: ignore[arg-type]
    if binding.guessed:
        logger.warning(
            "MCP tool %s/%s: side effect %s guessed from its annotations; declare it to decide",
            binding.server.name,
            binding.tool,
            declared.value,
        )
        return
    hints = (listed or {}).get("annotations") or {}
    if declared is SideEffectClass.READ_ONLY and hints.get("readOnlyHint") is False:
        logger.warning(
            "MCP tool %s/%s is declared read_only but its annotations say it writes", binding.server.name, binding.tool
        )


__all__ = ["check_tools", "guess_side_effect", "mcp_tools"]
