"""Reading plan files for ``agentlease run``: one clear error per problem."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from activities.registry import ToolRegistry
from agentlease.errors import ConfigurationError, UnknownToolError, describe_validation_error
from agentlease.records import AgentRunPlan


def load_plan(path: Path, registry: ToolRegistry) -> AgentRunPlan:
    """Read and check a plan file: JSON shape, unique step ids, known tools, valid arguments.

    Raises:
        ConfigurationError: with one line saying what is wrong and where.
    """
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigurationError(f"cannot read plan {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigurationError(f"plan {path} is not UTF-8 text: byte {exc.start} is invalid") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(
            f"plan {path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
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
