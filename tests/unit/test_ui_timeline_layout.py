"""The lease timeline's layout, from trails as real workers write them (``agentlease.ui.timeline``).

Found with the operator console over real workers (``tests/acceptance/test_ui_real_stack.py``): a
takeover's refused renewal, late settle and the winner's settle fall within a few milliseconds of each
other, and their labels were drawn on top of each other; a dead-lettered (or released) task's row has no
owner any more, and its page said nobody had held it.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from agentlease.enums import EventKind, SideEffectClass, Stage, TaskStatus
from agentlease.records import LeaseEvent, TaskRecord, TraceLink
from agentlease.ui.timeline import holder_line, timeline_svg

T0 = datetime(2026, 12, 2, 7, 9, 42, tzinfo=UTC)


def ev(n: int, kind: EventKind, generation: int, owner: str, ms: int, **more: object) -> LeaseEvent:
    return LeaseEvent(
        event_id=n,
        task_id="run/write",
        kind=kind,
        claim_generation=generation,
        lease_owner=owner,
        stage=more.get("stage"),
        reason=str(more.get("reason", "")),
        details=more.get("details"),
        trace=TraceLink(),
        at=T0 + timedelta(milliseconds=ms),
    )


def record(status: TaskStatus, generation: int, owner: str | None) -> TaskRecord:
    return TaskRecord(
        task_id="run/write",
        agent_run_id="run",
        step_id="write",
        tool="send_mail",
        side_effect_class=SideEffectClass.IDEMPOTENT,
        status=status,
        stage=Stage.PREFLIGHT,
        lease_owner=owner,
        lease_acquired_at=None if owner is None else T0,
        lease_expires_at=None,
        lease_ttl=timedelta(seconds=5),
        claim_generation=generation,
        attempts=1,
        renewal_count=0,
        idempotency_key="run:write",
        receipt=None,
        trace=TraceLink(),
        last_error=None,
        error_class=None,
        created_at=T0,
        updated_at=T0,
    )


TAKEOVER = [
    ev(1, EventKind.CLAIMED, 1, "worker-a", 0),
    ev(2, EventKind.RENEWED, 1, "worker-a", 30, stage=Stage.EXTERNAL_CALL),
    ev(3, EventKind.EXPIRED, 1, "worker-a", 7000, stage=Stage.EXTERNAL_CALL),
    ev(4, EventKind.CLAIMED, 2, "worker-b", 7000),
    ev(5, EventKind.SETTLED, 2, "worker-b", 7050),
    ev(6, EventKind.LEASE_LOST, 1, "worker-a", 7300, details={"operation": "renew"}),
    ev(7, EventKind.LATE_UNAPPLIED, 1, "worker-a", 7320, details={"operation": "settle"}),
]


def labels(svg: str) -> list[tuple[str, int, str]]:
    """``(text, y, x)`` of every marker label."""
    found = re.findall(r'<text class="marker-label[^"]*" x="([\d.]+)" y="(\d+)"[^>]*>([^<]+)</text>', svg)
    return [(text, int(y), x) for x, y, text in found]


def test_labels_of_markers_close_in_time_get_rows_of_their_own() -> None:
    placed = labels(timeline_svg(TAKEOVER))
    refused = {text: y for text, y, _ in placed if "refused" in text}
    assert set(refused) == {"refused renew", "late settle refused"}, placed
    assert len(set(refused.values())) == 2, placed  # one above the other, not on top of each other
    second = {text: y for text, y, _ in placed if text in ("claimed", "settled") and y > min(refused.values()) + 40}
    assert len(set(second.values())) == 2, placed  # generation 2's claim and settle, 50 ms apart


def test_a_repeated_refusal_is_labelled_once_where_it_repeats() -> None:
    again = [*TAKEOVER, ev(8, EventKind.LEASE_LOST, 1, "worker-a", 7330, details={"operation": "renew"})]
    texts = [text for text, _, _ in labels(timeline_svg(again))]
    assert texts.count("refused renew") == 1, texts
    assert timeline_svg(again).count('class="refused"') == 3  # every refusal keeps its marker


def test_a_short_trail_has_a_time_axis_in_milliseconds() -> None:
    ticks = re.findall(r'<text class="tick"[^>]*>(\+[^<]+)</text>', timeline_svg(TAKEOVER[:2]))
    assert ticks == ["+0ms", "+6ms", "+12ms", "+18ms", "+24ms", "+30ms"], ticks


def test_a_task_whose_attempt_failed_names_who_held_it_last() -> None:
    trail = [
        ev(1, EventKind.CLAIMED, 1, "worker-b", 0),
        ev(2, EventKind.DEAD_LETTERED, 1, "worker-b", 20, stage=Stage.PREFLIGHT),
    ]
    line = holder_line(record(TaskStatus.DEAD_LETTERED, 1, None), trail)
    assert (
        "not held: dead_lettered at generation <b>1</b>, last held by <b>worker-b</b> (claimed 2026-12-02T07:09:42"
        in line
    )
    assert "last held" not in holder_line(record(TaskStatus.PENDING, 0, None), [])
    held = holder_line(record(TaskStatus.SETTLED, 2, "worker-b"), TAKEOVER)
    assert "last held by <b>worker-b</b>" in held, held
