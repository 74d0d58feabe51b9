"""The replay floor of agentlease's workflow code, and every patch id still live above it (:data:`PATCHES`, until
a release raises the floor and deletes the old branch; ``docs/deployment.md``, "Upgrading workers").
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from agentlease.errors import AgentLeaseError

REPLAY_FLOOR = "0.4"
"""The oldest release whose workflow histories this code replays."""

FLOOR_MARKER = "agentlease-replay-floor-0.4"
"""The patch marker each run of a release at or above :data:`REPLAY_FLOOR` records first."""

PATCHES: dict[str, str] = {FLOOR_MARKER: "0.4.0"}
"""Every patch id agentlease's workflow code asks for, with the release that introduced it."""


class ReplayFloorError(AgentLeaseError, workflow.NondeterminismError):
    """A history recorded below :data:`REPLAY_FLOOR`: its workflow task fails, as a non-determinism error does."""


BELOW_FLOOR = (
    f"this history was recorded by agentlease < {REPLAY_FLOOR}; {REPLAY_FLOOR} replays only histories recorded "
    f"by {REPLAY_FLOOR} or later: drain runs before upgrading"
)


def at_replay_floor() -> bool:
    """Record :data:`FLOOR_MARKER` on a new run; whether the run's history holds it (workflow code)."""
    workflow.deprecate_patch(FLOOR_MARKER)
    return workflow.patched(FLOOR_MARKER)


__all__ = ["BELOW_FLOOR", "FLOOR_MARKER", "PATCHES", "REPLAY_FLOOR", "ReplayFloorError", "at_replay_floor"]
