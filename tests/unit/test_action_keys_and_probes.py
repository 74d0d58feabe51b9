"""Declaring an action key, a probe and an approval TTL on a tool (issue 18): what is accepted, what is
refused in one line, and the key the workflow makes from a call's arguments (pure, no server)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from agentlease.enums import ErrorClass, ProbeAnswer, RecoveryAction
from agentlease.errors import ConfigurationError
from agentlease.records import SettlementReceipt, ToolInfo, action_key_fields, action_key_for, settled_note
from agentlease.recovery._policy import decide_after_probe
from agentlease.tools._context import LeaseContext
from agentlease.tools._declaration import ToolResult, tool
from agentlease.tools._probe import ProbeQuery, ProbeResult
from agentlease.tools._wrap import leased
from agentlease.tools.builtin.http_publish import http_publish
from agentlease.tools.builtin.smtp_send import smtp_send

TTL = timedelta(seconds=5)


class Refund(BaseModel):
    order_id: str
    amount_cents: int = 100
    currency: str = "EUR"


async def found(query: ProbeQuery) -> ProbeResult:
    return ProbeResult.cannot_tell("test")


def test_a_tool_declares_its_action_key_and_the_workflow_makes_it_from_the_arguments() -> None:
    @tool(side_effect="unsafe", lease_ttl=TTL, action_key="refund:{order_id}:{currency}", probe=found)
    async def refund(ctx: LeaseContext, args: Refund) -> ToolResult:
        raise NotImplementedError

    info = refund.info()
    assert (info.action_key, info.argument_defaults) == (
        "refund:{order_id}:{currency}",
        {"currency": "EUR", "amount_cents": 100},
    )
    assert info.key_for({"order_id": "A-1", "amount_cents": 5}) == "refund:A-1:EUR"  # a default fills in
    assert info.key_for({"order_id": "A-1", "currency": "USD"}) == "refund:A-1:USD"
    assert refund.probe is found
    # The catalog is data: it travels to the workflow and back as JSON, and keeps making the same key.
    again = ToolInfo.model_validate(info.model_dump(mode="json"))
    assert again.key_for({"order_id": "A-1"}) == "refund:A-1:EUR"
    with pytest.raises(ValueError, match="needs the argument 'order_id'"):
        info.key_for({"amount_cents": 1})


def test_a_leased_function_declares_them_too() -> None:
    @leased(side_effect="unsafe", lease_ttl=TTL, action_key="refund:{order_id}", approval_ttl=timedelta(minutes=5))
    async def issue_refund(order_id: str, amount_cents: int) -> dict[str, Any]:
        return {}

    assert issue_refund.info().key_for({"order_id": 7, "amount_cents": 1}) == "refund:7"  # not a string: JSON
    assert issue_refund.approval_ttl == timedelta(minutes=5)
    assert ToolInfo.model_validate(issue_refund.info().model_dump()).action_key == "refund:{order_id}"


@pytest.mark.parametrize(
    ("options", "refusal"),
    [
        ({"action_key": lambda args: "x"}, "action_key is a template over argument names"),
        ({"action_key": "refund:{oid}"}, "names oid, not an argument of the tool"),
        ({"action_key": "refund:{order_id!r}"}, "is not a plain argument name"),
        ({"action_key": "refund:{order_id.x}"}, "is not a plain argument name"),
        ({"action_key": "refund:{order_id:>5}"}, "is not a plain argument name"),
        ({"action_key": "refund"}, "names no argument"),
        ({"action_key": "refund:{"}, "is not a template"),
        ({"action_key": "refund:{order_id}\x00"}, "contains a NUL character"),
        ({"action_key": "refund:\n{order_id}"}, "contains a control character"),
        ({"approval_ttl": timedelta(0)}, "approval_ttl must be a positive timedelta"),
        ({"probe": lambda query: None}, "probe must be an async function"),
        ({"settle_window": timedelta(milliseconds=200)}, "settle_window is how long its probe waits; give a probe"),
        ({"probe": found, "settle_window": timedelta(0)}, "settle_window must be a positive timedelta shorter"),
        ({"probe": found, "settle_window": timedelta(hours=1)}, "settle_window must be a positive timedelta shorter"),
        ({"probe": found, "settle_window": 0.2}, "settle_window must be a positive timedelta shorter"),
    ],
)
def test_a_bad_declaration_is_refused_in_one_line(options: dict[str, Any], refusal: str) -> None:
    with pytest.raises(ConfigurationError, match=refusal.replace("(", r"\(")):

        @leased(side_effect="unsafe", lease_ttl=TTL, **options)
        async def issue_refund(order_id: str) -> None: ...


def test_template_fields_and_escaped_braces() -> None:
    assert action_key_fields("{{ref}}:{a}/{b}") == ["a", "b"]
    assert action_key_for("{{ref}}:{a}/{b}", {"a": "x", "b": {"k": [1, 2]}}) == '{ref}:x/{"k"%3A[1,2]}'


def test_the_built_ins_that_can_be_asked_have_probes() -> None:
    assert smtp_send.probe is not None and http_publish.probe is not None


def test_a_probe_result_is_made_by_its_three_answers() -> None:
    receipt = SettlementReceipt(external_system="x", external_id="1", status="ok", verified_at=datetime.now(UTC))
    assert ProbeResult.happened(receipt, seen=1).answer is ProbeAnswer.HAPPENED
    assert ProbeResult.not_happened(seen=0).summary() == "not_happened: seen=0"
    assert ProbeResult.cannot_tell("no record").summary() == "cannot_tell: no record"
    with pytest.raises(ValueError, match="with a receipt"):
        ProbeResult(ProbeAnswer.NOT_HAPPENED, receipt)
    with pytest.raises(ValueError, match="with a receipt"):
        ProbeResult(ProbeAnswer.HAPPENED)


def test_a_conflict_carries_what_the_downstream_holds_and_no_receipt() -> None:
    conflict = ProbeResult.conflict("the key holds a refund of 500", held={"amount_cents": 500})
    assert (conflict.answer, conflict.receipt) == (ProbeAnswer.CONFLICT, None)
    assert conflict.evidence == {"why": "the key holds a refund of 500", "held": {"amount_cents": 500}}
    assert conflict.summary() == "conflict: the key holds a refund of 500"
    receipt = SettlementReceipt(external_system="x", external_id="1", status="ok", verified_at=datetime.now(UTC))
    with pytest.raises(ValueError, match="with a receipt"):
        ProbeResult(ProbeAnswer.CONFLICT, receipt)


def test_a_tool_declares_how_late_its_downstream_shows_a_write() -> None:
    @leased(side_effect="unsafe", lease_ttl=TTL, probe=found, settle_window=timedelta(milliseconds=200))
    async def issue_refund(order_id: str) -> None: ...

    assert issue_refund.settle_window == timedelta(milliseconds=200)
    assert http_publish.settle_window is None  # trusted at once unless declared


def test_a_probe_that_found_nothing_lets_the_rest_of_the_policy_decide() -> None:
    assert decide_after_probe(None, real_attempts=1, max_attempts=5).action is RecoveryAction.RETRY_SAME_KEY
    assert decide_after_probe(ErrorClass.AMBIGUOUS, real_attempts=5, max_attempts=5).action is (
        RecoveryAction.DEAD_LETTER
    )
    assert decide_after_probe(ErrorClass.PERMANENT, real_attempts=1, max_attempts=5).action is (
        RecoveryAction.DEAD_LETTER
    )


def test_what_the_model_reads_of_a_call_that_did_not_run_again() -> None:
    assert settled_note(None, "run:refund:A-1") is None
    assert "had already been done by an earlier call" in (settled_note("earlier_receipt", "run:refund:A-1") or "")
    assert "the tool's probe found it" in (settled_note("probe", "run:refund:A-1") or "")
