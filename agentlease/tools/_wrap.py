"""Leasing a tool you already have, as it is: :func:`leased` (``docs/wrapping-tools.md``); the worker records
``external_call`` first unless it is ``read_only`` (it may act at once, G7).
"""

from __future__ import annotations

import asyncio
import inspect
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any, get_origin, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, PydanticSchemaGenerationError, PydanticUserError, create_model
from pydantic_core import to_jsonable_python
from temporalio import activity

from agentlease.enums import SideEffectClass, Stage
from agentlease.errors import ConfigurationError
from agentlease.lease import _entered
from agentlease.records import DEFAULT_MAX_ATTEMPTS, DEFAULT_START_TO_CLOSE, ApprovalRule
from agentlease.tools._context import LeaseContext
from agentlease.tools._declaration import LeaseOptions, ToolResult, ToolSpec, side_effect_class
from agentlease.tools._probe import Probe

__all__ = ["leased", "not_leasable", "output_of", "run_unleased"]

DEFAULT_STATUS = "returned"
"""The status of the default receipt: the function returned (nothing was read back)."""

_ARGS_CONFIG = ConfigDict(extra="forbid", protected_namespaces=())
_CONTEXT_TYPES = (
    ("pydantic_ai", "RunContext"),
    ("agents", "RunContextWrapper"),
    ("google.adk.tools.tool_context", "ToolContext"),
    ("strands.types.tools", "ToolContext"),
)
"""Framework context types a leased function cannot take: no framework runs it to pass one."""
_FRAMEWORK_TOOLS: tuple[tuple[str, str, Callable[[Any], tuple[Any, str, str | None]]], ...] = (
    ("langchain_core.tools", "StructuredTool", lambda t: (t.coroutine or t.func, t.name, t.description or None)),
    ("google.adk.tools", "FunctionTool", lambda t: (t.func, t.name, t.description or None)),
    (
        "strands.tools.decorator",
        "DecoratedFunctionTool",
        lambda t: (t.__wrapped__, t.tool_name, t.tool_spec.get("description") or None),
    ),
)
"""``(module, class, tool -> (function, name, description))``: a LangChain/LangGraph ``@tool``, an ADK
``FunctionTool``, a Strands ``@tool``, leased through the function each wraps."""


@overload
def leased(
    fn: Any,
    *,
    side_effect: SideEffectClass | str,
    lease_ttl: timedelta,
    start_to_close: timedelta = ...,
    max_attempts: int = ...,
    requires_approval: bool | ApprovalRule | None = ...,
    name: str | None = ...,
    settings: tuple[str, ...] | None = ...,
    action_key: str | None = ...,
    approval_ttl: timedelta | None = ...,
    probe: Probe | None = ...,
    settle_window: timedelta | None = ...,
    fenced: str | Sequence[str] | None = ...,
) -> ToolSpec: ...
@overload
def leased(
    fn: None = ...,
    *,
    side_effect: SideEffectClass | str,
    lease_ttl: timedelta,
    start_to_close: timedelta = ...,
    max_attempts: int = ...,
    requires_approval: bool | ApprovalRule | None = ...,
    name: str | None = ...,
    settings: tuple[str, ...] | None = ...,
    action_key: str | None = ...,
    approval_ttl: timedelta | None = ...,
    probe: Probe | None = ...,
    settle_window: timedelta | None = ...,
    fenced: str | Sequence[str] | None = ...,
) -> Callable[[Any], ToolSpec]: ...
def leased(
    fn: Any = None,
    *,
    side_effect: SideEffectClass | str,
    lease_ttl: timedelta,
    start_to_close: timedelta = DEFAULT_START_TO_CLOSE,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    requires_approval: bool | ApprovalRule | None = None,
    name: str | None = None,
    settings: tuple[str, ...] | None = None,
    action_key: str | None = None,
    approval_ttl: timedelta | None = None,
    probe: Probe | None = None,
    settle_window: timedelta | None = None,
    fenced: str | Sequence[str] | None = None,
) -> ToolSpec | Callable[[Any], ToolSpec]:
    """Lease an existing tool as it is (``docs/wrapping-tools.md``): as a decorator, above or below
    ``@activity.defn`` (``@leased(side_effect="fenced", lease_ttl=timedelta(seconds=10))``), or called on what
    you have (``refund = leased(issue_refund, side_effect="idempotent", lease_ttl=...)``).

    Args:
        fn: a function with typed parameters (async, or sync: run in a thread); an ``@activity.defn``
            function; a ``pydantic_ai.Tool`` or an ``agents.FunctionTool`` (its function, name and
            description). Omitted: a decorator.
        name: the tool name. Default the activity's, the framework tool's or the function's name.
        side_effect, lease_ttl, start_to_close, max_attempts, requires_approval, settings, action_key,
            approval_ttl, probe, settle_window, fenced: as for :func:`agentlease.tool` (``action_key`` over the
            parameters' names).

    Returns:
        The :class:`ToolSpec` (its argument model one field per parameter, extra ones refused; the function
        returns a ``ToolResult``, or else settles with the receipt ``(<tool>, <key>, "returned")``).

    Raises:
        MissingHeartbeatTimeoutError, ConfigurationError: as for :func:`agentlease.tool`, or a function that
            cannot be leased as it is: taking a framework context or a ``LeaseContext``, ``*args`` or
            ``**kwargs``, a parameter pydantic cannot validate, a dynamic activity, a ``FunctionTool`` whose
            function is not kept, or something not callable.
    """
    options = LeaseOptions(
        side_effect_class(side_effect),
        lease_ttl,
        start_to_close,
        max_attempts,
        requires_approval,
        action_key=action_key,
        approval_ttl=approval_ttl,
        probe=probe,
        settle_window=settle_window,
        fenced=fenced,
    )

    def declare(target: Any) -> ToolSpec:
        function, default_name, description = _source(target)
        tool_name = default_name if name is None else name
        options.check(tool_name)
        args_model, call = _signature(function, tool_name)
        signature = inspect.signature(function)

        async def direct(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            return await call(args_model.model_validate(bound.arguments))

        return options.spec(
            tool_name,
            args_model=args_model,
            fn=_adapter(tool_name, options.side_effect_class, call),
            settings=settings,
            description=description or inspect.getdoc(function),
            direct=direct,
        )

    return declare if fn is None else declare(fn)


def output_of(value: Any) -> dict[str, Any]:
    """What the agent reads of a return value: a ``ToolResult``'s output, a JSON object, or ``{"result": value}``."""
    if isinstance(value, ToolResult):
        return value.output
    jsonable = to_jsonable_python(value, fallback=str)
    return jsonable if isinstance(jsonable, dict) else {"result": jsonable}


async def run_unleased(tool: Callable[..., Awaitable[Any]], arguments: dict[str, Any]) -> dict[str, Any]:
    """Run ``tool`` directly, no lease, and return what the agent reads (the adapters outside a workflow)."""
    return output_of(await tool(**arguments))


def _source(target: Any) -> tuple[Callable[..., Any], str, str | None]:
    """``(function, default tool name, description)`` of what is to be leased (else ``ConfigurationError``)."""
    if isinstance(target, ToolSpec):
        raise ConfigurationError(f"tool {target.name!r} is already declared; lease the function itself once")
    if _is_mcp(target):
        raise ConfigurationError(not_leasable(target, "leased()"))
    pydantic_ai = sys.modules.get("pydantic_ai")
    if pydantic_ai is not None and isinstance(target, pydantic_ai.Tool):
        if target.takes_ctx:
            raise ConfigurationError(
                f"tool {target.name!r} takes a RunContext, which only Pydantic AI can pass; a leased tool runs "
                "in a Temporal activity: drop the parameter (read the lease with agentlease.lease)"
            )
        return target.function, target.name, target.description
    agents = sys.modules.get("agents")
    if agents is not None and isinstance(target, agents.FunctionTool):
        try:
            function = target.__wrapped__
        except AttributeError:
            raise ConfigurationError(
                f"tool {target.name!r}: this FunctionTool keeps no Python function; pass the undecorated function"
            ) from None
        return function, target.name, target.description or None
    for module, class_name, parts in _FRAMEWORK_TOOLS:
        kind = getattr(sys.modules.get(module), class_name, None)
        if isinstance(kind, type) and isinstance(target, kind):
            function, name, description = parts(target)
            if not callable(function):
                raise ConfigurationError(
                    f"tool {name!r}: this {class_name} keeps no Python function; pass the function"
                )
            return function, name, description
    if not callable(target):
        raise ConfigurationError(f"cannot lease {target!r}: not a function")
    definition = activity._Definition.from_callable(target)
    if definition is not None and definition.name is None:
        raise ConfigurationError(f"cannot lease the dynamic activity {target.__name__!r}: a tool has one name")
    default = definition.name if definition is not None and definition.name else getattr(target, "__name__", None)
    if not default:
        raise ConfigurationError(f"cannot lease {target!r} without name=: it has no __name__")
    return target, default, None


def _is_mcp(target: Any) -> bool:
    """Whether ``target`` is an MCP server or toolset object of some framework (or of the SDK)."""
    kind = type(target)
    module = kind.__module__ or ""
    return "MCP" in kind.__name__ or module.split(".")[0] in ("mcp", "fastmcp") or ".mcp" in module


def not_leasable(target: Any, where: str) -> str:
    """One line refusing ``target`` where a declared tool is taken, naming what to do instead."""
    name = getattr(target, "name", None) or getattr(target, "id", None)
    what = f"the {type(target).__name__}" + (f" {name!r}" if isinstance(name, str) else "")
    if _is_mcp(target):
        return (
            f"{where} cannot lease {what}: declare the MCP server's tools with agentlease.mcp.mcp_tools("
            "agentlease.mcp.MCPServer.stdio(...) or .http(...)) and pass those (docs/mcp.md); an MCP toolset kept "
            "beside them runs unleased"
        )
    return f"{where} takes declared tools (@tool or leased(...)), not {what}"


def _signature(
    function: Callable[..., Any], tool_name: str
) -> tuple[type[BaseModel], Callable[[BaseModel], Awaitable[Any]]]:
    """The argument model built from ``function``'s signature, and the call of ``function`` with one."""
    try:
        signature = inspect.signature(function)
        hints = get_type_hints(function, include_extras=True)
    except (NameError, TypeError, ValueError) as exc:
        raise ConfigurationError(f"tool {tool_name!r}: cannot read its signature ({exc})") from None
    fields: dict[str, Any] = {}
    positional: list[str] = []
    for param in signature.parameters.values():
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise ConfigurationError(
                f"tool {tool_name!r}: *{param.name} cannot be leased; give every argument its own parameter"
            )
        annotation = hints.get(param.name, Any)
        _refuse_context(annotation, tool_name, param.name)
        fields[param.name] = (annotation, ... if param.default is inspect.Parameter.empty else param.default)
        if param.kind is inspect.Parameter.POSITIONAL_ONLY:
            positional.append(param.name)
    try:
        args_model: type[BaseModel] = create_model(
            f"{_pascal(tool_name)}Args", __config__=_ARGS_CONFIG, __module__=function.__module__, **fields
        )
    except (PydanticSchemaGenerationError, PydanticUserError, NameError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigurationError(f"tool {tool_name!r}: its parameters cannot be validated ({first})") from None
    keywords = [field for field in fields if field not in positional]
    is_async = inspect.iscoroutinefunction(function)

    async def call(args: BaseModel) -> Any:
        values = [getattr(args, field) for field in positional]
        named = {field: getattr(args, field) for field in keywords}
        if is_async:
            return await function(*values, **named)
        return await asyncio.to_thread(function, *values, **named)

    return args_model, call


def _refuse_context(annotation: Any, tool_name: str, param: str) -> None:
    """Refuse a parameter only a framework (or the ``@tool`` runtime) could pass."""
    kind = get_origin(annotation) or annotation
    if not isinstance(kind, type):
        return
    if issubclass(kind, LeaseContext):
        raise ConfigurationError(
            f"tool {tool_name!r} takes a LeaseContext ({param}): declare it with @tool, or drop the parameter "
            "and read the lease with agentlease.lease"
        )
    for module, type_name in _CONTEXT_TYPES:
        framework = sys.modules.get(module)
        context_type = getattr(framework, type_name, None) if framework is not None else None
        if isinstance(context_type, type) and issubclass(kind, context_type):
            raise ConfigurationError(
                f"tool {tool_name!r} takes a {type_name} ({param}), which only its framework can pass; a leased "
                "tool runs in a Temporal activity: drop the parameter (read the lease with agentlease.lease)"
            )


def _adapter(
    tool_name: str, side_effect_class: SideEffectClass, call: Callable[[BaseModel], Awaitable[Any]]
) -> Callable[[LeaseContext, Any], Awaitable[ToolResult]]:
    """The ``(ctx, args) -> ToolResult`` the worker runs in a lease."""
    starts_effect = side_effect_class is not SideEffectClass.READ_ONLY

    async def run(ctx: LeaseContext, args: Any) -> ToolResult:
        with _entered(ctx):
            if starts_effect and (ctx.stage is None or ctx.stage.order < Stage.EXTERNAL_CALL.order):
                await ctx.advance(Stage.EXTERNAL_CALL, f"calling {tool_name}")
            value = await call(args)
        if isinstance(value, ToolResult):
            return value
        receipt = ctx.receipt(external_system=tool_name, external_id=ctx.idempotency_key, status=DEFAULT_STATUS)
        return ToolResult(receipt=receipt, output=output_of(value))

    run.__name__ = run.__qualname__ = tool_name
    return run


def _pascal(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.replace("-", "_").split("_")) or "Tool"
