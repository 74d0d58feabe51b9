"""A tiny refund service: the downstream system the examples' ``issue_refund`` tool POSTs to.

It keeps everything in memory and speaks agentlease's HTTP convention (``docs/edge.md``,
"Fencing tokens at the downstream"):

``POST /refunds`` with a JSON body ``{"order_id": ..., "amount_cents": ...}``
    - ``Fencing-Token`` (a claim generation) older than the newest one seen for the resource
      (``Fencing-Resource``, else ``refunds/<order_id>``): ``409 stale_fencing_token``, nothing refunded;
    - ``Idempotency-Key`` already used: the first answer again (``Idempotent-Replayed: true``),
      nothing refunded;
    - otherwise one refund (one effect), ``201`` with the refund.

    A request without the headers (the ``before/`` agents send none) refunds every time.

``GET /refunds/<order_id>``
    ``{"order_id": ..., "refunds": [...]}``: the refunds made for the order.

The fence is checked before the key, so a writer that lost its lease is refused even when a newer
attempt of the same call (same key) has already refunded. Run it::

    python refund_service.py --port 8000
"""

from __future__ import annotations

import argparse
import json
import threading
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class RefundRequest:
    """One ``POST /refunds`` as the service read it."""

    order_id: str
    amount_cents: int
    idempotency_key: str | None
    fencing_token: int | None
    resource: str


@dataclass(frozen=True)
class Answer:
    """What the service answered: an HTTP status and a JSON body."""

    status: int
    body: dict[str, Any]
    replayed: bool = False


@dataclass
class Refunds:
    """The service's state: refunds by order, the newest fencing token by resource, answers by key."""

    refunds: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    fences: dict[str, int] = field(default_factory=dict)
    answers: dict[str, Answer] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def refund(self, request: RefundRequest) -> Answer:
        """Refund once per idempotency key, refusing a fencing token older than the resource's newest."""
        with self.lock:
            if request.fencing_token is not None:
                newest = self.fences.get(request.resource, 0)
                if request.fencing_token < newest:
                    body = {"error": "stale_fencing_token", "generation": request.fencing_token, "current": newest}
                    return Answer(HTTPStatus.CONFLICT, body)
                self.fences[request.resource] = request.fencing_token
            if request.idempotency_key is not None and request.idempotency_key in self.answers:
                first = self.answers[request.idempotency_key]
                return Answer(first.status, first.body, replayed=True)
            made = self.refunds.setdefault(request.order_id, [])
            refund = {"refund_id": f"re_{request.order_id}_{len(made) + 1}", **_fields(request)}
            made.append(refund)
            answer = Answer(HTTPStatus.CREATED, refund)
            if request.idempotency_key is not None:
                self.answers[request.idempotency_key] = answer
            return answer

    def effects(self, order_id: str) -> int:
        """How many refunds the order got."""
        with self.lock:
            return len(self.refunds.get(order_id, []))


def _fields(request: RefundRequest) -> dict[str, Any]:
    return {"order_id": request.order_id, "amount_cents": request.amount_cents, "fencing_token": request.fencing_token}


class RefundHandler(BaseHTTPRequestHandler):
    """HTTP in front of :class:`Refunds` (the server's ``refunds`` attribute)."""

    server: RefundServer

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path != "/refunds":
            return self._send(Answer(HTTPStatus.NOT_FOUND, {"error": "not_found"}))
        try:
            payload = json.loads(body)
            order_id, amount_cents = str(payload["order_id"]), int(payload["amount_cents"])
            token = self.headers.get("Fencing-Token")
            request = RefundRequest(
                order_id=order_id,
                amount_cents=amount_cents,
                idempotency_key=self.headers.get("Idempotency-Key"),
                fencing_token=int(token.partition(".")[0]) if token else None,
                resource=self.headers.get("Fencing-Resource") or f"refunds/{order_id}",
            )
        except (ValueError, KeyError, TypeError) as exc:
            return self._send(Answer(HTTPStatus.BAD_REQUEST, {"error": "bad_request", "detail": str(exc)}))
        self._send(self.server.refunds.refund(request))

    def do_GET(self) -> None:
        order_id = self.path.removeprefix("/refunds/")
        if not self.path.startswith("/refunds/") or not order_id:
            return self._send(Answer(HTTPStatus.NOT_FOUND, {"error": "not_found"}))
        with self.server.refunds.lock:
            made = list(self.server.refunds.refunds.get(order_id, []))
        self._send(Answer(HTTPStatus.OK, {"order_id": order_id, "refunds": made}))

    def _send(self, answer: Answer) -> None:
        data = json.dumps(answer.body).encode()
        self.send_response(answer.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if answer.replayed:
            self.send_header("Idempotent-Replayed", "true")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: one line per request is noise in a demo's terminal."""


class RefundServer(ThreadingHTTPServer):
    """The HTTP server of a :class:`Refunds`; a client that hung up before its answer is not an error."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], refunds: Refunds | None = None) -> None:
        super().__init__(address, RefundHandler)
        self.refunds = refunds if refunds is not None else Refunds()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A worker killed mid-request leaves a broken connection behind; its answer is simply lost."""

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    options = parser.parse_args()
    with RefundServer((options.host, options.port)) as server:
        print(f"refund service on {server.url}", flush=True)
        server.serve_forever()


if __name__ == "__main__":
    main()
