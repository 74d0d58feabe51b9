"""The tool declaration: a tool's side-effect class and lease bounds beside its code (``docs/writing-tools.md``),
checked in :class:`LeaseOptions` for both :func:`tool` and :func:`agentlease.tools._wrap.leased`.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol, get_type_hints

from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import to_jsonable_python

from agentlease.enums import SideEffectClass
from agentlease.errors import ConfigurationError, MissingHeartbeatTimeoutError
from agentlease.limits import MAX_APPROVAL_TTL, MAX_TOOL_NAME_CHARS
from agentlease.records import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_START_TO_CLOSE,
    ApprovalRule,
    SettlementReceipt,
    ToolInfo,
    action_key_fields,
)
from agentlease.runtime.names import RESERVED_PREFIX
from agentlease.security.secrets import WORKER_ONLY
from agentlease.tools._probe import Probe

if TYPE_CHECKING:
    from agentlease.tools._context import LeaseContext


class ToolResult(BaseModel):
    """What a tool returns: the settlement ``receipt`` made after readback (a tool settles only through it), and a
    small JSON-able ``output`` for the agent (it travels through Temporal history)."""

    model_config = ConfigDict(frozen=True)

    receipt: SettlementReceipt
    output: dict[str, Any] = Field(default_factory=dict)


ToolFunction = Callable[["LeaseContext", Any], Awaitable[ToolResult]]


@dataclass(frozen=True)
class ToolSpec:
    """A declared tool, made by :func:`tool` or by :func:`agentlease.leased` (then callable directly: :meth:`__call__`).

    Attributes:
        name: the tool name, also the Temporal activity type; the bounds as declared (:func:`tool`).
        fn: the tool's code, ``(ctx, args) -> ToolResult``, as the worker runs it in a lease.
        description: what a model reads about the tool (the function's docstring); ``None``: none.
        direct: runs the wrapped function without a lease; ``None`` for a ``@tool`` tool.
    """

    name: str
    side_effect_class: SideEffectClass
    lease_ttl: timedelta
    start_to_close: timedelta
    max_attempts: int
    requires_approval: bool | ApprovalRule
    args_model: type[BaseModel]
    fn: ToolFunction
    settings: frozenset[str] | None = None
    description: str | None = None
    direct: Callable[..., Awaitable[Any]] | None = None
    action_key: str | None = None
    approval_ttl: timedelta | None = None
    probe: Probe | None = None
    settle_window: timedelta | None = None
    fenced: tuple[str, ...] = ()

    @property
    def __name__(self) -> str:  # what @activity.defn names an activity after
        return self.name

    def info(self) -> ToolInfo:
        """The part of the declaration the workflow needs to schedule the tool."""
        return ToolInfo(
            name=self.name,
            side_effect_class=self.side_effect_class,
            lease_ttl=self.lease_ttl,
            start_to_close=self.start_to_close,
            max_attempts=self.max_attempts,
            requires_approval=self.requires_approval,
            action_key=self.action_key,
            argument_defaults=_defaults_of(self.args_model, self.action_key),
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Awaitable[Any]:
        """Run the wrapped function directly, outside any lease (local runs, unit tests, evals):
        ``await spec(order_id="A-1")`` returns its own value, arguments validated by :attr:`args_model`
        (``TypeError``, ``ValidationError``). ``ConfigurationError``: a ``@tool`` tool, which runs only leased."""
        if self.direct is None:
            raise ConfigurationError(
                f"tool {self.name!r} takes (ctx, args) and runs only as a leased activity; "
                "lease a plain function with leased() to call it directly"
            )
        return self.direct(*args, **kwargs)


_ACTIVITY_DEFINITION = "__temporal_activity_definition"
_frozen_setattr = ToolSpec.__setattr__


def _setattr(self: Any, name: str, value: Any) -> None:
    """Frozen, but for the activity definition ``@activity.defn`` sets when it sits above ``@leased``."""
    if name != _ACTIVITY_DEFINITION:
        _frozen_setattr(self, name, value)
        return
    if getattr(value, "name", None) != self.name:
        raise ConfigurationError(
            f"tool {self.name!r}: an @activity.defn name above @leased does not rename the tool; "
            "put @leased(...) above @activity.defn, or give leased(name=...)"
        )
    object.__setattr__(self, name, value)


ToolSpec.__setattr__ = _setattr  # type: ignore[method-assign]


def _defaults_of(args_model: type[BaseModel], action_key: str | None) -> dict[str, Any]:
    """The JSON defaults of the arguments: every plain default, and a default factory's value only for an argument
    ``action_key`` names (a factory's value for another argument is the tool's to make, call by call)."""
    named = set(action_key_fields(action_key)) if action_key is not None else set()
    return {
        name: to_jsonable_python(field.get_default(call_default_factory=True), fallback=str)
        for name, field in args_model.model_fields.items()
        if not field.is_required() and (field.default_factory is None or name in named)
    }


class DeclaredTool(Protocol):
    """What the framework adapters need of a tool: a :class:`ToolSpec` (made by ``@tool`` or ``leased``)."""

    @property
    def name(self) -> str: ...

    @property
    def args_model(self) -> type[BaseModel]: ...

    @property
    def description(self) -> str | None: ...

    def info(self) -> ToolInfo: ...

    def __call__(self, *args: Any, **kwargs: Any) -> Awaitable[Any]: ...


def side_effect_class(value: SideEffectClass | str) -> SideEffectClass:
    """The side-effect class named ``value``. Raises ``ConfigurationError`` for an unknown one."""
    try:
        return SideEffectClass(value)
    except ValueError:
        known = ", ".join(c.value for c in SideEffectClass)
        raise ConfigurationError(f"unknown side_effect {value!r}; use one of {known}") from None


@dataclass(frozen=True)
class LeaseOptions:
    """A tool's side-effect class and lease bounds (the fields of :class:`ToolSpec`), checked: the one home of
    the rules both :func:`tool` and :func:`agentlease.leased` declare with. ``requires_approval`` ``None``: only
    for ``unsafe`` tools; an :class:`~agentlease.records.ApprovalRule`: the calls it asks for."""

    side_effect_class: SideEffectClass
    lease_ttl: timedelta
    start_to_close: timedelta
    max_attempts: int
    requires_approval: bool | ApprovalRule | None
    action_key: str | None = None
    approval_ttl: timedelta | None = None
    probe: Probe | None = None
    settle_window: timedelta | None = None
    fenced: str | Sequence[str] | None = None

    def check(self, tool_name: str) -> None:
        """Check the bounds of tool ``tool_name`` (``MissingHeartbeatTimeoutError``, ``ConfigurationError``)."""
        if not isinstance(self.lease_ttl, timedelta) or self.lease_ttl <= timedelta(0):
            raise MissingHeartbeatTimeoutError(
                f"tool {tool_name!r} has no lease_ttl: every tool call needs a heartbeat_timeout (G9)"
            )
        if self.start_to_close < self.lease_ttl:
            raise ConfigurationError(f"tool {tool_name!r}: start_to_close must be at least lease_ttl")
        if self.max_attempts < 1:
            raise ConfigurationError(f"tool {tool_name!r}: max_attempts must be at least 1")
        if self.approval_ttl is not None and (
            not isinstance(self.approval_ttl, timedelta) or not timedelta(0) < self.approval_ttl <= MAX_APPROVAL_TTL
        ):
            raise ConfigurationError(
                f"tool {tool_name!r}: approval_ttl must be a positive timedelta of at most {MAX_APPROVAL_TTL.days} days"
            )
        if self.action_key is not None:
            if not isinstance(self.action_key, str):
                raise ConfigurationError(
                    f"tool {tool_name!r}: action_key is a template over argument names, such as "
                    "'refund:{order_id}' (the workflow makes the key from it; a function cannot travel there)"
                )
            try:
                action_key_fields(self.action_key)
            except ValueError as exc:
                raise ConfigurationError(f"tool {tool_name!r}: {exc}") from None
        if not isinstance(self.requires_approval, bool | ApprovalRule | None):
            raise ConfigurationError(
                f"tool {tool_name!r}: requires_approval is True, False or an ApprovalRule, such as "
                "ApprovalRule(field='amount_cents', above=10000) (the workflow decides with it before the call; "
                "a function cannot travel there)"
            )
        if self.probe is not None and not inspect.iscoroutinefunction(self.probe):
            raise ConfigurationError(f"tool {tool_name!r}: probe must be an async function (ProbeQuery) -> ProbeResult")
        if self.settle_window is not None and (
            not isinstance(self.settle_window, timedelta) or not timedelta(0) < self.settle_window < self.start_to_close
        ):
            raise ConfigurationError(
                f"tool {tool_name!r}: settle_window must be a positive timedelta shorter than start_to_close"
            )
        if self.settle_window is not None and self.probe is None:
            raise ConfigurationError(f"tool {tool_name!r}: settle_window is how long its probe waits; give a probe")
        self.fenced_downstreams(tool_name)

    def fenced_downstreams(self, tool_name: str) -> tuple[str, ...]:
        """``fenced`` as base URLs (``ConfigurationError``: one that is not an absolute ``http(s)://`` base URL)."""
        if not self.fenced:
            return ()
        from agentlease.tools._fenced_http import fenced_downstream  # httpx: only for a tool that fences

        urls = [self.fenced] if isinstance(self.fenced, str) else self.fenced
        try:
            return tuple(dict.fromkeys(fenced_downstream(url) for url in urls))
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"tool {tool_name!r}: {exc}") from None

    def spec(
        self,
        name: str,
        *,
        args_model: type[BaseModel],
        fn: ToolFunction,
        settings: tuple[str, ...] | None,
        description: str | None,
        direct: Callable[..., Awaitable[Any]] | None = None,
    ) -> ToolSpec:
        """The :class:`ToolSpec` of tool ``name`` with these options, once they are checked."""
        _check_name(name)
        self.check(name)
        hidden = sorted(set(settings or ()) & WORKER_ONLY)
        if hidden:
            raise ConfigurationError(
                f"tool {name!r}: settings= names {', '.join(hidden)}, which only the worker reads "
                "(its own connections and secrets); a tool's credentials come from a secret provider"
            )
        if self.action_key is not None:
            unknown = [f for f in action_key_fields(self.action_key) if f not in args_model.model_fields]
            if unknown:
                raise ConfigurationError(
                    f"tool {name!r}: action_key {self.action_key!r} names {', '.join(unknown)}, not an argument "
                    f"of the tool (its arguments: {', '.join(args_model.model_fields) or 'none'})"
                )
        approval = self.requires_approval
        if isinstance(approval, ApprovalRule) and approval.field not in (None, *args_model.model_fields):
            raise ConfigurationError(
                f"tool {name!r}: requires_approval's rule ({approval}) names {approval.field!r}, not an argument "
                f"of the tool (its arguments: {', '.join(args_model.model_fields) or 'none'})"
            )
        return ToolSpec(
            name=name,
            side_effect_class=self.side_effect_class,
            lease_ttl=self.lease_ttl,
            start_to_close=self.start_to_close,
            max_attempts=self.max_attempts,
            requires_approval=self.side_effect_class is SideEffectClass.UNSAFE if approval is None else approval,
            args_model=args_model,
            fn=fn,
            settings=None if settings is None else frozenset(settings),
            description=description,
            direct=direct,
            action_key=self.action_key,
            approval_ttl=self.approval_ttl,
            probe=self.probe,
            settle_window=self.settle_window,
            fenced=self.fenced_downstreams(name),
        )


_TOOL_NAME = re.compile(rf"[A-Za-z_][A-Za-z0-9_.-]{{0,{MAX_TOOL_NAME_CHARS - 1}}}")


def _check_name(name: object) -> None:
    """A tool's name is 1 to :data:`~agentlease.limits.MAX_TOOL_NAME_CHARS` letters, digits, ``_ . -`` from a letter
    or ``_``, and not one of agentlease's own (``agentlease.``): else ``ConfigurationError``."""
    if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name) or name.startswith(RESERVED_PREFIX):
        raise ConfigurationError(
            f"bad tool name {name!r:.80}: 1 to {MAX_TOOL_NAME_CHARS} letters, digits, '_', '.' or '-' from a letter "
            f"or '_', not starting with {RESERVED_PREFIX!r}"
        )


def tool(
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
) -> Callable[[ToolFunction], ToolSpec]:
    """Declare a tool (``docs/writing-tools.md``).

    Args:
        side_effect: the tool's side-effect class, as the enum or its value (``"idempotent"``).
        lease_ttl: the lease TTL, used as the activity's ``heartbeat_timeout``; required (G9).
        start_to_close: bound of one attempt. Default 5 minutes.
        max_attempts: real attempts before dead-lettering. Default 5.
        requires_approval: each call waits for ``approve`` before its side effect (``True``), none does (``False``),
            or the calls an :class:`~agentlease.records.ApprovalRule` asks for (``ApprovalRule(field="amount_cents",
            above=10000)``: those above 10000, or not saying), each by ``approvers`` different people
            (``ApprovalRule(approvers=2)``: every call, by two). Default: for ``unsafe`` tools, one person.
        name: tool name; default the function's name.
        settings: the ``AgentLeaseSettings`` fields the tool may read (``ctx.settings``). Default: every field but
            the worker's own connections and secrets (``docs/security-operations.md``, "Tool credentials").
        action_key: a template over argument names (``"refund:{order_id}"``) keying a call that has no key,
            scoped to the run (``docs/action-keys-and-probes.md``). Default ``None``: ``<run>:<step>``.
        approval_ttl: how long an approval lasts on the ledger's clock. Default ``AGENTLEASE_APPROVAL_TTL``.
        probe: ``async (ProbeQuery) -> ProbeResult``, asked whether an action happened before an ambiguous task
            waits for a person (``docs/action-keys-and-probes.md``, "Probes"). Default none.
        settle_window: how long the downstream may take to show a write. The probe's "not happened" is asked
            again until this long after the write may have been made (on the ledger's clock), never trusted
            sooner; needs a probe, and is shorter than ``start_to_close``. Default ``None``: trusted at once.
        fenced: the base URL (or URLs) of the downstream the tool writes to (``"https://refunds.internal/v1"``): in
            a lease, each request the tool sends there with httpx carries ``Idempotency-Key``, ``Fencing-Token`` and
            ``Fencing-Resource`` (``docs/edge.md``, "Stamped by the client"). Default none.

    Returns:
        A decorator turning ``async def fn(ctx, args: Model) -> ToolResult`` into a :class:`ToolSpec`.

    Raises:
        MissingHeartbeatTimeoutError: ``lease_ttl`` is missing or not positive.
        ConfigurationError: an unknown side-effect class, the function is not async, its ``args``
            is not a pydantic model, or a bad ``action_key``, ``requires_approval``, ``approval_ttl``, ``probe``,
            ``settle_window`` or ``fenced``.
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

    def declare(fn: ToolFunction) -> ToolSpec:
        tool_name = fn.__name__ if name is None else name
        options.check(tool_name)
        if not inspect.iscoroutinefunction(fn):
            raise ConfigurationError(f"tool {tool_name!r} must be an async function")
        params = list(inspect.signature(fn).parameters)
        hints = get_type_hints(fn)
        args_model = hints.get(params[1]) if len(params) == 2 else None
        if not (isinstance(args_model, type) and issubclass(args_model, BaseModel)):
            raise ConfigurationError(f"tool {tool_name!r} must take (ctx, args: <pydantic model>)")
        return options.spec(tool_name, args_model=args_model, fn=fn, settings=settings, description=inspect.getdoc(fn))

    return declare
