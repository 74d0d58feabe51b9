"""The built-in tools' declarations and the recovery they get from the policy, as pure logic."""

from __future__ import annotations

import importlib
from datetime import timedelta

import pytest
from pydantic import ValidationError

from agentlease.enums import RecoveryAction, SideEffectClass, Stage
from agentlease.fencing import MAX_RESOURCE_KEY_LENGTH, check_resource_key
from agentlease.idempotency.convention import MAX_KEY_LENGTH
from agentlease.recovery._policy import decide
from agentlease.tools import builtin
from agentlease.tools._registry import load_registry
from agentlease.tools.builtin.http_publish import HttpPublishArgs, fenced_resource
from agentlease.tools.builtin.smtp_send import message_id_for

REGISTRY = load_registry()


def test_the_registry_keeps_the_builtins_when_a_sandbox_sets_their_submodules_on_the_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Temporal's workflow sandbox, importing ``agentlease.tools.builtin.http_get`` through, sets the package's
    ``http_get`` attribute to the submodule; the next worker of the process must still serve every built-in."""
    for name in ("http_get", "http_publish", "smtp_send", "sql_upsert"):
        monkeypatch.setattr(builtin, name, importlib.import_module(f"agentlease.tools.builtin.{name}"))
    assert load_registry().names() == ["http_get", "http_publish", "smtp_send", "sql_upsert"]


@pytest.mark.parametrize(
    ("name", "side_effect"),
    [
        ("http_get", SideEffectClass.READ_ONLY),
        ("http_publish", SideEffectClass.FENCED),
        ("sql_upsert", SideEffectClass.IDEMPOTENT),
        ("smtp_send", SideEffectClass.UNSAFE),
    ],
)
def test_every_builtin_declares_its_class_and_a_15s_lease(name: str, side_effect: SideEffectClass) -> None:
    spec = REGISTRY.get(name)
    assert (spec.side_effect_class, spec.lease_ttl) == (side_effect, timedelta(seconds=15))


@pytest.mark.parametrize("stage", [Stage.EXTERNAL_CALL, Stage.COMMIT, Stage.VERIFY])
def test_smtp_send_past_external_call_waits_for_a_decision(stage: Stage) -> None:
    """G7 for the mail tool: whatever the error, an attempt that may have sent is never retried."""
    spec = REGISTRY.get("smtp_send")
    decision = decide(
        spec.side_effect_class, stage, receipt_present=False, error_class=None, real_attempts=1, max_attempts=5
    )
    assert decision.action is RecoveryAction.RECONCILE


@pytest.mark.parametrize(
    ("stage", "action"),
    [(Stage.EXTERNAL_CALL, RecoveryAction.RETRY_SAME_KEY), (Stage.COMMIT, RecoveryAction.READ_BACK_FIRST)],
)
def test_http_publish_is_retried_with_its_key_or_read_back_first(stage: Stage, action: RecoveryAction) -> None:
    spec = REGISTRY.get("http_publish")
    decision = decide(
        spec.side_effect_class, stage, receipt_present=False, error_class=None, real_attempts=1, max_attempts=5
    )
    assert decision.action is action


def test_the_message_id_is_one_per_idempotency_key() -> None:
    assert message_id_for("run-1:notify") == message_id_for("run-1:notify")
    assert message_id_for("run-1:notify") != message_id_for("run-2:notify")
    assert message_id_for("run-1:notify").startswith("<") and message_id_for("run-1:notify").endswith(">")


def test_the_fenced_resource_of_the_longest_slug_and_key_fits_the_fence() -> None:
    longest = fenced_resource("a" * 120, "k" * MAX_KEY_LENGTH)
    assert len(longest) <= MAX_RESOURCE_KEY_LENGTH
    assert check_resource_key(longest) == longest
    HttpPublishArgs(slug="a" * 120, title="t", body="")
    with pytest.raises(ValidationError):
        HttpPublishArgs(slug="a" * 121, title="t", body="")
