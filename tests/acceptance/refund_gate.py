"""The examples' refund service (``examples/refund_service.py``) with a gate the test controls.

The gate holds one refund request, once, at a point of the test's choosing, until the test opens
it: ``before`` the service applies it (the writer is still inside its external call, nothing
refunded yet) or ``after`` (refunded and its answer stored, the answer not yet sent). Holding is a
wait on an event, never a sleep. Every request is recorded with its fencing token and fate.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Literal

from examples.refund_service import Answer, RefundRequest, Refunds, RefundServer

HoldPoint = Literal["before", "after"]

GATE_TIMEOUT_S = 240.0
"""Longest a held request waits for the test to open the gate. Default 240s."""


@dataclass(frozen=True)
class Seen:
    """One request the service answered: its fencing token and what became of it."""

    fencing_token: int | None
    fate: Literal["applied", "replayed", "stale", "refused"]


@dataclass
class GatedRefunds(Refunds):
    """:class:`Refunds` that can hold the next request at a hold point, and records every request."""

    seen: list[Seen] = field(default_factory=list)
    held: threading.Event = field(default_factory=threading.Event)
    opened: threading.Event = field(default_factory=threading.Event)
    _hold: HoldPoint | None = None

    def hold_next(self, point: HoldPoint) -> None:
        """Hold the next refund request at ``point`` until :meth:`open`."""
        self._hold = point

    def open(self) -> None:
        self.opened.set()

    def refund(self, request: RefundRequest) -> Answer:
        with self.lock:
            point, self._hold = self._hold, None
        if point == "before":
            self._wait()
        answer = super().refund(request)
        with self.lock:
            self.seen.append(Seen(request.fencing_token, _fate(answer)))
        if point == "after":
            self._wait()
        return answer

    def _wait(self) -> None:
        self.held.set()
        self.opened.wait(timeout=GATE_TIMEOUT_S)

    def requests(self) -> list[Seen]:
        with self.lock:
            return list(self.seen)


def _fate(answer: Answer) -> Literal["applied", "replayed", "stale", "refused"]:
    if answer.status == HTTPStatus.CONFLICT and answer.body.get("error") == "stale_fencing_token":
        return "stale"
    if answer.status >= 400:
        return "refused"
    return "replayed" if answer.replayed else "applied"


@contextmanager
def running_refund_service() -> Iterator[tuple[GatedRefunds, str]]:
    """The gated refund service on a free port of 127.0.0.1, on threads of this process: ``(refunds, url)``."""
    refunds = GatedRefunds()
    server = RefundServer(("127.0.0.1", 0), refunds)
    thread = threading.Thread(target=server.serve_forever, name="refund-service", daemon=True)
    thread.start()
    try:
        yield refunds, server.url
    finally:
        refunds.open()  # a held request finishes (its client may be gone)
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)
