"""The replay floor of agentlease's workflow code, and every patch id still live above it.

Release 0.4 replays only histories recorded by 0.4 or later (runs of 0.1-0.3 are drained before workers
are upgraded), so every run takes the newest behaviour and no old branch is kept. Each run records
:data:`FLOOR_MARKER` when it makes its leased calls' state (:func:`at_replay_floor`): ``deprecate_patch``
writes it on every new run (no ``patch_activation_callback`` declines it, and a later release may stop
asking for it without failing these histories); ``patched``, asked next for the same id, answers from the
SDK's memo of that call: false only on a replay of a history without the marker, whose workflow task then
fails with :class:`ReplayFloorError`, one line naming the floor (``docs/operator-views.md``, "Replay floor").

A later change of workflow behaviour asks ``workflow.patched`` for an id listed in :data:`PATCHES` with the
release that introduced it, until a release raises the floor above it and deletes its old branch.
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
    """A history recorded below :data:`REPLAY_FLOOR`: its workflow task fails (as a non-determinism error
    does) until a worker of the release that recorded it takes the run."""


BELOW_FLOOR = (
    f"this history was recorded by agentlease < {REPLAY_FLOOR}; {REPLAY_FLOOR} replays only histories recorded "
    f"by {REPLAY_FLOOR} or later: drain runs before upgrading"
)


def at_replay_floor() -> bool:
    """Record :data:`FLOOR_MARKER` on a new run; whether the run's history holds it (false: the history was
    recorded by a release below :data:`REPLAY_FLOOR`, and the run must fail its workflow task with
    :class:`ReplayFloorError` before it issues a command). Call it from workflow code."""
    workflow.deprecate_patch(FLOOR_MARKER)
    return workflow.patched(FLOOR_MARKER)


__all__ = ["BELOW_FLOOR", "FLOOR_MARKER", "PATCHES", "REPLAY_FLOOR", "ReplayFloorError", "at_replay_floor"]
