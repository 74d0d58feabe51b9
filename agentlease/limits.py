"""Every bound on what agentlease accepts from outside: one home for each number (``docs/limits.md``); the id
lengths follow the ledger's columns.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import unicodedata
from datetime import timedelta
from pathlib import Path
from typing import Any

MAX_RUN_ID_CHARS = 127
"""Longest agent run id (workflow id) a plan or ``run --run-id`` may give: ``127 + 1 + 128 = 256``,
so the default key ``<run>:<step>`` fits ``idempotency_key`` (256)."""

MAX_STEP_ID_CHARS = 128
"""Longest step id (``tasks.step_id`` is 128 characters)."""

MAX_IDEMPOTENCY_KEY_CHARS = 256
"""Longest idempotency key the ledger stores (``tasks.idempotency_key`` and ``receipts.idempotency_key``)."""

MAX_WIRE_KEY_CHARS = 255
"""Longest idempotency key agentlease mints and a downstream accepts (``Idempotency-Key``): a longer one, or one
that is not printable ASCII, is digested (``records.bounded_key``)."""

MAX_WORKFLOW_ID_CHARS = 255
"""Longest workflow id of any workflow making leased calls (``tasks.agent_run_id``); a longer id of
an adapter's workflow makes each call fail at once."""

MAX_TOOL_NAME_CHARS = 128
"""Longest tool name (``tasks.tool``)."""

MAX_APPROVAL_TTL = timedelta(days=30)
"""Longest an approval lasts (``AGENTLEASE_APPROVAL_TTL``, a tool's ``approval_ttl``): a person's yes goes stale."""

MAX_APPROVERS = 10
"""Most people a tool may ask to approve one call (``ApprovalRule.approvers``)."""

MAX_DEPTH = 32
"""Deepest nesting of objects and arrays in tool arguments and in ``observed``."""

MAX_ARGUMENTS_BYTES = 64 * 1024
"""Largest tool arguments of one step, as compact UTF-8 JSON (64 KiB)."""

MAX_OBSERVED_BYTES = 16 * 1024
"""Largest ``observed`` object of a ``reconcile --action confirm`` (16 KiB): it becomes a receipt."""

MAX_EXTERNAL_ID_CHARS = 1024
"""Longest ``external_id`` of a ``reconcile --action confirm``."""

MAX_WHO_CHARS = 200
"""Longest ``by`` of a decision."""

MAX_WHY_CHARS = 2000
"""Longest ``reason`` of a decision."""

MAX_STEPS_PER_RUN = 1000
"""Most steps one ``AgentRunWorkflow`` takes, plan and ``submit`` together."""

MAX_PLAN_BYTES = 1024 * 1024
"""Largest plan file ``agentlease run`` reads, and largest plan as JSON (1 MiB; Temporal refuses a
payload over 2 MiB)."""

MAX_LISTING_BYTES = 8 * 1024 * 1024
"""Largest recorded MCP ``tools/list`` file read (``listed=``, ``<server>.tools.json``; 8 MiB: a server of a hundred
tools with long schemas records a few hundred KiB)."""

MAX_KEY_FILE_BYTES = 1024 * 1024
"""Largest key or certificate file read: an operator's key (``--operator-key``, ``AGENTLEASE_OPERATOR_KEYS``), the
Temporal TLS CA, certificate and key (1 MiB; a bundle of every public CA is about 200 KiB)."""

MAX_OUTPUT_BYTES = 256 * 1024
"""Largest ``output`` a tool returns, as compact UTF-8 JSON (256 KiB): it travels in Temporal history, whose payloads
Temporal refuses over 2 MiB."""

MAX_RECEIPT_BYTES = 16 * 1024
"""Largest settlement receipt a tool or a probe returns, as compact UTF-8 JSON (16 KiB, like ``observed``): the
ledger keeps it and every step's view carries it."""

MAX_EVIDENCE_BYTES = 16 * 1024
"""Largest evidence of a probe's answer, as compact UTF-8 JSON (16 KiB): it is written into the evidence trail."""

MAX_REASON_CHARS = 4000
"""Longest reason or error one line of the evidence trail, a task's last error or a failure keeps; longer text is
cut, ending with :data:`CLIPPED`."""

CLIPPED = " [... cut: longer than 4000 characters]"
"""The marker that ends a reason :func:`clip` cut."""

MAX_TASK_QUEUE_CHARS = 200
"""Longest task queue name."""

MAX_NAME_CHARS = 200
"""Longest namespace name."""


def is_decimal(text: str) -> bool:
    """Whether ``text`` is one or more ASCII digits, a number ``int`` reads (``"²"`` is a digit to ``str.isdigit``,
    and ``int("²")`` raises ``ValueError``): the check before ``int`` of a number from outside."""
    return text.isascii() and text.isdigit()


def read_file(path: Path, max_bytes: int) -> bytes:
    """The bytes of a file or a device, read without waiting for a writer and at most ``max_bytes`` + 1 of them.

    Raises:
        OSError: it cannot be read, it is a FIFO, a socket or a terminal (refused at once: each would wait for a
            writer or a typist forever), or it holds more than ``max_bytes`` (``/dev/zero`` ends there);
            ``strerror`` says which.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            raise OSError(0, "a FIFO or a socket, not a file")
        if os.isatty(fd):
            raise OSError(0, "a terminal, not a file")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as file:
            data = file.read(max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise OSError(errno.EFBIG, f"larger than {max_bytes} bytes")
    return data


def is_wire_key(value: str) -> bool:
    """Whether ``value`` can be an idempotency key on the wire: 1 to :data:`MAX_WIRE_KEY_CHARS` printable ASCII
    characters (space to ``~``)."""
    return 0 < len(value) <= MAX_WIRE_KEY_CHARS and all(" " <= ch <= "~" for ch in value)


def check_text(value: str, what: str = "") -> str:
    """``value`` unless it holds a NUL byte or a lone surrogate (PostgreSQL and UTF-8 refuse both). Raises
    ``ValueError`` naming ``what``."""
    subject = f"{what} contains" if what else "contains"
    if "\x00" in value:
        raise ValueError(f"{subject} a NUL character")
    if any("\ud800" <= ch <= "\udfff" for ch in value):
        raise ValueError(f"{subject} a lone surrogate (not valid Unicode)")
    return value


def check_id(value: str, what: str = "") -> str:
    """``value`` unless it is empty, holds a control character or is not valid Unicode (``ValueError``)."""
    check_text(value, what)
    if not value:
        raise ValueError(f"{what or 'an id'} must not be empty")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
        raise ValueError(f"{what + ' contains' if what else 'contains'} a control character")
    return value


SHARED_RUN_PREFIX = "shared:"
"""What no run id begins with: the prefix of keys shared across runs (``records.SHARED_KEY_PREFIX``)."""


def check_run_id(value: str) -> str:
    """``value`` if it can be an agent run id: at most :data:`MAX_RUN_ID_CHARS`, no control character, valid
    Unicode, no ``/`` (a task id is ``<run>/<step>``), not ``shared`` nor beginning with ``shared:``, not ``.`` or
    ``..``, no invisible format character (a bidi override would show an operator another id). Raises
    ``ValueError``."""
    check_id(value, "agent run id")
    if len(value) > MAX_RUN_ID_CHARS:
        raise ValueError(f"agent run id has {len(value)} characters, more than {MAX_RUN_ID_CHARS}")
    if "/" in value:
        raise ValueError("agent run id contains '/': a task id is <run>/<step>")
    if value.startswith(SHARED_RUN_PREFIX) or value == SHARED_RUN_PREFIX[:-1]:
        raise ValueError(f"agent run id is 'shared' or begins with {SHARED_RUN_PREFIX!r}: keys shared across runs do")
    if value in (".", ".."):
        raise ValueError(f"agent run id {value!r} is a path segment (the web view's /runs/<run>)")
    hidden = next((ch for ch in value if unicodedata.category(ch) == "Cf"), None)
    if hidden is not None:
        raise ValueError(f"agent run id contains U+{ord(hidden):04X}, an invisible format character (bidi, zero-width)")
    return value


def check_finite_arguments(arguments: Any, tool: str) -> Any:
    """``arguments`` (a validated model, or JSON-shaped data) unless a number in them is NaN or infinite, as
    pydantic makes ``"inf"`` for a ``float`` field (``PermanentToolError``: dead-lettered, not retried)."""
    from agentlease.errors import PermanentToolError

    stack = [arguments.model_dump() if hasattr(arguments, "model_dump") else arguments]
    while stack:
        value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise PermanentToolError(f"arguments of {tool!r} hold {value!r}, not a finite number")
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list | tuple | set | frozenset):
            stack.extend(value)
    return arguments


def check_json(value: Any, what: str = "", *, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """``value`` unless it is deeper than ``max_depth``, holds NaN, Infinity, a NUL byte or a lone surrogate, or
    is larger than ``max_bytes`` as compact UTF-8 JSON (``ValueError``: one line, the first problem)."""
    subject = f"{what} " if what else ""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list | tuple):
            if depth >= max_depth:
                raise ValueError(f"{subject}nested deeper than {max_depth} levels")
            if isinstance(item, dict):
                for key, child in item.items():
                    if not isinstance(key, str):
                        raise ValueError(f"{subject}has a non-string key")
                    check_text(key, f"{subject}key".strip())
                    stack.append((child, depth + 1))
            else:
                stack.extend((child, depth + 1) for child in item)
        elif isinstance(item, str):
            check_text(item, what)
        elif isinstance(item, float) and not math.isfinite(item):
            raise ValueError(f"{subject}contains {item!r}, which JSON cannot carry")
    size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode())
    if size > max_bytes:
        raise ValueError(f"{subject}{size} bytes as JSON, more than {max_bytes}")
    return value


def clip(text: str) -> str:
    """``text`` unless it is longer than :data:`MAX_REASON_CHARS`; then its beginning, ending with :data:`CLIPPED`,
    :data:`MAX_REASON_CHARS` characters in all."""
    if len(text) <= MAX_REASON_CHARS:
        return text
    return text[: MAX_REASON_CHARS - len(CLIPPED)] + CLIPPED


def check_tool_result(output: Any, receipt: Any, tool: str) -> None:
    """Refuse what a tool returned when it cannot be recorded: ``output`` (JSON-shaped) over
    :data:`MAX_OUTPUT_BYTES` or ``receipt`` (as JSON) over :data:`MAX_RECEIPT_BYTES`, either deeper than
    :data:`MAX_DEPTH` or holding NaN, Infinity, a NUL byte or a lone surrogate. Raises ``PermanentToolError``, one
    line naming the bound (the attempt fails for good, as when the tool raises it)."""
    from agentlease.errors import PermanentToolError

    for what, value, max_bytes in (("output", output, MAX_OUTPUT_BYTES), ("receipt", receipt, MAX_RECEIPT_BYTES)):
        try:
            check_json(value, f"{what} of {tool!r}:", max_bytes=max_bytes)
        except ValueError as exc:
            raise PermanentToolError(f"{exc} (the bound on a tool's {what}); the result is not recorded") from None


def check_probe_answer(evidence: Any, receipt: Any) -> None:
    """Refuse a probe's answer that cannot be recorded: ``evidence`` over :data:`MAX_EVIDENCE_BYTES` or ``receipt``
    (as JSON, ``None`` for none) over :data:`MAX_RECEIPT_BYTES` as compact JSON, or either not plain JSON as
    :func:`check_json` says. Raises ``ValueError``, one line naming the bound."""
    for what, value, max_bytes in (("evidence", evidence, MAX_EVIDENCE_BYTES), ("receipt", receipt, MAX_RECEIPT_BYTES)):
        try:
            check_json(value, f"the probe's {what}:", max_bytes=max_bytes)
        except ValueError as exc:
            raise ValueError(f"{exc} (the bound on a probe's {what}); the answer is not recorded") from None


def refuse_constant(name: str) -> Any:
    """``parse_constant`` for :func:`json.loads`: NaN, Infinity and -Infinity are refused."""
    raise ValueError(f"{name} is not a JSON number")


def finite_float(text: str) -> float:
    """``parse_float`` for :func:`json.loads`: refuses a number beyond a float's range (``1E400``: infinity)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is beyond the range of a JSON number")
    return value


def loads(text: str | bytes, what: str, *, max_depth: int = MAX_DEPTH + 4) -> Any:
    """Parse JSON text from outside (``ValueError``, one line naming ``what``): NaN/Infinity and numbers beyond a
    float's range refused, nesting beyond ``max_depth`` refused before parsing (default :data:`MAX_DEPTH` plus a
    plan's four levels above arguments)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "surrogateescape")
    _check_text_depth(text, what, max_depth)
    try:
        return json.loads(
            text, parse_constant=refuse_constant, parse_float=finite_float, object_pairs_hook=_unique_keys
        )
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except ValueError as exc:
        raise ValueError(f"{what} is not valid JSON: {exc}") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` for :func:`json.loads`: an object naming one key twice is refused (which one would
    count is the parser's guess: a plan's last ``tool`` would run)."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise ValueError(f"the key {key[:40]!r} appears twice in one object")
        found[key] = value
    return found


def _check_text_depth(text: str, what: str, limit: int) -> None:
    """Refuse JSON text whose brackets nest deeper than ``limit``."""
    depth = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                raise ValueError(f"{what} is nested deeper than {limit} levels")
        elif ch in "]}":
            depth -= 1
