"""Idempotency keys cannot collide: run ids, step ids and action-key values are encoded in the key, the same
action always has the same key and fingerprint, and every key agentlease mints is one its own downstream
convention accepts (``docs/security.md``, "Idempotency keys"). Pure, no server."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import BaseModel

from agentlease.enums import SideEffectClass
from agentlease.idempotency.convention import parse_idempotency_key
from agentlease.limits import MAX_RUN_ID_CHARS, MAX_STEP_ID_CHARS, check_run_id, is_wire_key
from agentlease.records import (
    TaskSpec,
    ToolInfo,
    action_key_for,
    arguments_fingerprint,
    idempotency_key_for,
    run_key_prefix,
    scoped_idempotency_key,
    task_id_for,
    wire_part,
)
from agentlease.tools._binding import task_refusal
from agentlease.tools._context import LeaseContext
from agentlease.tools._declaration import ToolResult, tool


def test_ordinary_ids_keep_the_keys_they_always_had() -> None:
    assert idempotency_key_for("acme", "refund") == "acme:refund"
    assert scoped_idempotency_key("acme", "refund:A-1") == "acme:refund:A-1"
    assert scoped_idempotency_key("acme", "refund:A-1", shared=True) == "shared:refund:A-1"
    assert action_key_for("refund:{order_id}:{currency}", {"order_id": "A-1", "currency": "EUR"}) == "refund:A-1:EUR"


def test_a_run_id_with_a_colon_is_not_another_run_with_a_key() -> None:
    """Run ``acme`` keyed ``42:refund`` and run ``acme:42``'s step ``refund`` were both ``acme:42:refund``."""
    attacker = scoped_idempotency_key("acme", "42:refund")
    victim = idempotency_key_for("acme:42", "refund")
    assert attacker == "acme:42:refund"
    assert victim == "acme%3A42:refund"
    assert idempotency_key_for("50%", "x") != idempotency_key_for("50%25", "x")
    assert {idempotency_key_for("a%3Ab", "c"), idempotency_key_for("a:b", "c")} == {"a%253Ab:c", "a%3Ab:c"}


def test_action_key_values_are_escaped() -> None:
    template = "n:{a}:{b}"
    assert action_key_for(template, {"a": "x:y", "b": "z"}) == "n:x%3Ay:z"
    assert action_key_for(template, {"a": "x", "b": "y:z"}) == "n:x:y%3Az"
    assert action_key_for(template, {"a": "%3A", "b": "z"}) != action_key_for(template, {"a": ":", "b": "z"})


class Refund(BaseModel):
    order_id: str
    amount: float
    currency: str = "EUR"


@tool(side_effect="unsafe", lease_ttl=timedelta(seconds=5), action_key="refund:{order_id}:{amount}")
async def refund(ctx: LeaseContext, args: Refund) -> ToolResult:
    raise NotImplementedError


def test_the_same_action_has_the_same_key_and_fingerprint() -> None:
    """A defaulted argument left out, or ``100.0`` for ``100``, is the same action: same key, same fingerprint."""
    info = refund.info()
    asked = [
        {"order_id": "A-1", "amount": 100},
        {"order_id": "A-1", "amount": 100.0},
        {"order_id": "A-1", "amount": 100, "currency": "EUR"},
    ]
    normalized = [info.arguments_of(arguments) for arguments in asked]
    assert {info.key_for(arguments) for arguments in normalized} == {"refund:A-1:100"}
    assert len({arguments_fingerprint(arguments) for arguments in normalized}) == 1
    assert info.arguments_of({"order_id": "A-1", "amount": 100.5})["amount"] == 100.5
    assert arguments_fingerprint({"amount": 100.0}) == arguments_fingerprint({"amount": 100})
    assert info.key_for({"order_id": "A-1", "amount": 2, "currency": "USD"}) == "refund:A-1:2"


def test_a_recorded_catalog_still_reads_its_action_key_defaults() -> None:
    recorded = {
        "name": "refund",
        "side_effect_class": SideEffectClass.UNSAFE,
        "lease_ttl": timedelta(seconds=5),
        "start_to_close": timedelta(minutes=5),
        "max_attempts": 5,
        "action_key": "refund:{order_id}:{currency}",
        "action_key_defaults": {"currency": "EUR"},
    }
    assert ToolInfo.model_validate(recorded).key_for({"order_id": "A-1"}) == "refund:A-1:EUR"


def _wire(key: str) -> str:
    return parse_idempotency_key([key])


@pytest.mark.parametrize(
    ("run_id", "step_id"),
    [
        ("r" * MAX_RUN_ID_CHARS, "s" * MAX_STEP_ID_CHARS),  # 256 characters, one over the convention's 255
        ("é-run", "refund"),
        (":" * MAX_RUN_ID_CHARS, "refund"),  # 381 characters once encoded
        ("r" * 255, "refund"),  # an adapter's workflow id
    ],
)
def test_every_default_key_is_one_the_convention_accepts(run_id: str, step_id: str) -> None:
    key = idempotency_key_for(run_id, step_id)
    assert _wire(key) == key
    assert key.startswith(run_key_prefix(run_id))


@pytest.mark.parametrize(
    "key",
    ["k" * 256, "refund:ü", "x" * 200 + ":" + "y" * 200, "\u2028"],
)
@pytest.mark.parametrize("shared", [False, True])
def test_every_scoped_key_is_one_the_convention_accepts(key: str, shared: bool) -> None:
    run_id = "é" * MAX_RUN_ID_CHARS
    scoped = scoped_idempotency_key(run_id, key, shared=shared)
    assert _wire(scoped) == scoped
    assert scoped.startswith("shared:" if shared else run_key_prefix(run_id))
    assert scoped != scoped_idempotency_key(run_id, key + "!", shared=shared)


def test_a_long_action_key_value_is_digested_not_refused() -> None:
    key = action_key_for("refund:{order_id}", {"order_id": "A" * 300})
    part = wire_part(key)
    assert is_wire_key(part) and part.startswith("%sha256-") and len(part) == 40
    assert part != wire_part(action_key_for("refund:{order_id}", {"order_id": "A" * 301}))
    assert scoped_idempotency_key("acme", key) == scoped_idempotency_key("acme", part) == f"acme:{part}"


def test_a_digested_run_id_is_no_ordinary_run_id() -> None:
    """A digest's ``%`` is never an encoded run id's, so no run can name another's digested prefix."""
    digested = run_key_prefix("é")
    assert digested.startswith("%sha256-")
    assert run_key_prefix(digested[:-1]) != digested


def test_run_shared_cannot_write_shared_keys() -> None:
    with pytest.raises(ValueError, match="'shared'"):
        check_run_id("shared")
    spec = _spec("shared", "shared:x")
    assert task_refusal("shared", spec, shared_key=False) is not None


def test_a_run_id_with_a_colon_binds_to_its_encoded_keys() -> None:
    assert task_refusal("acme:42", _spec("acme:42", idempotency_key_for("acme:42", "refund")), shared_key=False) is None
    assert task_refusal("acme", _spec("acme", scoped_idempotency_key("acme", "42:refund")), shared_key=False) is None
    assert task_refusal("acme:42", _spec("acme:42", "acme:42:refund"), shared_key=False) is not None


def _spec(run_id: str, key: str) -> TaskSpec:
    return TaskSpec(
        task_id=task_id_for(run_id, "refund"),
        agent_run_id=run_id,
        step_id="refund",
        tool="refund",
        side_effect_class=SideEffectClass.UNSAFE,
        idempotency_key=key,
        lease_ttl=timedelta(seconds=5),
    )
