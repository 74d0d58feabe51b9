"""A ``ToolPolicy`` declares an MCP tool as fully as ``@tool`` declares a Python one: action key, probe, approval
TTL and conditional approval, checked by the same rules with the same messages, over the arguments of a declared
model or of the server's listed schema."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from agentlease import ProbeQuery, ProbeResult
from agentlease.enums import SideEffectClass
from agentlease.errors import ConfigurationError
from agentlease.mcp import READBACK_TOOL, MCPServer, ToolPolicy, mcp_tools
from agentlease.records import ApprovalRule
from agentlease.tools import LeaseContext, ToolResult, tool

CRM = MCPServer.stdio("crm", "python", ["-m", "crm_server"])
TTL = timedelta(seconds=5)

REFUND = {
    "name": "refund",
    "description": "Refund an order.",
    "inputSchema": {
        "type": "object",
        "properties": {
            "order_id": {"type": "string"},
            "amount": {"type": "number"},
            "currency": {"type": "string", "default": "EUR"},
            "note": {"type": "string"},
        },
        "required": ["order_id", "amount"],
    },
    "annotations": {"destructiveHint": True},
}


class Refund(BaseModel):
    order_id: str
    amount: float
    currency: str = "EUR"
    note: str | None = None


async def refunded(query: ProbeQuery) -> ProbeResult:
    return ProbeResult.not_happened()


def declared(**policy: Any) -> Any:
    [spec] = mcp_tools(
        CRM,
        default=ToolPolicy(side_effect="unsafe", lease_ttl=TTL),
        tools={"refund": ToolPolicy(**policy)},
        listed=[REFUND],
    )
    return spec


def test_an_mcp_tool_carries_its_action_key_probe_and_approval_ttl_as_a_python_tool_does() -> None:
    rule = ApprovalRule(field="amount", above=100)
    spec = declared(
        action_key="refund:{order_id}:{currency}",
        probe=refunded,
        approval_ttl=timedelta(minutes=30),
        requires_approval=rule,
        settle_window=timedelta(seconds=2),
    )

    assert (spec.action_key, spec.probe, spec.approval_ttl, spec.requires_approval, spec.settle_window) == (
        "refund:{order_id}:{currency}",
        refunded,
        timedelta(minutes=30),
        rule,
        timedelta(seconds=2),
    )
    info = spec.info()
    # The workflow keys and asks from the listed schema: its default fills a call that leaves it out.
    assert info.argument_defaults == {"currency": "EUR"}
    assert info.key_for({"order_id": "A-1", "amount": 50}) == "refund:A-1:EUR"
    assert info.approval_reason({"order_id": "A-1", "amount": 50}) is None
    assert (
        info.approval_reason({"order_id": "A-1", "amount": 500})
        == "refund requires approval: amount 500 is above 100 (rule: amount above 100)"
    )


def test_a_default_policy_gives_its_probe_and_approval_ttl_and_refuses_an_action_key() -> None:
    default = ToolPolicy(side_effect="unsafe", lease_ttl=TTL, probe=refunded, approval_ttl=timedelta(hours=1))
    [spec] = mcp_tools(CRM, default=default, listed=[REFUND])
    assert (spec.probe, spec.approval_ttl, spec.action_key) == (refunded, timedelta(hours=1), None)
    with pytest.raises(ConfigurationError, match="action_key names one tool's arguments; set it in tools="):
        mcp_tools(
            CRM, default=ToolPolicy(side_effect="unsafe", lease_ttl=TTL, action_key="x:{order_id}"), listed=[REFUND]
        )


def test_the_guards_readback_tool_in_a_recording_is_not_declared_for_the_model() -> None:
    """A guarded server's recorded tools/list holds ``agentlease_was_applied``, the guard's own: declared from the
    recording, it was a read-only tool the model could call."""
    readback = {"name": READBACK_TOOL, "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}}
    default = ToolPolicy(side_effect="unsafe", lease_ttl=TTL)
    assert [spec.name for spec in mcp_tools(CRM, default=default, listed=[REFUND, readback])] == ["refund"]


async def _body(ctx: LeaseContext, args: Refund) -> ToolResult:
    raise AssertionError("never run")


def _sync_probe(query: ProbeQuery) -> ProbeResult:
    return ProbeResult.not_happened()


@pytest.mark.parametrize(
    "policy",
    [
        {"action_key": "refund"},  # names no argument
        {"action_key": "refund:{order_id!r}"},
        {"action_key": "refund:{order}"},  # not an argument
        {"requires_approval": ApprovalRule(field="total", above=1)},  # not an argument
        {"approval_ttl": timedelta(0)},
        {"approval_ttl": timedelta(days=400)},
        {"probe": _sync_probe},
        {"settle_window": timedelta(seconds=1)},  # no probe to ask again
        {"settle_window": timedelta(0), "probe": refunded},
    ],
    ids=lambda policy: next(iter(policy)),
)
@pytest.mark.parametrize("arguments", ["listed schema", "declared model"])
def test_a_bad_declaration_is_refused_with_the_python_tools_own_message(policy: dict[str, Any], arguments: str) -> None:
    with pytest.raises(ConfigurationError) as python_tool:
        tool(side_effect="unsafe", lease_ttl=TTL, name="refund", **policy)(_body)
    own: dict[str, Any] = {"args": Refund} if arguments == "declared model" else {}
    with pytest.raises(ConfigurationError) as mcp_tool:
        declared(**own, **policy)
    assert str(mcp_tool.value) == str(python_tool.value)
    assert "\n" not in str(mcp_tool.value)


def test_an_action_key_over_a_listed_argument_a_call_may_leave_out_is_refused() -> None:
    with pytest.raises(
        ConfigurationError, match="names note, which the server's schema neither requires nor gives a default"
    ):
        declared(action_key="refund:{note}")


def test_a_listed_tool_sends_the_arguments_the_call_gives_and_requires_what_the_schema_requires() -> None:
    spec = declared()
    args = spec.args_model.model_validate({"order_id": "A-1", "amount": 50, "extra": [1]})
    # Every dump (the call's, an adapter's) has the schema's default and leaves the left-out note out, not null.
    assert args.model_dump(mode="json") == {"order_id": "A-1", "amount": 50, "currency": "EUR", "extra": [1]}
    given = spec.args_model.model_validate({"order_id": "A-1", "amount": 50, "note": None})
    assert given.model_dump(mode="json") == {"order_id": "A-1", "amount": 50, "currency": "EUR", "note": None}
    with pytest.raises(ValidationError, match="amount"):
        spec.args_model.model_validate({"order_id": "A-1"})
    assert spec.args_model.model_json_schema() == REFUND["inputSchema"]  # what the model reads: the server's schema
    assert spec.side_effect_class is SideEffectClass.UNSAFE
