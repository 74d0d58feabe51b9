"""The recovery policy over the full cross product of its inputs, against the two recovery tables
of ``docs/recovery.md`` written down as data, plus its invariants."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from agentlease.enums import ErrorClass, RecoveryAction, SideEffectClass, Stage
from agentlease.errors import (
    AmbiguousSideEffectError,
    CredentialToolError,
    PermanentToolError,
    RetryableToolError,
)
from agentlease.recovery._policy import classify, decide

STAGES: list[Stage | None] = [None, *Stage]
ERRORS: list[ErrorClass | None] = [None, *ErrorClass]
MAX_ATTEMPTS = 3


def _all_inputs() -> itertools.product:
    return itertools.product(SideEffectClass, STAGES, [False, True], ERRORS, range(MAX_ATTEMPTS + 2))


def _decide(cls: SideEffectClass, stage: Stage | None, receipt: bool, error: ErrorClass | None, attempts: int):
    return decide(
        cls, stage, receipt_present=receipt, error_class=error, real_attempts=attempts, max_attempts=MAX_ATTEMPTS
    )


@dataclass(frozen=True)
class Attempt:
    """What the policy knows of the previous attempt."""

    cls: SideEffectClass
    stage: Stage | None
    receipt: bool
    error: ErrorClass | None
    attempts: int

    @property
    def crossed_external_call(self) -> bool:
        return self.stage in (Stage.EXTERNAL_CALL, Stage.COMMIT, Stage.VERIFY, Stage.SETTLED)


STAGE_TABLE = {
    # docs/recovery.md, "Stage-aware retry": last durable stage -> default next step.
    Stage.PREFLIGHT: RecoveryAction.RETRY,
    Stage.EXTERNAL_CALL: RecoveryAction.RETRY_SAME_KEY,
    Stage.COMMIT: RecoveryAction.READ_BACK_FIRST,
    Stage.VERIFY: RecoveryAction.RETRY_READBACK,
    Stage.SETTLED: RecoveryAction.NEVER_RERUN,
}

CLASSIFICATION: list[tuple[str, Callable[[Attempt], bool], RecoveryAction]] = [
    # docs/recovery.md, "Recovery classification", with the precedence "How decide() combines them"
    # gives: what is settled or decided by a person first, then the side-effect class, then limits.
    ("settled: a receipt exists", lambda a: a.receipt or a.stage is Stage.SETTLED, RecoveryAction.NEVER_RERUN),
    ("human cancellation", lambda a: a.error is ErrorClass.CANCELLED, RecoveryAction.STAY_CANCELLED),
    ("missing or revoked credential", lambda a: a.error is ErrorClass.CREDENTIAL, RecoveryAction.BLOCK),
    (
        "a person reconciled it with retry",
        lambda a: a.error is ErrorClass.OPERATOR_RETRY,
        RecoveryAction.RETRY_SAME_KEY,
    ),
    (
        "the downstream holds the key in doubt",
        lambda a: a.error is ErrorClass.IN_DOUBT,
        RecoveryAction.RECONCILE,
    ),
    (
        "ambiguous non-idempotent side effect",
        lambda a: a.cls is SideEffectClass.UNSAFE and a.crossed_external_call,
        RecoveryAction.RECONCILE,
    ),
    ("deterministic failure", lambda a: a.error is ErrorClass.PERMANENT, RecoveryAction.DEAD_LETTER),
    (
        "attempts spent after the call may have reached the downstream",
        lambda a: a.attempts >= MAX_ATTEMPTS and a.cls is not SideEffectClass.READ_ONLY and a.crossed_external_call,
        RecoveryAction.RECONCILE,
    ),
    ("repeated failure", lambda a: a.attempts >= MAX_ATTEMPTS, RecoveryAction.DEAD_LETTER),
    ("nothing ran before", lambda a: a.stage is None and a.attempts == 0, RecoveryAction.RUN),
    ("read-only work: reclaim", lambda a: a.cls is SideEffectClass.READ_ONLY, RecoveryAction.RETRY),
]


def oracle(attempt: Attempt) -> RecoveryAction:
    """The first classification row that applies, else the stage table (no stage counts as preflight)."""
    for _, applies, action in CLASSIFICATION:
        if applies(attempt):
            return action
    return STAGE_TABLE[attempt.stage or Stage.PREFLIGHT]


@pytest.mark.parametrize("inputs", list(_all_inputs()), ids=lambda i: "-".join(str(p) for p in i))
def test_every_input_follows_the_recovery_tables(inputs: tuple) -> None:
    decision = _decide(*inputs)
    assert decision.action is oracle(Attempt(*inputs))
    assert decision.rule


def test_the_tables_cover_every_stage_and_every_row_is_reached() -> None:
    assert set(STAGE_TABLE) == set(Stage)
    reached = {
        next((name for name, applies, _ in CLASSIFICATION if applies(Attempt(*i))), "stage table")
        for i in _all_inputs()
    }
    assert reached == {name for name, _, _ in CLASSIFICATION} | {"stage table"}


@pytest.mark.parametrize(
    ("stage", "action"),
    [
        (Stage.PREFLIGHT, RecoveryAction.RETRY),
        (Stage.EXTERNAL_CALL, RecoveryAction.RETRY_SAME_KEY),
        (Stage.COMMIT, RecoveryAction.READ_BACK_FIRST),
        (Stage.VERIFY, RecoveryAction.RETRY_READBACK),
        (Stage.SETTLED, RecoveryAction.NEVER_RERUN),
    ],
)
def test_stage_table_rows(stage: Stage, action: RecoveryAction) -> None:
    """Seed 2, "Retry policy belongs to the stage", for an idempotent tool."""
    decision = _decide(SideEffectClass.IDEMPOTENT, stage, False, ErrorClass.RETRYABLE, 1)
    assert decision.action is action


def test_recovery_table_rows() -> None:
    """Seed 1, "Recovery needs a policy"."""
    assert _decide(SideEffectClass.READ_ONLY, Stage.VERIFY, False, None, 1).action is RecoveryAction.RETRY
    assert _decide(SideEffectClass.IDEMPOTENT, Stage.EXTERNAL_CALL, False, None, 1).action is (
        RecoveryAction.RETRY_SAME_KEY
    )
    assert _decide(SideEffectClass.UNSAFE, Stage.EXTERNAL_CALL, False, ErrorClass.AMBIGUOUS, 1).action is (
        RecoveryAction.RECONCILE
    )
    assert _decide(SideEffectClass.FENCED, Stage.PREFLIGHT, False, ErrorClass.RETRYABLE, MAX_ATTEMPTS).action is (
        RecoveryAction.DEAD_LETTER
    )
    assert _decide(SideEffectClass.IDEMPOTENT, Stage.PREFLIGHT, False, ErrorClass.CREDENTIAL, 1).action is (
        RecoveryAction.BLOCK
    )
    assert _decide(SideEffectClass.IDEMPOTENT, Stage.COMMIT, False, ErrorClass.CANCELLED, 1).action is (
        RecoveryAction.STAY_CANCELLED
    )


@given(
    cls=st.sampled_from(list(SideEffectClass)),
    stage=st.sampled_from(STAGES),
    receipt=st.booleans(),
    error=st.sampled_from(ERRORS),
    attempts=st.integers(min_value=0, max_value=50),
    limit=st.integers(min_value=1, max_value=50),
)
def test_properties(
    cls: SideEffectClass, stage: Stage | None, receipt: bool, error: ErrorClass | None, attempts: int, limit: int
) -> None:
    decision = decide(
        cls, stage, receipt_present=receipt, error_class=error, real_attempts=attempts, max_attempts=limit
    )
    crossed = stage is not None and stage.order >= Stage.EXTERNAL_CALL.order
    # G7: an unsafe tool that may have crossed external_call never runs again without a decision.
    if cls is SideEffectClass.UNSAFE and crossed and error is not ErrorClass.OPERATOR_RETRY:
        assert not decision.action.runs_tool
    # G6: settled never reruns.
    if receipt or stage is Stage.SETTLED:
        assert decision.action is RecoveryAction.NEVER_RERUN
    # The limit of real attempts holds (a person's retry decision is one more, deliberate attempt).
    if attempts >= limit and error is not ErrorClass.OPERATOR_RETRY:
        assert not decision.action.runs_tool


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError):
        decide(
            SideEffectClass.READ_ONLY, None, receipt_present=False, error_class=None, real_attempts=0, max_attempts=0
        )
    with pytest.raises(ValueError):
        decide(
            SideEffectClass.READ_ONLY, None, receipt_present=False, error_class=None, real_attempts=-1, max_attempts=1
        )


class _Args(BaseModel):
    n: int


def test_classify_tool_errors() -> None:
    try:
        _Args.model_validate({"n": "x"})
    except ValidationError as invalid:
        assert classify(invalid) is ErrorClass.PERMANENT
    assert classify(PermanentToolError("404")) is ErrorClass.PERMANENT
    assert classify(CredentialToolError("token revoked")) is ErrorClass.CREDENTIAL
    assert classify(AmbiguousSideEffectError("timeout after send")) is ErrorClass.AMBIGUOUS
    assert classify(RetryableToolError("503")) is ErrorClass.RETRYABLE
    assert classify(ConnectionResetError()) is ErrorClass.RETRYABLE
    assert ErrorClass.parse("shutdown") is ErrorClass.SHUTDOWN
    assert ErrorClass.parse("ConnectError") is None
    assert ErrorClass.parse(None) is None
