"""A task's lease timeline as a self-contained HTML page (server-side SVG, no script), one lane per claim
generation, drawn from the evidence trail only (``docs/web-view.md``)."""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agentlease.enums import EventKind
from agentlease.records import LeaseEvent, TaskRecord
from agentlease.security.redaction import redact

PEOPLE = frozenset(map(EventKind, ("awaiting_approval", "approved", "rejected", "reconciled", "redriven", "cancelled")))
"""Entries that record a decision (a person's, or the run parking a call for one): the top lane."""

REFUSED = frozenset({EventKind.LEASE_LOST, EventKind.LATE_UNAPPLIED})
"""Entries that record a holder write the ledger refused."""

ENDS = frozenset(map(EventKind, ("settled", "released", "dead_lettered", "blocked", "needs_reconciliation", "expired")))
"""Entries that end a generation's lease."""

_WIDTH = 960
_LANE = 46
_LEFT = 150
_RIGHT = 30

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #1d1d1f; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 24px 0 8px; }
table { border-collapse: collapse; } td, th { padding: 3px 8px; border-bottom: 1px solid #e5e5ea; text-align: left; }
th { font-weight: 600; } .muted { color: #6e6e73; } a { color: #0a58ca; }
svg text { font-size: 12px; } .lane-label { font-weight: 600; }
.ev-claimed { fill: #0a58ca; } .ev-renewed { fill: #8e8e93; } .ev-settled { fill: #1e8e3e; }
.ev-expired { fill: #d93025; } .refused, .legend-refused { fill: #d93025; stroke: #7f0000; }
.ev-released, .ev-dead_lettered, .ev-blocked, .ev-needs_reconciliation { fill: #f29900; }
.decision { fill: #6f42c1; } .lease { stroke: #0a58ca; stroke-width: 3; opacity: .35; }
.axis { stroke: #c7c7cc; } .tick { fill: #6e6e73; font-size: 11px; } .marker-label { font-size: 11px; }
.refused-label { fill: #b3261e; font-weight: 600; } .decision-label { fill: #6f42c1; }
.span { opacity: .55; } .span-label { font-size: 10px; fill: #1d1d1f; }
.stage-preflight { fill: #9ec5fe; } .stage-external_call { fill: #fecba1; } .stage-commit { fill: #a3cfbb; }
.stage-verify { fill: #c5b3e6; } .stage-none { fill: #dee2e6; } .stage-settled { fill: #75b798; }
.legend { list-style: none; padding: 0; display: flex; flex-wrap: wrap; gap: 14px; }
.legend svg { vertical-align: middle; } .holder { font-size: 15px; } .refusal { color: #b3261e; }
.waiting td { background: #fff4e5; } code { font-size: 12px; } .pill { padding: 1px 6px; border-radius: 8px; }
.status-waiting { background: #ffe8cc; } .status-running { background: #d0e7ff; }
.status-tasks_final { background: #d3f0dc; } .status-failed { background: #f8d7da; }
.run-error { color: #b3261e; font-size: 12px; } form.filters { margin: 8px 0 16px; }
form.filters label { margin-right: 10px; }
"""
"""The pages' stylesheet: inline in an exported page, ``/static/ui.css`` in the web view (its CSP)."""


def _when(at: datetime) -> str:
    return at.isoformat(timespec="milliseconds")


def _who(event: LeaseEvent) -> str:
    return str((event.details or {}).get("by") or "")


def lanes(events: Sequence[LeaseEvent]) -> list[str]:
    """The lanes of the timeline, top to bottom: ``people`` (if any decision), then one per generation."""
    generations = sorted({e.claim_generation for e in events if e.kind not in PEOPLE and e.claim_generation > 0})
    people = ["people"] if any(e.kind in PEOPLE for e in events) else []
    return people + [f"generation {g}" for g in generations]


def lane_of(event: LeaseEvent) -> str:
    if event.kind in PEOPLE or event.claim_generation == 0:
        return "people"
    return f"generation {event.claim_generation}"


def _stage_spans(
    events: Sequence[LeaseEvent], generation: int, until: datetime
) -> list[tuple[str, datetime, datetime, int]]:
    """One generation's stage spans: ``(stage, from, to, renewals folded in)``, from its claim to its end."""
    spans: list[tuple[str, datetime, datetime, int]] = []
    current: str | None = None
    began: datetime | None = None
    renewals = 0
    for event in events:
        if event.claim_generation != generation or event.kind in PEOPLE:
            continue
        if event.kind is EventKind.CLAIMED:
            current, began, renewals = "none", event.at, 0
            continue
        if began is None or current is None:
            continue
        if event.kind in ENDS or event.kind in REFUSED:
            spans.append((current, began, event.at, renewals))
            current = began = None
            continue
        stage = event.stage.value if event.stage else current
        if event.kind is EventKind.RENEWED and stage == current:
            renewals += 1
            continue
        if stage != current:
            spans.append((current, began, event.at, renewals))
            current, began, renewals = stage, event.at, 1 if event.kind is EventKind.RENEWED else 0
    if began is not None and current is not None:
        spans.append((current, began, until, renewals))
    return spans


def _marker_label(event: LeaseEvent) -> str | None:
    """The text beside a marker that needs one: refused writes, decisions, takeovers, the settle."""
    if event.kind in REFUSED:
        operation = str((event.details or {}).get("operation") or "write")
        return f"refused {operation}" if event.kind is EventKind.LEASE_LOST else f"late {operation} refused"
    if event.kind in PEOPLE:
        who = _who(event)
        return f"{event.kind.value}{f' by {who}' if who else ''}"
    if event.kind in (EventKind.EXPIRED, EventKind.SETTLED, EventKind.DEAD_LETTERED, EventKind.CLAIMED):
        return event.kind.value.replace("_", " ")
    return None


_LABEL_ROW = 12
"""Pixels between two rows of marker labels of one lane."""
_LABEL_ROWS = 3
"""Rows of marker labels a lane takes on each side before labels may overlap."""
_CHAR_PX = 6.2
"""About the width of one character of a marker label (11px system font), to keep labels apart."""


@dataclass(frozen=True)
class _Label:
    event: LeaseEvent
    text: str
    above: bool
    anchor: str
    row: int


def _place_labels(events: Sequence[LeaseEvent], x: Callable[[datetime], float], flip_at: float) -> list[_Label]:
    """The marker labels, each on the first row of its lane and side (refused writes above) where it overlaps no
    label placed before; one repeating a text already there is left out."""
    placed: dict[tuple[str, bool, int], list[tuple[float, float, str]]] = {}
    labels = []
    for event in events:
        text = None if event.kind is EventKind.RENEWED else _marker_label(event)
        if not text:
            continue
        cx = x(event.at)
        above = event.kind in REFUSED
        anchor = "end" if cx > flip_at else "start"
        width = len(text) * _CHAR_PX + 4
        x1, x2 = (cx - width, cx) if anchor == "end" else (cx, cx + width)
        lane = lane_of(event)
        for row in range(_LABEL_ROWS):
            clashes = [t for a, b, t in placed.get((lane, above, row), []) if a < x2 and x1 < b]
            if not clashes or text in clashes:
                break
        if text in clashes:
            continue
        placed.setdefault((lane, above, row), []).append((x1, x2, text))
        labels.append(_Label(event, text, above, anchor, row))
    return labels


def _tick(offset_s: float, span_s: float) -> str:
    """A time axis label: milliseconds for a span under a second, else seconds."""
    if span_s < 1:
        return f"+{offset_s * 1000:.0f}ms"
    return f"+{offset_s:.1f}s" if span_s < 60 else f"+{offset_s:.0f}s"


def timeline_svg(events: Sequence[LeaseEvent]) -> str:
    """The SVG: a time axis, a lane per generation with its stage spans (renewals folded in), a labelled marker
    per claim, end, refused write and decision (title = details)."""
    names = lanes(events)
    if not events:
        return '<p class="muted">No entries in the evidence trail.</p>'
    start, end = events[0].at, events[-1].at
    span_s = max((end - start).total_seconds(), 0.001)
    plot = _WIDTH - _LEFT - _RIGHT

    def x(at: datetime) -> float:
        return _LEFT + plot * (at - start).total_seconds() / span_s

    labels = _place_labels(events, x, _LEFT + plot * 0.8)

    def rows(lane: str, above: bool) -> int:
        return max([lb.row for lb in labels if lb.above is above and lane_of(lb.event) == lane], default=0)

    centres: dict[str, float] = {}
    at = 30.0
    for index, lane in enumerate(names):
        at += _LABEL_ROW * rows(lane, True)
        centres[lane] = at
        at += _LANE + _LABEL_ROW * rows(lane, False) if index < len(names) - 1 else 0
    axis_y = at + 54 + (_LABEL_ROW * rows(names[-1], False) if names else 0)
    height = axis_y + 36

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{height:.0f}" '
        f'role="img" aria-label="lease timeline">'
    ]
    parts.append(f'<line class="axis" x1="{_LEFT}" x2="{_LEFT + plot}" y1="{axis_y}" y2="{axis_y}" stroke="#c7c7cc"/>')
    for tick in range(6):
        tx = _LEFT + plot * tick / 5
        parts.append(
            f'<line class="axis" x1="{tx:.1f}" x2="{tx:.1f}" y1="{axis_y - 4}" y2="{axis_y + 4}" stroke="#c7c7cc"/>'
            f'<text class="tick" x="{tx:.1f}" y="{axis_y + 16}" text-anchor="middle">'
            f"{_tick(span_s * tick / 5, span_s)}</text>"
        )
    parts.append(f'<text class="tick" x="{_LEFT}" y="{axis_y + 31}">from {html.escape(_when(start))}</text>')
    for lane in names:
        parts.append(
            f'<text class="lane-label" x="8" y="{centres[lane] + 4:.0f}" data-lane="{html.escape(lane)}">{lane}</text>'
        )
    for lane in names:
        if not lane.startswith("generation "):
            continue
        generation = int(lane.split(" ", 1)[1])
        row = centres[lane]
        for stage, began, until, renewals in _stage_spans(events, generation, end):
            x1, x2 = x(began), max(x(until), x(began) + 2)
            title = html.escape(f"{stage} from {_when(began)} to {_when(until)}, {renewals} renewal(s)")
            parts.append(
                f'<rect class="span stage-{html.escape(stage)}" data-stage="{html.escape(stage)}" '
                f'data-renewals="{renewals}" x="{x1:.1f}" y="{row - 8}" width="{x2 - x1:.1f}" height="16">'
                f"<title>{title}</title></rect>"
            )
            if x2 - x1 > 60:
                label = f"{stage}{f' ({renewals} renewals)' if renewals else ''}"
                parts.append(f'<text class="span-label" x="{x1 + 3:.1f}" y="{row + 4}">{html.escape(label)}</text>')
    for event in events:
        if event.kind is EventKind.RENEWED:
            continue  # folded into its stage span
        cx, cy = x(event.at), centres[lane_of(event)]
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
            shape = f'<circle class="ev-{event.kind.value}" {data} cx="{cx:.1f}" cy="{cy}" r="6">'
        closing = shape.split(" ", 1)[0][1:]
        parts.append(f"{shape}<title>{title}</title></{closing}>")
    for placed in labels:
        event = placed.event
        kind = "refused-label" if event.kind in REFUSED else "decision-label" if event.kind in PEOPLE else ""
        cy = centres[lane_of(event)]
        ty = cy - 11 - _LABEL_ROW * placed.row if placed.above else cy + 19 + _LABEL_ROW * placed.row
        parts.append(
            f'<text class="marker-label {kind}" x="{x(event.at):.1f}" y="{ty:.0f}" '
            f'text-anchor="{placed.anchor}">{html.escape(placed.text)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


_LEGEND = (
    '<ul class="legend" id="legend">'
    '<li><svg width="14" height="14"><circle class="ev-claimed" cx="7" cy="7" r="6"/></svg> claimed</li>'
    '<li><svg width="14" height="14"><circle class="ev-settled" cx="7" cy="7" r="6"/></svg> settled</li>'
    '<li><svg width="14" height="14"><circle class="ev-expired" cx="7" cy="7" r="6"/></svg> lease expired</li>'
    '<li><svg width="14" height="14"><circle class="ev-released" cx="7" cy="7" r="6"/></svg>'
    " released / dead-lettered / blocked</li>"
    '<li><svg width="14" height="14"><path class="legend-refused" d="M1,13 L7,1 L13,13 Z"/></svg>'
    " write refused (lease lost, late result)</li>"
    '<li><svg width="14" height="14"><rect class="decision" x="2" y="2" width="10" height="10"/></svg>'
    " a person's decision</li>"
    + "".join(
        f'<li><svg width="22" height="12"><rect class="span stage-{s}" width="22" height="12"/></svg> {s}</li>'
        for s in ("none", "preflight", "external_call", "commit", "verify")
    )
    + "<li class='muted'>renewals are folded into their stage's span (hover for counts)</li></ul>"
)


def _generations(task: TaskRecord, events: Sequence[LeaseEvent]) -> str:
    """One row per claim generation: owner, claimed at, last renewal, how it ended, what of it was refused."""
    rows = []
    for generation in sorted({e.claim_generation for e in events if e.claim_generation > 0 and e.kind not in PEOPLE}):
        own = [e for e in events if e.claim_generation == generation and e.kind not in PEOPLE]
        claimed = next((e for e in own if e.kind is EventKind.CLAIMED), None)
        renewed = [e for e in own if e.kind is EventKind.RENEWED]
        ended = next((e for e in own if e.kind in ENDS), None)
        refused = [e for e in own if e.kind in REFUSED]
        owner = (claimed or own[0]).lease_owner or "-"
        if ended is not None:
            how = f"{ended.kind.value} at {_when(ended.at)}" + (f": {ended.reason}" if ended.reason else "")
        elif generation == task.claim_generation and not task.status.is_terminal:
            how = "holds the lease"
        else:
            how = "-"
        refusals = "<br>".join(
            f"<span class='refusal'>{html.escape(_marker_label(e) or e.kind.value)} at {_when(e.at)}: "
            f"{html.escape(e.reason or '')}{html.escape(_downstream(e))}</span>"
            for e in refused
        )
        rows.append(
            f"<tr data-gen='{generation}'><td>{generation}</td><td class='owner'>{html.escape(owner)}</td>"
            f"<td class='claimed-at'>{_when(claimed.at) if claimed else '-'}</td>"
            f"<td>{_when(renewed[-1].at) if renewed else '-'} ({len(renewed)} renewal(s))</td>"
            f"<td>{html.escape(how)}</td><td class='refused-writes'>{refusals or '-'}</td></tr>"
        )
    return (
        "<table id='generations'><tr><th>generation</th><th>owner</th><th>claimed at</th><th>last renewal</th>"
        f"<th>how it ended</th><th>refused</th></tr>{''.join(rows)}</table>"
    )


def _downstream(event: LeaseEvent) -> str:
    """The downstream's own refusal of a late write, when the trail recorded it."""
    details = event.details or {}
    said = details.get("downstream") or details.get("downstream_refusal") or details.get("error")
    return f" (downstream: {said})" if said else ""


def _decisions(events: Sequence[LeaseEvent]) -> str:
    decided = [e for e in events if e.kind in PEOPLE]
    if not decided:
        return ""
    rows = "".join(
        f"<tr data-decision='{e.kind.value}'><td>{_when(e.at)}</td><td>{e.kind.value}</td>"
        f"<td class='by'>{html.escape(_who(e) or '-')}</td><td>{html.escape(e.reason or '')}</td></tr>"
        for e in decided
    )
    return (
        "<h2>Decisions</h2><table id='decisions'><tr><th>at</th><th>decision</th><th>by</th><th>why</th></tr>"
        f"{rows}</table>"
    )


def last_holder(task: TaskRecord, events: Sequence[LeaseEvent]) -> tuple[str | None, datetime | None]:
    """Who held the task's latest generation and when it claimed: the task row while held, else the trail's
    claim of that generation (a release or park clears the row's). ``(None, None)``: never claimed or not seen."""
    if task.lease_owner:
        return task.lease_owner, task.lease_acquired_at
    claims = [e for e in events if e.kind is EventKind.CLAIMED and e.claim_generation == task.claim_generation]
    if not claims or task.claim_generation == 0:
        return None, None
    return claims[-1].lease_owner, claims[-1].at


def holder_line(task: TaskRecord, events: Sequence[LeaseEvent] = ()) -> str:
    """Who holds the task, since and until when, at which generation (or who held it last: :func:`last_holder`)."""
    holder, claimed_at = last_holder(task, events)
    owner = html.escape(holder or "-")
    since = _when(claimed_at) if claimed_at else "-"
    if task.status.value == "running" and task.lease_owner:
        until = _when(task.lease_expires_at) if task.lease_expires_at else "-"
        return (
            f"<p class='holder' id='holder'>held by <b>{owner}</b> since {since} until {until}, "
            f"generation <b>{task.claim_generation}</b></p>"
        )
    last = f", last held by <b>{owner}</b> (claimed {since})" if holder else ""
    return (
        f"<p class='holder' id='holder'>not held: {task.status.value} at generation "
        f"<b>{task.claim_generation}</b>{last}</p>"
    )


def _rows(events: Iterable[LeaseEvent]) -> str:
    return "".join(
        f"<tr data-kind='{e.kind.value}'><td>{_when(e.at)}</td><td>{e.claim_generation}</td><td>{e.kind.value}</td>"
        f"<td>{e.stage.value if e.stage else '-'}</td><td>{html.escape(e.lease_owner or '-')}</td>"
        f"<td>{html.escape(_who(e) or '-')}</td><td>{html.escape(e.reason or '')}</td>"
        f"<td class='trace-id'>{html.escape(e.trace.trace_id or '-')}</td></tr>"
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
    stylesheet: str | None = None,
    refresh_s: int | None = None,
) -> str:
    """The whole page for ``task`` and ``events`` (its trail, oldest first; a page of it): self-contained unless
    ``stylesheet`` is linked instead, reloading every ``refresh_s`` if given, with links to the Temporal UI, the
    run (``back``) and the trail's ``next_page`` and ``first_page`` when given."""
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
    return html_document(f"lease timeline of {task.task_id}", body, stylesheet=stylesheet, refresh_s=refresh_s)


def html_document(title: str, body: str, *, stylesheet: str | None = None, refresh_s: int | None = None) -> str:
    """An HTML document without script: the style inline (self-contained) or linked (``stylesheet``)."""
    style = f"<link rel='stylesheet' href='{html.escape(stylesheet)}'>" if stylesheet else f"<style>{STYLE}</style>"
    refresh = f"<meta http-equiv='refresh' content='{refresh_s}'>" if refresh_s else ""
    return (
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'>{refresh}"
        f"<title>{html.escape(title)}</title>{style}</head><body>{body}</body></html>"
    )


def run_timelines_page(agent_run_id: str, tasks: Sequence[tuple[TaskRecord, Sequence[LeaseEvent]]]) -> str:
    """One self-contained page with the timeline of every task of a run (``agentlease events --run R --html``)."""
    sections = "".join(f"<section class='task'>{task_section(t, trail)}</section>" for t, trail in tasks)
    heading = f"<h1>agent run {html.escape(agent_run_id)}</h1><p class='muted'>{len(tasks)} task(s)</p>"
    return html_document(f"lease timelines of {agent_run_id}", heading + sections)


def _shown(event: LeaseEvent) -> LeaseEvent:
    """``event`` as a page shows it: its reason and details redacted again (entries stored before a rule)."""
    return event.model_copy(update={"reason": redact(event.reason), "details": redact(event.details)})


def task_section(task: TaskRecord, events: Sequence[LeaseEvent], *, links: Sequence[str] = ()) -> str:
    """The body of one task's timeline: facts, timeline, receipt, evidence trail; redacted once more (rows
    written before a rule existed are masked here too)."""
    events = [_shown(event) for event in events]
    receipt = None if task.receipt is None else type(task.receipt).model_validate(redact(task.receipt.model_dump()))
    receipt_html = '<p class="muted">No settlement receipt.</p>'
    if receipt is not None:
        facts: dict[str, Any] = {"system": receipt.external_system, "id": receipt.external_id, "status": receipt.status}
        facts |= {"verified at": _when(receipt.verified_at), "details": receipt.details}
        receipt_html = "".join(f"<tr><th>{k}</th><td>{html.escape(str(v))}</td></tr>" for k, v in facts.items())
        receipt_html = f"<table>{receipt_html}</table>"
    trace = f", trace <code id='trace-id'>{html.escape(task.trace.trace_id)}</code>" if task.trace.trace_id else ""
    return (
        f"<h1>{html.escape(task.task_id)}</h1>"
        f"<p class='muted'>tool {html.escape(task.tool)} ({task.side_effect_class.value}), status "
        f"<b id='status'>{task.status.value}</b>, stage {task.stage.value if task.stage else '-'}, generation "
        f"{task.claim_generation}, {task.attempts} attempt(s), lease TTL {task.lease_ttl.total_seconds():g}s, "
        f"idempotency key {html.escape(task.idempotency_key)}{trace}</p>"
        f"{holder_line(task, events)}"
        f"<p>{' | '.join(links)}</p>"
        f"<h2>Timeline</h2>{timeline_svg(events)}{_LEGEND}"
        f"<h2>Generations</h2>{_generations(task, events)}"
        f"{_decisions(events)}"
        f"<h2>Receipt</h2>{receipt_html}"
        "<h2>Evidence trail</h2><table id='trail'><tr><th>at</th><th>generation</th><th>event</th><th>stage</th>"
        f"<th>owner</th><th>by</th><th>reason</th><th>trace id</th></tr>{_rows(events)}</table>"
    )
