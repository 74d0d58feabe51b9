"""How ``agentlease advise-ttl`` shows its advice: one table per tool, then the trade-off and warnings."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from rich.table import Table

from agentlease.ttl_advice import Spread, ToolAdvice


def _spread(spread: Spread) -> str:
    if not spread.count:
        return "-"
    return f"{spread.p50:.2f} / {spread.p95:.2f} / {spread.p99:.2f} / {spread.max:.2f}"


def advice_table(advice: ToolAdvice) -> Table:
    """Per stage: gaps between renewals, stage durations (p50 / p95 / p99 / max seconds), expiries."""
    table = Table(
        title=f"{advice.tool}: lease TTL {advice.current_ttl_s:g}s, recommended {advice.recommended_ttl_s:g}s",
        title_justify="left",
    )
    for column in ("stage", "gaps between writes (s)", "time in stage (s)", "expiries"):
        table.add_column(column)
    for stage in advice.stages:
        table.add_row(stage.stage, _spread(stage.gaps), _spread(stage.durations), str(stage.expiries))
    table.add_row("all", _spread(advice.gaps), "", str(sum(s.expiries for s in advice.stages)), style="bold")
    return table


def tradeoff_lines(advice: ToolAdvice) -> list[str]:
    """One line per TTL option: recovery after a crash, renewals per minute, chance a pause expires it."""
    return [
        f"  TTL {option.ttl_s:g}s: recovery after a crash ~{option.recovery_after_crash_s:g}s, "
        f"{option.renewals_per_minute:.1f} renewals/min per lease, "
        f"{100 * option.pause_expiry_chance:.1f}% of observed gaps would have expired it"
        for option in advice.options
    ]


def advice_json(advice: list[ToolAdvice]) -> list[dict[str, Any]]:
    return [asdict(item) for item in advice]
