"""Pure tests of the clock seam (agentlease/clock.py) and of the records' validation rules."""

from __future__ import annotations

import inspect
from datetime import UTC, datetime, timedelta, timezone, tzinfo

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from agentlease.clock import db_now_ms, duration_ms, from_ms, require_aware, to_ms
from agentlease.enums import SideEffectClass
from agentlease.records import (
    AgentRunPlan,
    Claim,
    PlanStep,
    SettlementReceipt,
    TaskSpec,
    idempotency_key_for,
    task_id_for,
)

NAIVE = datetime(2030, 1, 1, 12, 0, 0)
AWARE = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class _NoOffset(tzinfo):
    """A tzinfo that does not know its offset: as good as naive."""

    def utcoffset(self, dt: datetime | None) -> timedelta | None:
        return None

    def dst(self, dt: datetime | None) -> timedelta | None:
        return None

    def tzname(self, dt: datetime | None) -> str | None:
        return None


# -- clock -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("naive", [NAIVE, datetime(2030, 1, 1, tzinfo=_NoOffset())])
def test_naive_datetime_rejected(naive: datetime) -> None:
    with pytest.raises(ValueError, match="naive datetime"):
        require_aware(naive)
    with pytest.raises(ValueError, match="naive datetime"):
        to_ms(naive)
    with pytest.raises(ValueError, match="naive datetime"):
        db_now_ms("sqlite", naive)


def test_aware_datetime_passes_unchanged() -> None:
    assert require_aware(AWARE) is AWARE
    plus_two = AWARE.astimezone(timezone(timedelta(hours=2)))
    assert require_aware(plus_two) is plus_two
    assert to_ms(plus_two) == to_ms(AWARE)


aware_ms_datetimes = st.datetimes(
    min_value=datetime(1900, 1, 1),
    max_value=datetime(2200, 1, 1),
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8))]),
).map(lambda dt: dt.replace(microsecond=dt.microsecond // 1000 * 1000))


@given(aware_ms_datetimes)
def test_ms_round_trip_of_datetimes(value: datetime) -> None:
    back = from_ms(to_ms(value))
    assert back == value  # the same instant
    assert back is not None and back.utcoffset() == timedelta(0)


@given(st.integers(min_value=-(2**41), max_value=2**42))
def test_ms_round_trip_of_integers(value: int) -> None:
    back = from_ms(value)
    assert back is not None
    assert to_ms(back) == value


def test_to_ms_floors_sub_millisecond_precision() -> None:
    assert to_ms(EPOCH) == 0
    assert to_ms(EPOCH + timedelta(microseconds=1999)) == 1
    assert to_ms(EPOCH - timedelta(microseconds=1)) == -1
    assert from_ms(None) is None
    assert from_ms(1_500) == EPOCH + timedelta(seconds=1.5)


def test_duration_ms() -> None:
    assert duration_ms(timedelta(seconds=30)) == 30_000
    assert duration_ms(timedelta(milliseconds=1, microseconds=999)) == 1
    assert duration_ms(timedelta(0)) == 0


def test_db_now_ms_injected_and_dialects() -> None:
    assert db_now_ms("postgresql", AWARE).value == to_ms(AWARE)
    for dialect in ("sqlite", "postgresql"):
        assert db_now_ms(dialect) is not None
    with pytest.raises(ValueError, match="unsupported ledger dialect"):
        db_now_ms("mysql")


# -- records ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("verified_at", [NAIVE, "2030-01-01T12:00:00", datetime(2030, 1, 1, tzinfo=_NoOffset())])
def test_settlement_receipt_rejects_naive_datetime(verified_at: object) -> None:
    with pytest.raises(ValidationError, match="naive datetime"):
        SettlementReceipt(external_system="http", external_id="doc-1", status="present", verified_at=verified_at)


def test_settlement_receipt_accepts_aware_datetime_and_is_frozen() -> None:
    receipt = SettlementReceipt(external_system="http", external_id="doc-1", status="present", verified_at=AWARE)
    parsed = SettlementReceipt.model_validate(
        {"external_system": "http", "external_id": "doc-1", "status": "present", "verified_at": "2030-01-01T12:00:00Z"}
    )
    assert parsed == receipt
    assert SettlementReceipt.model_validate(receipt.model_dump(mode="json")) == receipt
    with pytest.raises(ValidationError):
        receipt.status = "absent"  # type: ignore[misc]
    with pytest.raises(ValidationError, match="extra"):
        SettlementReceipt(external_system="http", external_id="doc-1", status="present", verified_at=AWARE, surprise=1)  # type: ignore[call-arg]


def test_claim_rejects_naive_datetime() -> None:
    fields = {
        "task_id": "run/step",
        "tool": "http_get",
        "generation": 1,
        "owner": "w1",
        "acquired_at": AWARE,
        "expires_at": AWARE + timedelta(seconds=30),
        "lease_ttl": timedelta(seconds=30),
        "attempts": 1,
        "previous_stage": None,
        "previous_error_class": None,
        "idempotency_key": "run:step",
    }
    Claim(**fields)
    with pytest.raises(ValidationError, match="naive datetime"):
        Claim(**{**fields, "expires_at": NAIVE})


def test_plan_rejects_duplicate_step_ids() -> None:
    with pytest.raises(ValidationError, match="duplicate step_id 'fetch'"):
        AgentRunPlan(
            agent_run_id="run-1",
            steps=[PlanStep(step_id="fetch", tool="http.get"), PlanStep(step_id="fetch", tool="http.post")],
        )
    plan = AgentRunPlan(
        agent_run_id="run-1",
        steps=[PlanStep(step_id="fetch", tool="http.get"), PlanStep(step_id="publish", tool="http.post")],
    )
    assert [step.step_id for step in plan.steps] == ["fetch", "publish"]


@pytest.mark.parametrize(
    "step_id", ["", "-fetch", ".fetch", "_fetch", "fetch step", "a/b", "a:b", "é", "x" * 129, "\nfetch"]
)
def test_plan_rejects_bad_step_ids(step_id: str) -> None:
    with pytest.raises(ValidationError, match="step_id"):
        AgentRunPlan(agent_run_id="run-1", steps=[{"step_id": step_id, "tool": "http.get"}])


def test_plan_rejects_step_id_with_trailing_newline() -> None:
    """``$`` in a ``re.match`` pattern also matches before a final newline: use ``fullmatch``/``\\Z``.

    "fetch\\n" would become task id "run-1/fetch\\n" and idempotency key "run-1:fetch\\n",
    a different logical action from "fetch" that prints the same.
    """
    for step_id in ("fetch\n", "x" * 128 + "\n"):
        with pytest.raises(ValidationError, match="step_id"):
            PlanStep(step_id=step_id, tool="http.get")


@pytest.mark.parametrize("step_id", ["a", "9", "fetch_1.v-2", "x" * 128])
def test_plan_accepts_good_step_ids(step_id: str) -> None:
    plan = AgentRunPlan(agent_run_id="run-1", steps=[{"step_id": step_id, "tool": "http.get"}])
    assert plan.steps[0].step_id == step_id


def test_idempotency_key_is_made_of_run_and_step() -> None:
    assert idempotency_key_for("run-1", "fetch") == "run-1:fetch"
    assert task_id_for("run-1", "fetch") == "run-1/fetch"
    # G4: nothing but the run and the step goes in (no activity id, no attempt).
    assert list(inspect.signature(idempotency_key_for).parameters) == ["agent_run_id", "step_id"]
    keys = {idempotency_key_for(run, step) for run in ("run-1", "run-2") for step in ("fetch", "publish")}
    assert len(keys) == 4
    assert idempotency_key_for("run-1", "fetch") == idempotency_key_for("run-1", "fetch")


def test_task_spec_requires_positive_lease_ttl() -> None:
    fields = {
        "task_id": "run-1/fetch",
        "agent_run_id": "run-1",
        "step_id": "fetch",
        "tool": "http.get",
        "side_effect_class": SideEffectClass.READ_ONLY,
        "idempotency_key": "run-1:fetch",
    }
    assert TaskSpec(**fields, lease_ttl=timedelta(milliseconds=1)).lease_ttl == timedelta(milliseconds=1)
    for bad in (timedelta(0), timedelta(seconds=-1)):
        with pytest.raises(ValidationError, match="lease_ttl must be positive"):
            TaskSpec(**fields, lease_ttl=bad)
