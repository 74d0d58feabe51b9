"""A task's lease timeline as a self-contained HTML page: one lane per claim generation.

Drawn from the evidence trail only (server-side SVG, no script), so the same page is what the
timeline view serves and what ``agentlease events --html`` writes for an incident review: claims,
renewals with their stage and reason, lease expiry and takeover, refused late writes, decisions
with who and why, and the receipt.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from datetime import datetime

from agentlease.enums import EventKind
from agentlease.records import LeaseEvent, TaskRecord
from agentlease.redaction import redact

PEOPLE = frozenset(
    {
        EventKind.AWAITING_APPROVAL,
        EventKind.APPROVED,
        EventKind.REJECTED,
        EventKind.RECONCILED,
        EventKind.REDRIVEN,
        EventKind.CANCELLED,
    }
)
"""Entries that record a decision (a person's, or the run parking a call for one): the top lane."""

REFUSED = frozenset({EventKind.LEASE_LOST, EventKind.LATE_UNAPPLIED})
"""Entries that record a holder write the ledger refused."""

ENDS = frozenset(
    {
        EventKind.SETTLED,
        EventKind.RELEASED,
        EventKind.DEAD_LETTERED,
        EventKind.BLOCKED,
        EventKind.NEEDS_RECONCILIATION,
        EventKind.EXPIRED,
    }
)
"""Entries that end a generation's lease."""

_WIDTH = 960
_LANE = 46
_LEFT = 150
_RIGHT = 30

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #1d1d1f; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 24px 0 8px; }
table { border-collapse: collapse; } td, th { padding: 3px 8px; border-bottom: 1px solid #e5e5ea; text-align: left; }
th { font-weight: 600; } .muted { color: #6e6e73; } a { color: #0a58ca; }
svg text { font-size: 12px; } .lane-label { font-weight: 600; }
.ev-claimed { fill: #0a58ca; } .ev-renewed { fill: #8e8e93; } .ev-settled { fill: #1e8e3e; }
.ev-expired { fill: #d93025; } .refused { fill: #d93025; stroke: #7f0000; }
.ev-released, .ev-dead_lettered, .ev-blocked, .ev-needs_reconciliation { fill: #f29900; }
.decision { fill: #6f42c1; } .lease { stroke: #0a58ca; stroke-width: 3; opacity: .35; }
"""


def _when(at: datetime) -> str:
    return at.isoformat(timespec="milliseconds")


def _who(event: LeaseEvent) -> str:
    details = event.details or {}
    return str(details.get("by") or "")


def lanes(events: Sequence[LeaseEvent]) -> list[str]:
    """The lanes of the timeline, top to bottom: ``people`` (if any decision), then one per generation."""
    generations = sorted({e.claim_generation for e in events if e.kind not in PEOPLE and e.claim_generation > 0})
    people = ["people"] if any(e.kind in PEOPLE for e in events) else []
    return people + [f"generation {g}" for g in generations]


def lane_of(event: LeaseEvent) -> str:
    if event.kind in PEOPLE or event.claim_generation == 0:
        return "people"
    return f"generation {event.claim_generation}"


def timeline_svg(events: Sequence[LeaseEvent]) -> str:
    """The SVG: a lane per generation, a bar for each held lease, a marker per entry (title = details)."""
    names = lanes(events)
    if not events:
        return '<p class="muted">No entries in the evidence trail.</p>'
    start, end = events[0].at, events[-1].at
    span_s = max((end - start).total_seconds(), 0.001)
    plot = _WIDTH - _LEFT - _RIGHT

    def x(at: datetime) -> float:
        return _LEFT + plot * (at - start).total_seconds() / span_s

    def y(lane: str) -> float:
        return 30 + _LANE * names.index(lane)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{40 + _LANE * len(names)}" '
        f'role="img" aria-label="lease timeline">'
    ]
    for lane in names:
        parts.append(
            f'<text class="lane-label" x="8" y="{y(lane) + 4:.0f}" data-lane="{html.escape(lane)}">{lane}</text>'
        )
    held: dict[int, datetime] = {}
    for event in events:
        if event.kind is EventKind.CLAIMED:
            held[event.claim_generation] = event.at
        elif event.kind in ENDS and event.claim_generation in held:
            began = held.pop(event.claim_generation)
            row = y(lane_of(event))
            parts.append(f'<line class="lease" x1="{x(began):.1f}" x2="{x(event.at):.1f}" y1="{row}" y2="{row}"/>')
    for generation, began in held.items():  # still held at the last entry
        row = y(f"generation {generation}")
        parts.append(f'<line class="lease" x1="{x(began):.1f}" x2="{x(end):.1f}" y1="{row}" y2="{row}"/>')
    for event in events:
        cx, cy = x(event.at), y(lane_of(event))
        title = html.escape(
            f"{event.kind.value} at {_when(event.at)} gen {event.claim_generation}"
            f"{f' stage {event.stage.value}' if event.stage else ''}"
            f"{f' by {_who(event)}' if _who(event) else ''}: {event.reason or ''}"
        )
        data = f'data-kind="{event.kind.value}" data-generation="{event.claim_generation}"'
        if event.kind in REFUSED:
            points = f"M{cx - 6:.1f},{cy + 6:.1f} L{cx:.1f},{cy - 7:.1f} L{cx + 6:.1f},{cy + 6:.1f} Z"
            shape = f'<path class="refused" {data} d="{points}">'
        elif event.kind in PEOPLE:
            shape = f'<rect class="decision" {data} x="{cx - 5:.1f}" y="{cy - 5:.1f}" width="10" height="10">'
        else:
            radius = 3 if event.kind is EventKind.RENEWED else 6
            shape = f'<circle class="ev-{event.kind.value}" {data} cx="{cx:.1f}" cy="{cy}" r="{radius}">'
        closing = shape.split(" ", 1)[0][1:]
        parts.append(f"{shape}<title>{title}</title></{closing}>")
    parts.append("</svg>")
    return "".join(parts)


def _rows(events: Iterable[LeaseEvent]) -> str:
    return "".join(
        "<tr data-kind='{kind}'><td>{at}</td><td>{gen}</td><td>{kind}</td><td>{stage}</td><td>{owner}</td>"
        "<td>{by}</td><td>{reason}</td><td class='trace-id'>{trace}</td></tr>".format(
            at=_when(e.at),
            gen=e.claim_generation,
            kind=e.kind.value,
            stage=e.stage.value if e.stage else "-",
            owner=html.escape(e.lease_owner or "-"),
            by=html.escape(_who(e) or "-"),
            reason=html.escape(e.reason or ""),
            trace=html.escape(e.trace.trace_id or "-"),
        )
        for e in events
    )


def timeline_page(
    task: TaskRecord,
    events: Sequence[LeaseEvent],
    *,
    temporal_ui: str | None = None,
    back: str | None = None,
    next_page: str | None = None,
    first_page: str | None = None,
) -> str:
    """The whole page for one task (self-contained: inline style, no script, no external file).

    Args:
        task: the task's record.
        events: its evidence trail, oldest first (one page of it, for the web view).
        temporal_ui: the Temporal UI's workflow page of the run, if known.
        back: a link back to the run's page.
        next_page: a link to the trail's next page, when there is more.
        first_page: a link to the trail's first page, when this is a later one.
    """
    links = []
    if back:
        links.append(f'<a href="{html.escape(back)}">the run</a>')
    if temporal_ui:
        links.append(f'<a class="temporal-ui" href="{html.escape(temporal_ui)}">the run in the Temporal UI</a>')
    if first_page:
        links.append(f'<a id="first" href="{html.escape(first_page)}">the trail from its start</a>')
    body = task_section(task, events, links=links)
    if next_page:
        body += f'<p><a id="next" href="{html.escape(next_page)}">the next entries of the trail</a></p>'
    return _document(f"lease timeline of {task.task_id}", body)


def _document(title: str, body: str) -> str:
    """A self-contained HTML document: inline style, no script, no external file."""
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>{body}</body></html>"
    )


def run_timelines_page(agent_run_id: str, tasks: Sequence[tuple[TaskRecord, Sequence[LeaseEvent]]]) -> str:
    """One self-contained page with the timeline of every task of a run (``agentlease events --run R --html``)."""
    sections = "".join(f"<section class='task'>{task_section(t, trail)}</section>" for t, trail in tasks)
    heading = f"<h1>agent run {html.escape(agent_run_id)}</h1><p class='muted'>{len(tasks)} task(s)</p>"
    return _document(f"lease timelines of {agent_run_id}", heading + sections)


def _shown(event: LeaseEvent) -> LeaseEvent:
    """``event`` as a page shows it: its reason and details redacted again (entries stored before a rule)."""
    return event.model_copy(update={"reason": redact(event.reason), "details": redact(event.details)})


def task_section(task: TaskRecord, events: Sequence[LeaseEvent], *, links: Sequence[str] = ()) -> str:
    """The body of one task's timeline: its facts, the timeline, its receipt and its evidence trail.

    What it shows passes through the redactor once more (:mod:`agentlease.redaction`): the ledger
    stores redacted text, and rows written before a rule existed are masked here too.
    """
    events = [_shown(event) for event in events]
    receipt = None if task.receipt is None else type(task.receipt).model_validate(redact(task.receipt.model_dump()))
    receipt_html = (
        "<table>"
        + "".join(
            f"<tr><th>{k}</th><td>{html.escape(str(v))}</td></tr>"
            for k, v in (
                ("system", receipt.external_system),
                ("id", receipt.external_id),
                ("status", receipt.status),
                ("verified at", _when(receipt.verified_at)),
                ("details", receipt.details),
            )
        )
        + "</table>"
        if receipt
        else '<p class="muted">No settlement receipt.</p>'
    )
    trace = f", trace <code id='trace-id'>{html.escape(task.trace.trace_id)}</code>" if task.trace.trace_id else ""
    return (
        f"<h1>{html.escape(task.task_id)}</h1>"
        f"<p class='muted'>tool {html.escape(task.tool)} ({task.side_effect_class.value}), status "
        f"<b id='status'>{task.status.value}</b>, stage {task.stage.value if task.stage else '-'}, generation "
        f"{task.claim_generation}, {task.attempts} attempt(s), lease TTL {task.lease_ttl.total_seconds():g}s, "
        f"idempotency key {html.escape(task.idempotency_key)}{trace}</p>"
        f"<p>{' | '.join(links)}</p>"
        f"<h2>Timeline</h2>{timeline_svg(events)}"
        f"<h2>Receipt</h2>{receipt_html}"
        "<h2>Evidence trail</h2><table id='trail'><tr><th>at</th><th>generation</th><th>event</th><th>stage</th>"
        f"<th>owner</th><th>by</th><th>reason</th><th>trace id</th></tr>{_rows(events)}</table>"
    )
