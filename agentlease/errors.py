"""Errors raised by agentlease: one root, :class:`AgentLeaseError`, facts as attributes. Tools raise the
:class:`ToolError` subclasses to say how an attempt ended (``docs/recovery.md``).
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from pydantic import ValidationError


def describe_validation_error(exc: ValidationError, *, field: Callable[[str], str] = str) -> str:
    """One line naming the first three invalid fields: ``steps.0.tool: Field required; ...``.

    Args:
        exc: The error.
        field: How a top-level field is named (the settings name their variable). Default: its own name.
    """
    shown = [_one_error(error, field) for error in exc.errors()[:_ERRORS_SHOWN]]
    extra = f" (and {exc.error_count() - _ERRORS_SHOWN} more)" if exc.error_count() > _ERRORS_SHOWN else ""
    return "; ".join(shown) + extra


_ERRORS_SHOWN = 3


def _one_error(error: Any, field: Callable[[str], str]) -> str:
    loc = list(error["loc"])
    if loc and isinstance(loc[0], str):
        loc[0] = field(loc[0])
    where = ".".join(_location(part) for part in loc)
    message = " ".join(error["msg"].removeprefix("Value error, ").split())  # one line, whatever the input held
    return f"{where}: {message}" if where else message


_LOCATION_CHARS = 40


def _location(part: object) -> str:
    """One part of an error's location, printable: escaped if it must be, cut at :data:`_LOCATION_CHARS`."""
    text = str(part)
    shown = text[:_LOCATION_CHARS] + ("..." if len(text) > _LOCATION_CHARS else "")
    if shown.isprintable() and shown.strip() == shown and shown:
        return shown
    return printable(shown).join("''")


def printable(text: str) -> str:
    """``text`` with each character that is not printable (a control character, a line break, a bidi override,
    a zero-width space) written as its Python escape (``\\n``, ``\\x1b``, ``\\u202e``): fit to echo in one
    terminal line, shown as it is. Other characters, non-ASCII letters included, are kept."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else char.encode("unicode_escape").decode("ascii") for char in text)


def one_line(exc: BaseException) -> str:
    """``"<ErrorType>: <first line of the message>"``, for logs, ledger rows and CLI errors."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


class AgentLeaseError(Exception):
    """Root of every error agentlease raises on purpose."""


class ConfigurationError(AgentLeaseError):
    """A setting, plan or tool declaration is invalid. The message is one line, fit for a user."""


class LedgerUnavailableError(AgentLeaseError):
    """The ledger database cannot be reached (stopped, restarting, the connection dropped), or is not migrated. From
    ``ctx.advance`` and ``ctx.renew``: the lease is not confirmed; start no new side effect, let it propagate."""


class LedgerRefusedValueError(AgentLeaseError):
    """The ledger database refused a value of a write (too long for its column...): not an outage, the same
    write would fail on every retry (``docs/limits.md``)."""


class LedgerFileChangedError(LedgerUnavailableError):
    """The SQLite ledger file (``path``) this process opened was deleted or replaced: no lease is claimed, renewed
    or settled until the process restarts on the restored file (``docs/limits.md``)."""

    def __init__(self, path: str, what: str) -> None:
        super().__init__(
            f"the SQLite ledger {path} was {what} while this process used it; no lease is claimed, renewed or "
            "settled until it is restored and the process restarted"
        )
        self.path = path


class ClockBehindError(AgentLeaseError):
    """A claim of ``task_id`` on a SQLite ledger was refused: this process's clock runs ``behind`` (a timedelta)
    the ledger's latest recorded time (G1 on SQLite: one host, one clock)."""

    def __init__(self, task_id: str, behind: timedelta) -> None:
        super().__init__(
            f"claim of {task_id!r} refused: this process's clock is {behind.total_seconds():.3f}s behind the "
            "ledger's latest recorded time; every process of a SQLite ledger must share the host's clock"
        )
        self.task_id = task_id
        self.behind = behind


class TaskNotFoundError(AgentLeaseError):
    """No task with this id (``task_id``) is known to the ledger."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"no task {task_id!r} in the ledger")
        self.task_id = task_id


class LeaseLostError(AgentLeaseError):
    """A guarded lease write affected zero rows (G2): the holder's lease lapsed, was superseded, or the task
    was settled or cancelled. The holder must stop and start no new side effect. Attributes: ``task_id``,
    ``generation`` (the caller's), ``current_generation`` and ``status`` (the ledger's now; ``None``: unknown),
    ``operation`` (the refused write: ``renew``, ``settle``, ``release``, ``dead_letter``).
    """

    def __init__(
        self,
        task_id: str,
        generation: int,
        *,
        operation: str,
        current_generation: int | None = None,
        status: str | None = None,
    ) -> None:
        super().__init__(
            f"lease lost on {task_id!r}: {operation} with generation {generation} refused "
            f"(ledger: generation {current_generation}, status {status})"
        )
        self.task_id = task_id
        self.generation = generation
        self.current_generation = current_generation
        self.status = status
        self.operation = operation


class LeaseTokenMismatchError(LeaseLostError):
    """A holder write presented no lease token, or not the one minted with its claim generation (recorded as
    ``lease_lost``; ``docs/security-review.md``, "Lease tokens")."""

    def __init__(self, task_id: str, generation: int, *, operation: str, status: str | None = None) -> None:
        super().__init__(task_id, generation, operation=operation, current_generation=generation, status=status)
        self.args = (
            f"lease token refused on {task_id!r}: {operation} with generation {generation} did not present the "
            "lease token minted with that claim (a claim rebuilt from listings or the trail cannot write)",
        )


class BindingRefusedError(AgentLeaseError):
    """A tool call or decision named a task (``task_id``), key or lease TTL that is not its own workflow's
    (``workflow_id``, the one that scheduled it)."""

    def __init__(self, task_id: str, workflow_id: str | None, why: str) -> None:
        super().__init__(f"refused tool call for task {task_id!r} from workflow {workflow_id!r}: {why}")
        self.task_id = task_id
        self.workflow_id = workflow_id


class InvalidFencingTokenError(AgentLeaseError):
    """A fencing token is missing, malformed, or not signed by the fencing key for its resource (``resource_key``)."""

    def __init__(self, resource_key: str, why: str) -> None:
        super().__init__(f"fencing token refused for {resource_key!r}: {why}")
        self.resource_key = resource_key


class LeaseHeldError(AgentLeaseError):
    """A claim was refused because another lease on the task is still valid (G1): ``retry_after``, time until it
    lapses on the ledger's clock; ``holder``, its ``lease_owner``; ``generation``, its generation."""

    def __init__(self, task_id: str, retry_after: timedelta, holder: str | None, generation: int) -> None:
        super().__init__(
            f"task {task_id!r} is leased to {holder} (generation {generation}) "
            f"for another {retry_after.total_seconds():.3f}s"
        )
        self.task_id = task_id
        self.retry_after = retry_after
        self.holder = holder
        self.generation = generation


class TaskClosedError(AgentLeaseError):
    """A claim was refused: the task is settled, dead-lettered, cancelled, or waits for a decision (``status``)."""

    def __init__(self, task_id: str, status: str) -> None:
        super().__init__(f"task {task_id!r} is {status}; no attempt may claim it")
        self.task_id = task_id
        self.status = status


class TaskMovedError(AgentLeaseError):
    """A decision signed for one claim generation (``expected``) met its task at another (``actual``); nothing
    changed."""

    def __init__(self, task_id: str, expected: int, actual: int) -> None:
        super().__init__(
            f"the task moved on: the decision was signed for generation {expected} of {task_id}, "
            f"which is at generation {actual} now; look again and sign a new decision"
        )
        self.task_id = task_id
        self.expected = expected
        self.actual = actual


class ApprovalRefusedError(TaskClosedError):
    """The claim of an approval-gated task found no approval it may consume (none, expired, or for other
    arguments or another tool): the task went back to ``awaiting_approval`` (``status``); nothing ran. ``why``:
    what was wrong with the approval, as the trail records it; ``outcome``: ``missing``, ``expired`` or
    ``mismatched`` (the metric's label)."""

    def __init__(self, task_id: str, why: str, outcome: str) -> None:
        AgentLeaseError.__init__(self, f"task {task_id!r}: {why}")
        self.task_id = task_id
        self.status = "awaiting_approval"
        self.why = why
        self.outcome = outcome


class ApprovalRepeatedError(TaskClosedError):
    """A person (``by``: the verified operator of a signed decision, else the name given) approved a call that
    needs several approvers a second time: one person counts once; nothing changed."""

    def __init__(self, task_id: str, by: str, given: int, required: int) -> None:
        AgentLeaseError.__init__(
            self,
            f"task {task_id!r}: {by} approved it already ({given} of {required} approvals); "
            "each approval must come from another person",
        )
        self.task_id = task_id
        self.status = "awaiting_approval"
        self.by = by


class MissingHeartbeatTimeoutError(ConfigurationError):
    """A tool call was scheduled without a ``heartbeat_timeout`` (G9): its lease would have no TTL."""


class UnknownToolError(ConfigurationError):
    """A plan or an update names a tool (``tool``) that no worker registered."""

    def __init__(self, tool: str, known: list[str]) -> None:
        super().__init__(f"unknown tool {tool!r}; known tools: {', '.join(sorted(known)) or 'none'}")
        self.tool = tool


class ToolError(AgentLeaseError):
    """Base for errors a tool raises to tell agentlease how its attempt ended."""


class RetryableToolError(ToolError):
    """The attempt failed in a way another attempt may fix (a timeout, a 503)."""


class PermanentToolError(ToolError):
    """The attempt failed deterministically; retrying cannot help. The task is dead-lettered."""


class CredentialToolError(ToolError):
    """A credential is missing or revoked: the task is blocked until access is repaired."""


class AmbiguousSideEffectError(ToolError):
    """The tool cannot tell whether its side effect happened (a timeout after sending): retried with the same
    key, or, for an ``unsafe`` tool, waits for a reconciliation decision."""


class EffectInDoubtError(AmbiguousSideEffectError):
    """The downstream holds the call's idempotency key in doubt (it may have taken effect, ``docs/edge.md``):
    never retried, the task waits for its probe or a person."""


class KeyInFlightError(RetryableToolError):
    """The downstream is still executing an earlier request with the call's idempotency key: the attempt waits
    ``retry_after`` (what the downstream asked) under its lease and asks again, no real attempt spent
    (``docs/edge.md``)."""

    def __init__(self, message: str, retry_after: timedelta = timedelta(seconds=1)) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def raise_for_status(response: Any, what: str = "") -> None:
    """Raise the tool error an HTTP answer means, or nothing for 1xx-3xx.

    ``response`` is the answer (an ``httpx.Response``, or anything with ``status_code``, ``headers`` and
    ``content``), or its bare status code. A 409 from a downstream that follows the project's convention
    (``docs/edge.md``) says which of three it is, when the answer is given:

    ==========================================  ===========================================================
    answer                                      raises
    ==========================================  ===========================================================
    401, 403                                    :class:`CredentialToolError`: blocked until access is repaired
    409 ``idempotency_key_in_flight``           :class:`KeyInFlightError`: the attempt waits and asks again
    409 ``idempotency_key_in_doubt``            :class:`EffectInDoubtError`: a person (or the probe) decides
    408, 409 (others), 425, 429, 5xx            :class:`RetryableToolError`: retried (per its stage)
    any other 4xx                               :class:`PermanentToolError`: dead-lettered
    ==========================================  ===========================================================

    ``what`` names the request in the message ("POST /tickets"); default the response's method and URL. A leased
    tool that lets an exception carrying an answer out (httpx's ``HTTPStatusError``) is read by
    :func:`raised_refusal`.
    """
    error = answer_error(response, what)
    if error is not None:
        raise error


def answer_error(answer: Any, what: str = "") -> ToolError | None:
    """The tool error of :func:`raise_for_status`'s table for ``answer``, a response or its bare status code;
    ``None`` for 1xx-3xx."""
    status_code = answer if isinstance(answer, int) else int(answer.status_code)
    if status_code < 400:
        return None
    if not what and not isinstance(answer, int):
        try:
            request = getattr(answer, "request", None)
        except RuntimeError:  # httpx: a response built without its request
            request = None
        what = f"{request.method} {request.url}" if request is not None else ""
    refusal = None if isinstance(answer, int) else downstream_refusal(answer, what)
    if refusal is not None:
        return refusal
    message = f"{what}: HTTP {status_code}"
    if status_code in (401, 403):
        return CredentialToolError(message)
    if status_code in (408, 409, 425, 429) or status_code >= 500:
        return RetryableToolError(message)
    return PermanentToolError(message)


def raised_refusal(exc: BaseException) -> ToolError | None:
    """What an exception a leased tool let out means when it carries an HTTP answer (``response``: httpx's
    ``HTTPStatusError`` from ``response.raise_for_status()``, requests' ``HTTPError``) that says more than "it
    failed": the convention's two 409s (:func:`downstream_refusal`) and 401 / 403 (:class:`CredentialToolError`:
    blocked). ``None`` for any other: the exception is retried per its stage, as any, since a 4xx answering a retry
    may be the downstream's view of an earlier attempt's effect (``docs/edge.md``)."""
    if isinstance(exc, ToolError):
        return None
    try:  # whatever the exception carries: a read that raises is no answer
        response = getattr(exc, "response", None)
        status_code = getattr(response, "status_code", None)
    except Exception:  # noqa: BLE001
        return None
    if status_code in (401, 403):
        return answer_error(response)
    return downstream_refusal(exc)


def downstream_refusal(answer: Any, what: str = "") -> KeyInFlightError | EffectInDoubtError | None:
    """What a 409 answer of the edge convention (a response, or an exception carrying one) means to a leased call:
    the key in flight (wait) or in doubt (park); ``None`` for any other answer."""
    if isinstance(answer, KeyInFlightError | EffectInDoubtError):
        return answer
    response: Any = getattr(answer, "response", None) if isinstance(answer, BaseException) else answer
    if getattr(response, "status_code", None) != 409:
        return None
    try:
        code = json.loads(response.content).get("error")
    except (ValueError, TypeError, AttributeError):
        return None
    if code == "idempotency_key_in_flight":
        retry_after = _seconds(response.headers.get("retry-after"))
        return KeyInFlightError(f"{what}: the downstream is still executing the request with this key", retry_after)
    if code == "idempotency_key_in_doubt":
        return EffectInDoubtError(
            f"{what}: the downstream holds this key in doubt (an earlier request started; it may have taken effect)"
        )
    return None


def _seconds(value: str | None) -> timedelta:
    """A ``Retry-After`` of delay-seconds; 1 s when absent or not a number of seconds."""
    try:
        return timedelta(seconds=min(max(float(value or 1), 0.05), 60.0))
    except ValueError:
        return timedelta(seconds=1)


class StaleFencingTokenError(AgentLeaseError):
    """A fenced write carried a generation older than the newest one the resource accepted (G2), raised inside
    the writer's transaction (:mod:`agentlease.fencing`), which rolls back with it. Attributes: ``resource_key``,
    ``generation`` (the writer's) and ``current_generation`` (the newest accepted; ``None`` if unknown)."""

    def __init__(self, resource_key: str, generation: int, current_generation: int | None) -> None:
        super().__init__(
            f"stale fencing token for {resource_key!r}: generation {generation} refused, "
            f"the resource has accepted generation {current_generation}"
        )
        self.resource_key = resource_key
        self.generation = generation
        self.current_generation = current_generation
