"""Property-based fuzz of what agentlease takes from outside: plans, ``submit`` steps and decision
payloads (a few thousand cases), through the same models and functions the workflow and the CLI use.

Every input either is refused with the project's own one-line error (a ``ValueError`` from
:func:`~agentlease.workflow._handlers.parse_payload`, a ``ConfigurationError`` from the plan reader), or is
accepted and then runnable: it survives the Temporal payload converter, every derived id and key fits
its ledger column, and the worker's own activity inputs (``ToolCall``, ``TaskSpec``,
``LedgerDecision``) validate. Never a traceback of another kind.
"""

from __future__ import annotations

import json
import math
import string
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import Table
from temporalio.contrib.pydantic import pydantic_data_converter

from agentlease import limits
from agentlease.cli.app import _run
from agentlease.cli.plans import load_plan, with_run_id
from agentlease.decisions.table import CancelRequest, DecisionRequest, LedgerDecision, ReconcileRequest
from agentlease.enums import DecisionKind, SideEffectClass
from agentlease.errors import ConfigurationError
from agentlease.ledger.tables import RECEIPTS, TASKS
from agentlease.records import (
    AgentRunPlan,
    PlanStep,
    TaskSpec,
    ToolCall,
    idempotency_key_for,
    key_part,
    run_key_prefix,
    task_id_for,
)
from agentlease.tools._registry import load_registry
from agentlease.workflow._handlers import parse_payload

FUZZ = settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
"""Cases per property: five properties of 800, one of 300 (long keys) and one of 60 through the command line."""


def _length(table: Table, column: str) -> int:
    length = getattr(table.c[column].type, "length", None)
    assert isinstance(length, int)
    return length


COLUMNS = {
    "task_id": _length(TASKS, "task_id"),
    "agent_run_id": _length(TASKS, "agent_run_id"),
    "step_id": _length(TASKS, "step_id"),
    "tool": _length(TASKS, "tool"),
    "idempotency_key": min(_length(TASKS, "idempotency_key"), _length(RECEIPTS, "idempotency_key")),
}
"""The ledger's column sizes that derived ids and keys must fit."""

TEMPORAL_PAYLOAD_BYTES = 2 * 1024 * 1024
"""Temporal refuses a payload larger than this (its default blob size limit)."""

# -- strategies ------------------------------------------------------------------------------------

hostile_text = st.one_of(
    st.text(max_size=20),
    st.text(alphabet=st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF), max_size=12),
    st.sampled_from(["", "\x00", "a\x00b", "\ud800", "x\udfff", "\n", "../x", "é", "a" * 127, "a" * 128, "a" * 300]),
    st.builds(lambda n: "k" * n, st.integers(0, 400)),
)
numbers = st.one_of(
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([float("nan"), float("inf"), -float("inf"), 2**63, -(2**63) - 1, 10**400]),
)
json_leaf = st.one_of(st.none(), st.booleans(), numbers, hostile_text)


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


json_values = st.one_of(
    st.recursive(
        json_leaf,
        lambda children: st.lists(children, max_size=4) | st.dictionaries(hostile_text, children, max_size=4),
        max_leaves=20,
    ),
    st.integers(limits.MAX_DEPTH - 2, limits.MAX_DEPTH + 40).map(_nested),
    st.integers(0, 3).map(lambda n: "x" * (limits.MAX_ARGUMENTS_BYTES - 8 + n * 8)),
)
step_ids = st.one_of(st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9_.-]{0,130}\Z"), hostile_text)
tools = st.one_of(st.sampled_from(["http_get", "sql_upsert", "quick"]), hostile_text)
steps = st.fixed_dictionaries(
    {"step_id": step_ids, "tool": tools},
    optional={
        "arguments": st.one_of(st.dictionaries(hostile_text, json_values, max_size=4), json_values),
        "idempotency_key": st.one_of(st.none(), hostile_text),
        "extra": json_leaf,
    },
)
run_ids = st.one_of(st.none(), st.from_regex(r"\A[a-z0-9-]{1,140}\Z"), hostile_text)
plans = st.one_of(
    st.fixed_dictionaries(
        {"steps": st.lists(steps, max_size=5)},
        optional={
            "agent_run_id": run_ids,
            "keep_open": st.one_of(st.booleans(), json_leaf),
            "continue_as_new_after": st.one_of(st.none(), st.integers(-2, 2000), json_leaf),
        },
    ),
    json_values,
)
decisions = st.fixed_dictionaries(
    {"step_id": step_ids, "by": hostile_text, "reason": hostile_text},
    optional={
        "action": st.sampled_from(["confirm", "retry", "abandon", "explode", ""]),
        "external_id": st.one_of(st.none(), hostile_text, st.builds(lambda n: "e" * n, st.integers(1000, 1100))),
        "observed": st.one_of(st.dictionaries(hostile_text, json_values, max_size=3), json_values),
    },
)

# -- what an accepted input must be ----------------------------------------------------------------


def _assert_one_line(exc: BaseException) -> None:
    message = str(exc)
    assert message and "\n" not in message, repr(message)


def _assert_through_temporal(value: Any, model: type[Any]) -> None:
    """The value survives the payload converter the workflow's client uses, as the model it was."""
    [payload] = pydantic_data_converter.payload_converter.to_payloads([value])
    assert len(payload.data) <= TEMPORAL_PAYLOAD_BYTES
    json.loads(payload.data, parse_constant=limits.refuse_constant)  # no NaN/Infinity on the wire
    [back] = pydantic_data_converter.payload_converter.from_payloads([payload], [model | dict[str, Any]])  # type: ignore[list-item]
    assert parse_payload(model, back, "round trip") == value


def _assert_runnable_step(step: PlanStep, run_id: str) -> None:
    task_id = task_id_for(run_id, step.step_id)
    key = step.idempotency_key or idempotency_key_for(run_id, step.step_id)
    assert len(task_id) <= COLUMNS["task_id"]
    assert len(run_id) <= COLUMNS["agent_run_id"]
    assert len(step.step_id) <= COLUMNS["step_id"]
    assert len(step.tool) <= COLUMNS["tool"]
    assert len(key) <= COLUMNS["idempotency_key"]
    for text in (task_id, key, step.tool):
        text.encode("utf-8")  # no lone surrogate
        assert "\x00" not in text
    call = ToolCall(
        task_id=task_id,
        agent_run_id=run_id,
        step_id=step.step_id,
        tool=step.tool,
        arguments=step.arguments,
        idempotency_key=key,
    )
    ToolCall.model_validate(call.model_dump(mode="json"))
    TaskSpec.of(call, SideEffectClass.IDEMPOTENT, limits_ttl())
    json.dumps(step.arguments, allow_nan=False).encode("utf-8")


def limits_ttl() -> Any:
    from datetime import timedelta

    return timedelta(seconds=15)


# -- properties ------------------------------------------------------------------------------------


@FUZZ
@given(plans)
def test_plans_are_refused_in_one_line_or_runnable(payload: Any) -> None:
    try:
        plan = parse_payload(AgentRunPlan, payload, "plan")
    except ValueError as exc:
        _assert_one_line(exc)
        return
    run_id = plan.agent_run_id or "r" * limits.MAX_RUN_ID_CHARS  # the longest id the CLI or a start may give
    if plan.agent_run_id is not None:
        limits.check_run_id(plan.agent_run_id)
    for step in plan.steps:
        _assert_runnable_step(step, run_id)
    _assert_through_temporal(plan, AgentRunPlan)


@FUZZ
@given(steps)
def test_submitted_steps_are_refused_in_one_line_or_runnable(payload: Any) -> None:
    try:
        step = parse_payload(PlanStep, payload, "submit")
    except ValueError as exc:
        _assert_one_line(exc)
        return
    _assert_runnable_step(step, "r" * limits.MAX_RUN_ID_CHARS)
    _assert_through_temporal(step, PlanStep)


@FUZZ
@given(decisions, st.sampled_from([DecisionRequest, ReconcileRequest, CancelRequest]))
def test_decisions_are_refused_in_one_line_or_recordable(payload: Any, model: type[Any]) -> None:
    if model is not ReconcileRequest:
        payload = {k: v for k, v in payload.items() if k in ("step_id", "by", "reason")}
    try:
        request = parse_payload(model, payload, "decision")
    except ValueError as exc:
        _assert_one_line(exc)
        return
    for text in (request.by, request.reason, request.step_id or "", getattr(request, "external_id", None) or ""):
        text.encode("utf-8")
        assert "\x00" not in text
    assert len(request.step_id or "") <= COLUMNS["step_id"]
    extra = {}
    if isinstance(request, ReconcileRequest):
        json.dumps(request.observed, allow_nan=False).encode("utf-8")
        extra = {"external_id": request.external_id, "observed": request.observed}
    task = TaskSpec(
        task_id="r/s",
        agent_run_id="r",
        step_id="s",
        tool="quick",
        side_effect_class=SideEffectClass.IDEMPOTENT,
        idempotency_key="r:s",
        lease_ttl=limits_ttl(),
    )
    decided = LedgerDecision(kind=DecisionKind.APPROVE, task=task, by=request.by, reason=request.reason, **extra)
    _assert_through_temporal(decided, LedgerDecision)
    _assert_through_temporal(request, model)


@FUZZ
@given(
    st.one_of(
        st.text(alphabet='[]{}":,0123456789.eE-+ \\nNaIfity', max_size=200),
        st.integers(0, 5000).map(lambda n: "[" * n + "]" * n),
        st.integers(0, 5000).map(lambda n: '{"a":' * n + "1" + "}" * n),
        st.text(max_size=50),
    )
)
@example("1E400")  # beyond a float's range: json reads it as infinity
@example("[-1e999]")
def test_json_text_is_refused_in_one_line_or_bounded(text: str) -> None:
    try:
        value = limits.loads(text, "input")
    except ValueError as exc:
        _assert_one_line(exc)
        return
    json.dumps(value, allow_nan=False)
    assert not (isinstance(value, float) and not math.isfinite(value))


@FUZZ
@given(st.one_of(hostile_text, st.from_regex(r"\A[a-z0-9-]{1,140}\Z")))
def test_run_ids_are_refused_in_one_line_or_fit(run_id: str) -> None:
    plan = AgentRunPlan(steps=[PlanStep(step_id="s" * limits.MAX_STEP_ID_CHARS, tool="quick")])
    try:
        checked = with_run_id(plan, run_id)
    except ConfigurationError as exc:
        _assert_one_line(exc)
        return
    assert checked.agent_run_id is not None
    _assert_runnable_step(checked.steps[0], checked.agent_run_id)


REGISTRY = load_registry()
SAFE_NAME = string.ascii_letters + string.digits


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(payload=plans, run_id=st.one_of(st.none(), run_ids))
def test_the_command_line_refuses_or_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], payload: Any, run_id: str | None
) -> None:
    """``agentlease run`` as a user runs it, in process: exit 2 and one line for a refused plan, or the
    run is started (here Temporal is unreachable: exit 1, one line)."""
    path = tmp_path / "plan.json"
    try:
        path.write_text(json.dumps(payload), encoding="utf-8")
    except (UnicodeEncodeError, ValueError):
        path.write_bytes(json.dumps(payload, ensure_ascii=True).encode())
    args = ["--temporal-address", "127.0.0.1:1", "run", str(path)]
    if run_id is not None and "\x00" not in run_id:
        args += ["--run-id", run_id]
    try:
        load_plan(path, REGISTRY)
        loadable = True
    except ConfigurationError as exc:
        _assert_one_line(exc)
        loadable = False
    code = _run(args)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert code in (1, 2), captured.err
    assert len(captured.err.strip().splitlines()) == 1 and captured.err.startswith("error: "), captured.err
    if not loadable:
        assert code == 2, captured.err


@settings(max_examples=300, deadline=None)
@given(
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=limits.MAX_WORKFLOW_ID_CHARS),
    st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z"),
)
def test_default_keys_of_long_workflow_ids_fit_and_stay_apart(workflow_id: str, step_id: str) -> None:
    """An adapter's workflow id may be longer than a plan's run id: its default key is digested to a key the
    downstream convention accepts, and stays apart from another run's."""
    key = idempotency_key_for(workflow_id, step_id)
    assert len(key) <= COLUMNS["idempotency_key"] and limits.is_wire_key(key)
    assert len(task_id_for(workflow_id, step_id)) <= COLUMNS["task_id"]
    assert key.startswith(run_key_prefix(workflow_id))
    part = key_part(workflow_id)
    if len(part) <= limits.MAX_RUN_ID_CHARS and len(part) + 1 + len(step_id) <= limits.MAX_WIRE_KEY_CHARS:
        assert key == f"{part}:{step_id}"
    assert key != idempotency_key_for(workflow_id + "x", step_id)
