"""The tools of the key-encoding tests: ``keyed_write``, keyed by its declared action key ``{ref}`` alone, and
``plain_write``, keyed by ``<run>:<step>``. Served in-process: :data:`WRITES` counts the effects, by run."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from agentlease.tools._wrap import leased

WRITES: dict[str, list[str]] = {}
"""Every write, by the run that asked for it: the ``ref`` it wrote (the effect a duplicate would repeat)."""


def _write(run: str, ref: str) -> dict[str, Any]:
    WRITES.setdefault(run, []).append(ref)
    return {"run": run, "ref": ref, "writes": len(WRITES[run])}


@leased(side_effect="unsafe", lease_ttl=timedelta(seconds=5), requires_approval=False, action_key="{ref}")
async def keyed_write(run: str, ref: str, amount: int, note: str = "") -> dict[str, Any]:
    """Write ``ref`` for ``run`` (once per ``ref`` in a run: the action key is the ref)."""
    return _write(run, ref)


@leased(side_effect="unsafe", lease_ttl=timedelta(seconds=5), requires_approval=False)
async def plain_write(run: str, ref: str, amount: int, note: str = "") -> dict[str, Any]:
    """Write ``ref`` for ``run`` (once per step)."""
    return _write(run, ref)
