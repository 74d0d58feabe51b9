"""Redaction: secrets removed from what the ledger stores, before it stores it.

The ledger passes every reason, error, receipt and evidence detail through one redactor
(:func:`redact_value`) on its way in, so a password in a URL, a bearer token in an error message or
an API key a tool echoed in its receipt never reaches a row. The default redactor
(:func:`redact_text`) masks:

- credentials in URLs: ``scheme://user:password@host`` -> ``scheme://user:***@host``;
- ``Authorization:`` headers and ``Bearer`` / ``Basic`` tokens;
- ``password=``, ``passwd=``, ``pwd=``, ``secret=``, ``token=``, ``api_key=``, ``apikey=``,
  ``access_key=`` and ``private_key=`` values (also as ``"name": "value"`` in JSON text);
- AWS access key ids (``AKIA...``/``ASIA...``) and ``aws_secret_access_key`` values;
- private key blocks (``-----BEGIN ... PRIVATE KEY-----``).

A deployment sets its own with ``AGENTLEASE_REDACTOR=module:function`` (a ``(str) -> str``), which
may call :func:`redact_text` first. ``docs/security.md`` ("Retention and redaction").
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

MASK = "***"
"""What a redacted secret is replaced by."""

_SECRET_NAMES = (
    r"(?:password|passwd|pwd|secret|client_secret|token|access_token|refresh_token"
    r"|api[_-]?key|access[_-]?key|private[_-]?key|aws_secret_access_key)"
)
_RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)", re.S), MASK),
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s:/@]*):[^\s@/]*@"), rf"\1:{MASK}@"),
    (re.compile(r"(?i)\b(authorization\s*[:=]\s*)(?:(?:bearer|basic|token)\s+)?[^\s,;\"']+"), rf"\1{MASK}"),
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"), rf"\1 {MASK}"),
    (re.compile(rf"(?i)([\"']?\b{_SECRET_NAMES}[\"']?\s*[:=]\s*[\"']?)[^\s&,;\"'}}]+"), rf"\1{MASK}"),
    (re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"), MASK),
]

_TRIGGERS = ("@", "authoriz", "bearer", "basic", "akia", "asia", "-----begin", "passw", "pwd", "secret", "token", "key")
"""Text containing none of these (lower-cased) matches no rule: the rules are skipped (the renewal hot path)."""

Redactor = Callable[[str], str]
"""A function from text to the same text with its secrets masked."""


def redact_text(text: str) -> str:
    """``text`` with the secrets the module docstring lists masked by ``***``."""
    lowered = text.lower()
    if not any(trigger in lowered for trigger in _TRIGGERS):
        return text
    for pattern, replacement in _RULES:
        text = pattern.sub(replacement, text)
    return text


def redact_value(value: Any, redactor: Redactor = redact_text) -> Any:
    """``value`` with every string in it (nested dict keys' values, list items) redacted.

    Args:
        value: a string, or JSON-shaped data (dicts, lists, numbers, booleans, ``None``).
        redactor: the text redactor. Default :func:`redact_text`.
    """
    if isinstance(value, str):
        return redactor(value)
    if isinstance(value, dict):
        return {key: redact_value(item, redactor) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [redact_value(item, redactor) for item in value]
    return value


_configured: Redactor = redact_text


def configure(redactor: Redactor | None) -> None:
    """Set the process's redactor (a worker does it from ``AGENTLEASE_REDACTOR``); ``None``: the default."""
    global _configured
    _configured = redactor or redact_text


def redact(value: Any) -> Any:
    """``value`` redacted with the process's redactor (:func:`configure`): the ledger's call point."""
    return redact_value(value, _configured)


__all__ = ["MASK", "Redactor", "configure", "redact", "redact_text", "redact_value"]
