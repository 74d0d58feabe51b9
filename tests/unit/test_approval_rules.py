"""Approval rules (``requires_approval=ApprovalRule(...)``): which calls they ask a person for, how a tool declares
one, and how it travels to the workflow in the tool's catalog entry."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from agentlease.errors import ConfigurationError
from agentlease.records import ToolInfo, approval_reason
from agentlease.tools import ApprovalRule, leased

RULE = ApprovalRule(field="amount_cents", above=100)


async def refund(order_id: str, amount_cents: int = 0) -> dict[str, Any]:
    """Refund an order."""
    return {"order_id": order_id}


@pytest.mark.parametrize(
    ("arguments", "why"),
    [
        ({"amount_cents": 50}, None),
        ({"amount_cents": 100}, None),
        ({"amount_cents": 100.5}, "amount_cents 100.5 is above 100"),
        ({"amount_cents": 500}, "amount_cents 500 is above 100"),
        ({"order_id": "A-1"}, "amount_cents is not given"),
        ({"amount_cents": "500"}, "amount_cents is not a number"),
        ({"amount_cents": True}, "amount_cents is not a number"),
        ({"amount_cents": None}, "amount_cents is not a number"),
        ({"amount_cents": math.nan}, "amount_cents is not a number"),
    ],
)
def test_a_rule_asks_for_a_person_above_its_bound_and_whenever_it_cannot_read_the_argument(
    arguments: dict[str, Any], why: str | None
) -> None:
    expected = None if why is None else f"refund requires approval: {why} (rule: amount_cents above 100)"
    assert approval_reason("refund", RULE, arguments) == expected


def test_a_static_flag_asks_as_before() -> None:
    assert approval_reason("refund", True, {"amount_cents": 1}) == "refund requires approval"
    assert approval_reason("refund", False, {"amount_cents": 10**9}) is None


def test_a_rule_travels_to_the_workflow_in_the_tools_catalog_entry() -> None:
    spec = leased(refund, side_effect="unsafe", lease_ttl=timedelta(seconds=5), requires_approval=RULE)
    info = ToolInfo.model_validate_json(spec.info().model_dump_json())

    assert info.requires_approval == RULE
    assert info.approval_reason({"order_id": "A-1", "amount_cents": 50}) is None
    assert info.approval_reason({"order_id": "A-1", "amount_cents": 500}) is not None
    old = spec.info().model_dump(mode="json") | {"requires_approval": True}  # a catalog of before rules
    assert ToolInfo.model_validate(old).requires_approval is True


def test_a_rule_must_name_an_argument_of_the_tool() -> None:
    with pytest.raises(ConfigurationError, match="names 'amount', not an argument of the tool"):
        leased(
            refund,
            side_effect="unsafe",
            lease_ttl=timedelta(seconds=5),
            requires_approval=ApprovalRule(field="amount", above=100),
        )


def test_a_function_is_no_rule() -> None:
    predicate: Any = lambda args: args.amount_cents > 100  # noqa: E731
    with pytest.raises(ConfigurationError, match="requires_approval is True, False or an ApprovalRule"):
        leased(refund, side_effect="unsafe", lease_ttl=timedelta(seconds=5), requires_approval=predicate)


def test_a_rule_bound_is_a_finite_number() -> None:
    with pytest.raises(ValidationError):
        ApprovalRule(field="amount_cents", above=math.inf)
