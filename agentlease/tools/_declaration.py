"""The tool declaration: a tool's side-effect class and lease bounds beside its code.

A tool is an async function ``(ctx: LeaseContext, args: ArgsModel) -> ToolResult`` declared with
:func:`tool`. Every tool has a lease TTL, which is the ``heartbeat_timeout`` of each attempt (G9):
declaring one without it is refused.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, get_type_hints

from pydantic import BaseModel, ConfigDict, Field

from agentlease.enums import SideEffectClass
from agentlease.errors import ConfigurationError, MissingHeartbeatTimeoutError
from agentlease.records import DEFAULT_MAX_ATTEMPTS, DEFAULT_START_TO_CLOSE, SettlementReceipt, ToolInfo

if TYPE_CHECKING:
    from agentlease.tools._context import LeaseContext


class ToolResult(BaseModel):
    """What a tool returns: the receipt made after readback, and a small JSON-able output.

    Attributes:
        receipt: the settlement receipt; a tool settles only through it.
        output: result data for the agent (kept small: it travels through Temporal history).
    """

    model_config = ConfigDict(frozen=True)

    receipt: SettlementReceipt
    output: dict[str, Any] = Field(default_factory=dict)


ToolFunction = Callable[["LeaseContext", Any], Awaitable[ToolResult]]


@dataclass(frozen=True)
class ToolSpec:
    """A declared tool.

    Attributes:
        name: the tool name, also the Temporal activity type.
        side_effect_class: see :class:`SideEffectClass`.
        lease_ttl: lease TTL = heartbeat timeout of each attempt.
        start_to_close: bound of one attempt. Default 5 minutes.
        max_attempts: real attempts before the task is dead-lettered. Default 5.
        requires_approval: whether each call waits for an operator's ``approve`` before it runs.
        args_model: the pydantic model of the tool's arguments.
        fn: the tool's code.
        settings: the settings the tool reads through ``ctx.settings``; ``None``: every one but
            the worker's own (:data:`agentlease.secrets.WORKER_ONLY`).
    """

    name: str
    side_effect_class: SideEffectClass
    lease_ttl: timedelta
    start_to_close: timedelta
    max_attempts: int
    requires_approval: bool
    args_model: type[BaseModel]
    fn: ToolFunction
    settings: frozenset[str] | None = None

    def info(self) -> ToolInfo:
        """The part of the declaration the workflow needs to schedule the tool."""
        return ToolInfo(
            name=self.name,
            side_effect_class=self.side_effect_class,
            lease_ttl=self.lease_ttl,
            start_to_close=self.start_to_close,
            max_attempts=self.max_attempts,
            requires_approval=self.requires_approval,
        )


def tool(
    *,
    side_effect: SideEffectClass | str,
    lease_ttl: timedelta,
    start_to_close: timedelta = DEFAULT_START_TO_CLOSE,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    requires_approval: bool | None = None,
    name: str | None = None,
    settings: tuple[str, ...] | None = None,
) -> Callable[[ToolFunction], ToolSpec]:
    """Declare a tool (``docs/writing-tools.md``).

    Args:
        side_effect: the tool's side-effect class, as the enum or its value (``"idempotent"``).
        lease_ttl: the lease TTL, used as the activity's ``heartbeat_timeout``; required (G9).
        start_to_close: bound of one attempt. Default 5 minutes.
        max_attempts: real attempts before dead-lettering. Default 5.
        requires_approval: each call waits for ``approve`` before its side effect. Default: true
            for ``unsafe`` tools, false otherwise.
        name: tool name; default the function's name.
        settings: the ``AgentLeaseSettings`` fields the tool reads (``ctx.settings``); reading any
            other is an error. Default: every field but the worker's own connections and secrets
            (``docs/security.md``, "Tool credentials").

    Returns:
        A decorator turning ``async def fn(ctx, args: Model) -> ToolResult`` into a :class:`ToolSpec`.

    Raises:
        MissingHeartbeatTimeoutError: ``lease_ttl`` is missing or not positive.
        ConfigurationError: an unknown side-effect class, the function is not async, or its
            ``args`` is not a pydantic model.
    """
    try:
        side_effect_class = SideEffectClass(side_effect)
    except ValueError:
        known = ", ".join(c.value for c in SideEffectClass)
        raise ConfigurationError(f"unknown side_effect {side_effect!r}; use one of {known}") from None

    def declare(fn: ToolFunction) -> ToolSpec:
        tool_name = name or fn.__name__
        if not isinstance(lease_ttl, timedelta) or lease_ttl <= timedelta(0):
            raise MissingHeartbeatTimeoutError(
                f"tool {tool_name!r} has no lease_ttl: every tool call needs a heartbeat_timeout (G9)"
            )
        if start_to_close < lease_ttl:
            raise ConfigurationError(f"tool {tool_name!r}: start_to_close must be at least lease_ttl")
        if max_attempts < 1:
            raise ConfigurationError(f"tool {tool_name!r}: max_attempts must be at least 1")
        if not inspect.iscoroutinefunction(fn):
            raise ConfigurationError(f"tool {tool_name!r} must be an async function")
        params = list(inspect.signature(fn).parameters)
        hints = get_type_hints(fn)
        args_model = hints.get(params[1]) if len(params) == 2 else None
        if not (isinstance(args_model, type) and issubclass(args_model, BaseModel)):
            raise ConfigurationError(f"tool {tool_name!r} must take (ctx, args: <pydantic model>)")
        return ToolSpec(
            name=tool_name,
            side_effect_class=side_effect_class,
            lease_ttl=lease_ttl,
            start_to_close=start_to_close,
            max_attempts=max_attempts,
            requires_approval=(
                side_effect_class is SideEffectClass.UNSAFE if requires_approval is None else requires_approval
            ),
            args_model=args_model,
            fn=fn,
            settings=None if settings is None else frozenset(settings),
        )

    return declare
