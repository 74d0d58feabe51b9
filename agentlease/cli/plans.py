"""Reading plan files for ``agentlease run``: one clear error per problem."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from agentlease import limits
from agentlease.errors import ConfigurationError, UnknownToolError, describe_validation_error
from agentlease.records import AgentRunPlan
from agentlease.tools._registry import ToolRegistry


def load_plan(path: Path, registry: ToolRegistry) -> AgentRunPlan:
    """Read and check a plan file: size (at most :data:`~agentlease.limits.MAX_PLAN_BYTES` read), JSON shape
    (``docs/limits.md``), unique step ids, known tools, valid arguments. ConfigurationError: what and where."""
    try:
        raw = limits.read_file(path, limits.MAX_PLAN_BYTES)
    except OSError as exc:
        raise ConfigurationError(f"cannot read plan {path}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigurationError(f"plan {path} is not UTF-8 text: byte {exc.start} is invalid") from None
    try:
        data = limits.loads(text, f"plan {path}")
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    try:
        plan = AgentRunPlan.model_validate(data)
    except ValidationError as exc:
        raise ConfigurationError(f"plan {path} is invalid: {describe_validation_error(exc)}") from None
    if not plan.steps and not plan.keep_open:
        raise ConfigurationError(f"plan {path} has no steps")
    for index, step in enumerate(plan.steps):
        try:
            spec = registry.get(step.tool)
        except UnknownToolError as exc:
            raise ConfigurationError(f"plan {path}: step {index} ({step.step_id}): {exc}") from None
        try:
            spec.args_model.model_validate(step.arguments)
        except ValidationError as exc:
            raise ConfigurationError(
                f"plan {path}: step {index} ({step.step_id}) arguments for {step.tool}: "
                f"{describe_validation_error(exc)}"
            ) from None
    return plan


def with_run_id(plan: AgentRunPlan, agent_run_id: str) -> AgentRunPlan:
    """``plan`` with its run id set to ``agent_run_id`` (``run --run-id``); ConfigurationError for a bad id."""
    try:
        return AgentRunPlan.model_validate({**plan.model_dump(), "agent_run_id": agent_run_id})
    except ValidationError as exc:
        raise ConfigurationError(f"bad --run-id: {describe_validation_error(exc)}") from None
