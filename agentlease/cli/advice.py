"""How ``agentlease advise-ttl`` shows its advice: one table per tool, then the trade-off and warnings."""

from __future__ import annotations

from dataclasses import asdict

from rich.console import Console
from rich.table import Table

from agentlease.errors import AgentLeaseError
from agentlease.recovery.ttl_advice import Spread, StageAdvice, ToolAdvice


def _spread(spread: Spread) -> str:
    if not spread.count:
        return "-"
    return f"{spread.p50:.2f} / {spread.p95:.2f} / {spread.p99:.2f} / {spread.max:.2f}"


def verdict(advice: ToolAdvice) -> str:
    """The table's title: the TTL, the recommendation or why there is none, and the sample counts."""
    counts = f"{advice.gaps.count} gaps in {advice.leases} leases"
    if advice.recommended_ttl_s is None:
        return (
            f"{advice.tool}: lease TTL {advice.current_ttl_s:g}s, no recommendation from {counts} "
            f"(needs at least {advice.min_gaps} gaps)"
        )
    return f"{advice.tool}: lease TTL {advice.current_ttl_s:g}s, recommended {advice.recommended_ttl_s:g}s ({counts})"


def advice_table(advice: ToolAdvice) -> Table:
    """Per stage: how many gaps, their p50 / p95 / p99 / max seconds, time in stage, expiries."""
    table = Table(title=verdict(advice), title_justify="left")
    for column in ("stage", "gaps", "gap p50 / p95 / p99 / max (s)", "time in stage (s)", "expiries"):
        table.add_column(column, justify="right" if column in ("gaps", "expiries") else "left")
    for stage in advice.stages:
        table.add_row(
            stage.stage, str(stage.gaps.count), _spread(stage.gaps), _spread(stage.durations), _expiries(stage)
        )
    expired = sum(s.expiries for s in advice.stages)
    alive = f" ({advice.lapsed_alive} alive)" if advice.lapsed_alive else ""
    table.add_row("all", str(advice.gaps.count), _spread(advice.gaps), "", f"{expired}{alive}", style="bold")
    return table


def _expiries(stage: StageAdvice) -> str:
    return f"{stage.expiries} ({stage.lapsed_alive} alive)" if stage.lapsed_alive else str(stage.expiries)


def tradeoff_lines(advice: ToolAdvice) -> list[str]:
    """One line per TTL option (recovery after a crash, the chance a pause expires it), then the
    warnings and, without a recommendation, how many more gaps it needs."""
    lines = [
        f"  TTL {option.ttl_s:g}s: recovery after a crash ~{option.recovery_after_crash_s:g}s, "
        f"{100 * option.pause_expiry_chance:.1f}% of observed gaps would have expired it"
        for option in advice.options
    ]
    if advice.recommended_ttl_s is None:
        lines.append(
            f"  not enough history: {advice.gaps.count} gaps between holder writes, {advice.min_gaps} needed "
            f"({advice.missing_samples} more; widen --since or let more calls run)"
        )
    return lines + [f"  warning: {warning}" for warning in advice.warnings]


def show_advice(advice: list[ToolAdvice], out: Console, *, as_json: bool) -> None:
    """Print every tool's advice (tables, or JSON); then AgentLeaseError if no tool has a recommendation."""
    if as_json:
        from agentlease.cli.render import to_json

        out.print_json(to_json([asdict(item) for item in advice]))
    else:
        for item in advice:
            out.print(advice_table(item))
            for line in tradeoff_lines(item):
                out.print(line, soft_wrap=True, markup=False)
    if all(item.recommended_ttl_s is None for item in advice):
        counts = ", ".join(f"{item.tool} has {item.gaps.count}" for item in advice)
        raise AgentLeaseError(
            f"not enough renewal history to recommend a TTL: {counts} gaps between holder writes; "
            f"a recommendation needs {advice[0].min_gaps} per tool"
        )
