"""The effect-safety benchmark's tool, its crash points, and the worker interceptor that logs attempts.

:func:`issue_refund` is one plain async function, used as it is by every side: as an activity
(``refund_activity``) for the OpenAI Agents SDK's ``activity_as_tool``, as a Pydantic AI function
tool under ``TemporalDurability``, and leased with ``agentlease.leased`` (:data:`REFUND_TOOL`,
fenced). It posts one refund to the refund service (:mod:`bench.effects_downstream`); the one line
the lease adds is the headers: inside a lease it sends ``lease.downstream_headers()`` (the
idempotency key and the fencing token), outside one nothing, as the function is written (or, for
the optional ``openai-native-keyed`` system, a key made from the activity's workflow and activity
ids, which a careful Temporal user can send).

Crash points are driven from files in ``EFFECTS_BENCH_DIR`` (set for the worker processes), one set
per trial, named by the trial's target (= its workflow id):

- ``<target>.plan`` holds the point where the trial's first attempt stops: ``before_effect``,
  ``after_effect`` (in the tool) or ``after_return`` (in :class:`EffectsInterceptor`, once the
  activity returned its result: for a leased tool, after it settled);
- the first attempt to reach the point creates ``<target>.held`` (exclusively: a retry finds it
  and runs through) and holds there, keeping its lease or its heartbeat alive, until its worker is
  killed or ``<target>.resume`` appears (a paused worker resumed); then it goes on at once. Held
  before its request, it goes on despite the cancellation Temporal delivers once it learns the
  attempt timed out, as a paused process notices nothing (generation 1 of the pause/kill matrix,
  ``tests/acceptance/matrix_tools.py``, does the same).

Every attempt start of the tool's activity, every hold and every refund request is appended to
``events.jsonl`` there (one JSON line, ``O_APPEND``), from which the benchmark measures takeovers.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
from temporalio import activity
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from agentlease import LeaseLostError, lease, leased
from agentlease.demo.agents import scripted_prompt
from agentlease.idempotency import IDEMPOTENCY_KEY_HEADER
from tests.acceptance.matrix_tools import _despite_cancellation as despite_cancellation

DOWNSTREAM_ENV = "EFFECTS_BENCH_DOWNSTREAM"
"""Base URL of the refund service, for the worker processes."""
DIR_ENV = "EFFECTS_BENCH_DIR"
"""The crash-point control directory, for the worker processes."""
NATIVE_KEY_ENV = "EFFECTS_BENCH_NATIVE_KEY"
"""Set (by ``openai-native-keyed`` workers): the native tool sends a key made from its activity."""

NATIVE_START_TO_CLOSE = timedelta(seconds=60)
"""The native tools' ``start_to_close_timeout``: Pydantic AI's default for its activities."""
LEASE_TTL = timedelta(seconds=3)
"""The lease TTL of the leased tool and the heartbeat timeout of the native ones. Default 3s."""
HTTP_TIMEOUT_S = 2.0
"""How long the tool waits for the refund service's answer (a lost response fails the attempt after it)."""
KEEP_ALIVE_S = LEASE_TTL.total_seconds() / 3
"""A holding attempt renews its lease (or heartbeats) this often."""

AFTER_RETURN = "after_return"
"""The crash point in :class:`EffectsInterceptor` (``before_effect`` and ``after_effect`` are in the tool)."""


def refund_prompt(target: str, amount_cents: int = 100) -> str:
    """The prompt of one trial (every scripted model reads it): refund ``amount_cents`` to ``target``."""
    arguments = {"target": target, "amount_cents": amount_cents}
    return scripted_prompt(f"refund {target}", [{"tool": "issue_refund", "arguments": arguments}])


def control_dir() -> Path:
    return Path(os.environ[DIR_ENV])


def log_event(event: str, target: str, **details: Any) -> None:
    """Append one line to ``events.jsonl``: what happened to ``target``, when, in which process."""
    line = json.dumps({"t": time.time(), "event": event, "target": target, "pid": os.getpid(), **details})
    fd = os.open(control_dir() / "events.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _attempt() -> int:
    return activity.info().attempt if activity.in_activity() else 0


async def _keep_alive() -> None:
    if lease.in_lease():
        await lease.renew("held at a crash point of the effect benchmark")
    elif activity.in_activity():
        activity.heartbeat("held at a crash point of the effect benchmark")


def _claim_hold(point: str, target: str) -> bool:
    """Whether this attempt holds at ``point``: it is the one planned for ``target``, and no attempt held there."""
    plan = control_dir() / f"{target}.plan"
    if not plan.exists() or plan.read_text().strip() != point:
        return False
    try:
        os.close(os.open(control_dir() / f"{target}.held", os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False  # an earlier attempt held here: this one runs through
    return True


async def _hold(point: str, target: str) -> None:
    """Keep the lease (or the heartbeat) alive until ``<target>.resume`` exists or the worker dies."""
    log_event("held", target, point=point, attempt=_attempt())
    resume = control_dir() / f"{target}.resume"
    while not resume.exists():
        try:
            await _keep_alive()
        except LeaseLostError:
            break  # the renewal under way when the worker stopped was refused after it resumed
        await asyncio.sleep(KEEP_ALIVE_S)
    log_event("resumed", target, point=point, attempt=_attempt())


async def crash_point(point: str, target: str) -> None:
    """Hold here if ``point`` is the one planned for ``target`` and no attempt held there before."""
    if _claim_hold(point, target):
        await _hold(point, target)


def _headers() -> dict[str, str]:
    """Inside a lease, its key and fencing token; outside one nothing, or (``EFFECTS_BENCH_NATIVE_KEY``) the
    key a Temporal user can make from the activity: workflow id and activity id, the same in every attempt."""
    if lease.in_lease():
        return lease.downstream_headers()
    if os.environ.get(NATIVE_KEY_ENV) and activity.in_activity():
        info = activity.info()
        return {IDEMPOTENCY_KEY_HEADER: f"{info.workflow_id}:{info.activity_id}"}
    return {}


async def _refund(target: str, amount_cents: int) -> dict[str, Any]:
    headers = _headers()
    attempt = _attempt()
    try:
        async with httpx.AsyncClient(base_url=os.environ[DOWNSTREAM_ENV], timeout=HTTP_TIMEOUT_S) as http:
            response = await http.post(f"refunds/{target}", json={"amount_cents": amount_cents}, headers=headers)
    except BaseException as exc:
        log_event("refund_failed", target, attempt=attempt, error=type(exc).__name__)
        raise
    log_event("refunded", target, attempt=attempt, status=response.status_code)
    response.raise_for_status()
    await crash_point("after_effect", target)
    answer: dict[str, Any] = response.json()
    return answer


async def _resumed_then_refund(target: str, amount_cents: int) -> dict[str, Any]:
    await _hold("before_effect", target)
    return await _refund(target, amount_cents)


async def issue_refund(target: str, amount_cents: int) -> dict[str, Any]:
    """Refund ``amount_cents`` to ``target`` at the refund service; returns the service's answer."""
    if _claim_hold("before_effect", target):
        # A paused worker notices nothing: resumed, this attempt sends its request even when Temporal
        # cancels it meanwhile (as generation 1 of the pause/kill matrix does).
        return await despite_cancellation(_resumed_then_refund(target, amount_cents))
    return await _refund(target, amount_cents)


refund_activity = activity.defn(name="issue_refund")(issue_refund)
"""The native side's activity (``activity_as_tool``)."""

REFUND_TOOL = leased(issue_refund, side_effect="fenced", lease_ttl=LEASE_TTL, name="issue_refund")
"""The leased side's tool: the same function, declared fenced, with agentlease's defaults otherwise."""


def _is_tool(activity_type: str) -> bool:
    """The refund tool's activity: ``issue_refund`` (``activity_as_tool``, leased), Pydantic AI's toolset call, or
    the LangGraph native tools node (``effects.tools``)."""
    return activity_type in ("issue_refund", "effects.tools") or activity_type.endswith("__toolset__refunds__call_tool")


class _LoggingInbound(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = activity.info()
        target = info.workflow_id  # a trial's target is its run's workflow id
        if not _is_tool(info.activity_type) or target is None:  # the model's activities
            return await super().execute_activity(input)
        log_event("started", target, attempt=info.attempt, activity_type=info.activity_type)
        result = await super().execute_activity(input)
        await crash_point(AFTER_RETURN, target)
        return result


class EffectsInterceptor(Interceptor):
    """Logs each attempt of the refund tool's activity and holds after its return when planned."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _LoggingInbound(super().intercept_activity(next))


__all__ = [
    "AFTER_RETURN",
    "DIR_ENV",
    "DOWNSTREAM_ENV",
    "LEASE_TTL",
    "NATIVE_KEY_ENV",
    "REFUND_TOOL",
    "EffectsInterceptor",
    "crash_point",
    "issue_refund",
    "log_event",
    "refund_activity",
]
