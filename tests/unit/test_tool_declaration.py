"""The tool declaration and the scheduling options of a leased call (G9), as pure logic."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import BaseModel

from agentlease.enums import FailureType, SideEffectClass
from agentlease.errors import ConfigurationError, MissingHeartbeatTimeoutError, UnknownToolError
from agentlease.records import ToolInfo
from agentlease.tools._declaration import ToolResult, tool
from agentlease.tools._registry import ToolRegistry, load_registry
from agentlease.workflow._options import leased_activity_options


class Args(BaseModel):
    value: int = 0


async def _body(ctx: object, args: Args) -> ToolResult:
    raise NotImplementedError


@pytest.mark.parametrize("ttl", [None, timedelta(0), timedelta(seconds=-1)])
def test_a_tool_without_a_lease_ttl_is_refused(ttl: timedelta | None) -> None:
    with pytest.raises(MissingHeartbeatTimeoutError, match="heartbeat_timeout"):
        tool(side_effect=SideEffectClass.READ_ONLY, lease_ttl=ttl)(_body)  # type: ignore[arg-type]


def test_declaration_checks_its_shape() -> None:
    with pytest.raises(ConfigurationError, match="start_to_close"):
        tool(side_effect=SideEffectClass.READ_ONLY, lease_ttl=timedelta(minutes=10))(_body)
    with pytest.raises(ConfigurationError, match="max_attempts"):
        tool(side_effect=SideEffectClass.READ_ONLY, lease_ttl=timedelta(seconds=5), max_attempts=0)(_body)

    def not_async(ctx: object, args: Args) -> ToolResult:
        raise NotImplementedError

    with pytest.raises(ConfigurationError, match="async"):
        tool(side_effect=SideEffectClass.READ_ONLY, lease_ttl=timedelta(seconds=5))(not_async)  # type: ignore[arg-type]

    async def untyped(ctx: object, args: dict) -> ToolResult:
        raise NotImplementedError

    with pytest.raises(ConfigurationError, match="pydantic model"):
        tool(side_effect=SideEffectClass.READ_ONLY, lease_ttl=timedelta(seconds=5))(untyped)


def test_declared_tool_carries_its_bounds() -> None:
    spec = tool(side_effect=SideEffectClass.FENCED, lease_ttl=timedelta(seconds=7), name="fenced_write")(_body)
    assert spec.info() == ToolInfo(
        name="fenced_write",
        side_effect_class=SideEffectClass.FENCED,
        lease_ttl=timedelta(seconds=7),
        start_to_close=timedelta(minutes=5),
        max_attempts=5,
        argument_defaults={"value": 0},
    )
    assert spec.args_model is Args


def test_scheduling_options_make_the_heartbeat_timeout_from_the_lease_ttl() -> None:
    info = ToolInfo(
        name="t",
        side_effect_class=SideEffectClass.IDEMPOTENT,
        lease_ttl=timedelta(seconds=9),
        start_to_close=timedelta(minutes=1),
        max_attempts=3,
    )
    options = leased_activity_options(info)
    assert options.heartbeat_timeout == timedelta(seconds=3)  # a third of the lease TTL
    assert options.start_to_close_timeout == timedelta(minutes=1)
    assert options.retry_policy.maximum_attempts == 0  # the ledger counts real attempts
    assert set(options.retry_policy.non_retryable_error_types or []) == {
        FailureType.DEAD_LETTERED,
        FailureType.TASK_CANCELLED,
        FailureType.MISSING_HEARTBEAT_TIMEOUT,
        FailureType.BLOCKED,
        FailureType.NEEDS_RECONCILIATION,
        FailureType.TASK_CLOSED,
        FailureType.INVALID_TOOL_CALL,
        FailureType.LEDGER_REFUSED_VALUE,
    }


def test_scheduling_without_heartbeat_timeout_is_refused() -> None:
    info = ToolInfo.model_construct(
        name="t",
        side_effect_class=SideEffectClass.IDEMPOTENT,
        lease_ttl=timedelta(0),
        start_to_close=timedelta(minutes=1),
        max_attempts=3,
    )
    with pytest.raises(MissingHeartbeatTimeoutError, match="heartbeat_timeout"):
        leased_activity_options(info)


def test_registry_knows_builtins_and_rejects_unknown_and_duplicate_names() -> None:
    registry = load_registry()
    assert {"http_get", "sql_upsert"} <= set(registry.names())
    with pytest.raises(UnknownToolError, match="unknown tool 'nope'"):
        registry.get("nope")
    one = tool(side_effect=SideEffectClass.READ_ONLY, lease_ttl=timedelta(seconds=5), name="http_get")(_body)
    with pytest.raises(ConfigurationError, match="two tools"):
        ToolRegistry([*registry.specs(), one])
    with pytest.raises(ConfigurationError, match="cannot import tool module"):
        load_registry(["no.such.module"])
