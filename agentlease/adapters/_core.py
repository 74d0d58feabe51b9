"""One framework tool call made one leased call: the part every agent framework adapter shares (workflow code;
``docs/agents.md``). An adapter gives a declared tool, the call's arguments and the framework's stable call id, and
turns the :class:`Reply` into the framework's tool result.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel, ValidationError

    from agentlease.enums import StepEnd, TaskStatus
    from agentlease.errors import ConfigurationError, describe_validation_error
    from agentlease.records import PlanStep, settled_note
    from agentlease.tools._declaration import DeclaredTool
    from agentlease.tools._wrap import not_leasable, run_unleased
    from agentlease.workflow._calls import CallOutcome, LeasedCallError, leased_calls

StepIdFunction = Callable[[str, str], str]
"""``(tool name as the model calls it, the framework's call id) -> step id``, deterministic (workflow code)."""

ArgumentsKey = Callable[[BaseModel], str | None]
"""``(validated arguments) -> idempotency key``; ``None``: the declared action key, else ``<workflow id>:<step id>``."""

_NOT_SETTLED: dict[str, str] = {
    TaskStatus.REJECTED.value: "was refused by an operator: it did not run and will not run",
    TaskStatus.ABANDONED.value: "was abandoned by an operator after an attempt whose effect is unknown: "
    "treat it as not done; it will not run again",
    TaskStatus.CANCELLED.value: "was cancelled: it will not run again",
    TaskStatus.CANCELLED_EFFECT_UNKNOWN.value: "was cancelled after it may have reached its target: "
    "its effect is unknown; it will not run again",
    StepEnd.FAILED.value: "failed",
}
"""What the model is told of a call that ended without settling, by the task's final status."""


@dataclass(frozen=True)
class Reply:
    """What a leased call tells the model: ``output`` (JSON-able) when ``ok``, else one line in ``error``."""

    ok: bool
    output: Any = None
    error: str = ""

    def as_text(self) -> str:
        """The reply as tool text: the output as JSON, or ``error: <line>``."""
        return json.dumps(self.output) if self.ok else f"error: {self.error}"


def declared(tool: object, adapter: str) -> DeclaredTool:
    """``tool`` when it is a declared tool (``@tool`` or ``@leased``); ConfigurationError naming ``adapter`` if not."""
    if not callable(getattr(tool, "info", None)):
        raise ConfigurationError(not_leasable(tool, adapter))
    return tool  # type: ignore[return-value]


@dataclass(frozen=True)
class AdaptedTool:
    """A declared tool as a framework's tool object shows it to the model (made by :func:`adapted`).

    Attributes:
        tool: the declared tool. name / description: what the model calls it and reads.
        step_id / key: as for :func:`call_leased`.
    """

    tool: DeclaredTool
    name: str
    description: str
    step_id: StepIdFunction | None
    key: ArgumentsKey | None

    def schema(self) -> dict[str, Any]:
        """The JSON schema of the tool's arguments, what the model fills."""
        return self.tool.args_model.model_json_schema()

    async def call(self, arguments: str | dict[str, Any], call_id: str, *, exact_step_id: bool = False) -> Reply:
        """One call of the tool by the model, leased (:func:`call_leased`)."""
        return await call_leased(
            self.tool,
            arguments,
            name=self.name,
            call_id=call_id,
            step_id=self.step_id,
            exact_step_id=exact_step_id,
            key=self.key,
        )


def adapted(
    tool: object,
    adapter: str,
    *,
    name: str | None,
    description: str | None,
    step_id: StepIdFunction | None,
    key: ArgumentsKey | None,
) -> AdaptedTool:
    """``tool`` as the framework shows it: ``name`` default the tool's name, ``description`` default the tool's
    description or ``the <name> tool``. ConfigurationError naming ``adapter``: ``tool`` is not a declared tool."""
    declared_tool = declared(tool, adapter)
    shown = name or declared_tool.name
    shown_description = description or declared_tool.description or f"the {shown} tool"
    return AdaptedTool(declared_tool, shown, shown_description, step_id, key)


async def call_leased(
    tool: DeclaredTool,
    arguments: str | dict[str, Any],
    *,
    name: str,
    call_id: str,
    step_id: StepIdFunction | None = None,
    exact_step_id: bool = False,
    key: ArgumentsKey | None = None,
) -> Reply:
    """Run one framework tool call of ``tool`` as one leased call of the running workflow, until it is final.

    Args:
        arguments: the model's arguments, as JSON text or a dict; validated with the tool's argument model.
        name: the tool's name as the model calls it (in what the model is told).
        call_id: the framework's stable id of the call (the model's tool-call id).
        step_id: made from ``(name, call_id)``; default ``<name>-<call_id>``. Made valid and unique in the run
            (``-2``, ``-3``... appended) unless ``exact_step_id``, where a step id already used is refused.
        key: the idempotency key from the validated arguments, over the tool's ``action_key``.

    Returns:
        A :class:`Reply`: the settled output (``{"settled": true, "note": ..., "receipt": {...}}`` for a call that
        settled without an output in this run), or one line: bad arguments, a refused step, or how it ended
        (rejected, abandoned, cancelled, failed). Outside a workflow the function runs unleased: its output.
    """
    try:
        args = (
            tool.args_model.model_validate_json(arguments or "{}")
            if isinstance(arguments, str)
            else tool.args_model.model_validate(arguments or {})
        )
    except ValidationError as exc:
        return Reply(False, error=f"invalid arguments for {name}, nothing was run: {describe_validation_error(exc)}")
    values = args.model_dump(mode="json")
    if not workflow.in_workflow():  # a local run, a unit test, an eval: a plain call, no lease
        return Reply(True, await run_unleased(tool, dict(args)))
    info = tool.info()
    calls = leased_calls([info])
    text = step_id(name, call_id) if step_id is not None else f"{name}-{call_id}"
    sid = text if exact_step_id else calls.unique_step_id(text)
    step = {"step_id": sid, "tool": info.name, "idempotency_key": key(args) if key is not None else None}
    try:  # what the caller's step_id and key functions made, and the arguments' bounds (docs/limits.md)
        PlanStep.model_validate({**step, "arguments": values})
    except ValidationError as exc:
        return Reply(False, error=f"{name} was not run: {describe_validation_error(exc)}")
    if calls.has_step(sid):
        return Reply(False, error=f"{name} was not run: step id {sid!r} is already used in this run")
    try:
        outcome = await calls.call(info.name, values, step_id=sid, idempotency_key=step["idempotency_key"])
    except (ActivityError, LeasedCallError) as exc:  # the decision activity gave up; a refused call
        return Reply(False, error=f"{name} could not be run ({exc}); it did not settle")
    return told(name, outcome)


def told(name: str, outcome: CallOutcome) -> Reply:
    """The :class:`Reply` of a leased call that ended as ``outcome`` (see :func:`call_leased`)."""
    view = outcome.view
    if outcome.settled:
        if outcome.output is not None:
            return Reply(True, outcome.output)
        note = settled_note(view.settled_by, view.idempotency_key)
        receipt = view.receipt.model_dump(mode="json", exclude={"verified_at"}) if view.receipt is not None else None
        return Reply(True, {"settled": True, **({"note": note} if note else {}), "receipt": receipt})
    what = _NOT_SETTLED.get(view.status.value, f"ended {view.status.value}")
    return Reply(False, error=f"{name} {what}" + (f" ({view.error})" if view.error else ""))
