"""Secrets removed from everything agentlease keeps or sends on (:func:`redact`): by key in JSON-shaped data and
by shape in strings; ``AGENTLEASE_REDACTOR`` sets a deployment's own text rule. ``docs/security-data.md``."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

MASK = "***"
"""What a redacted secret is replaced by."""

_TOKEN_CHARS = r"[A-Za-z0-9._~+/=-]"
_PAIR = re.compile(r"""(?P<key>["']?\b[A-Za-z][A-Za-z0-9_.-]{0,127}["']?)\s*[:=]\s*["']?""")
"""The name and separator of ``name=value``, ``name: value``, ``"name": "value"``, ``'name': 'value'``: its value
is masked when the name is a secret's (:func:`secret_key`), as in JSON-shaped data. A name is at most 128
characters, so that a long run of name characters costs linear time."""
_VALUE = re.compile(r"""[^\s&,;"'}]+""")


def _mask_pairs(text: str) -> str:
    """``text`` with the value of each pair whose name is a secret's masked. Pairs are found by name and
    separator alone, so that a pair inside another's value is found too (``Error: token=...``)."""
    kept: list[str] = []
    pos = 0
    for pair in _PAIR.finditer(text):
        if pair.start() < pos or not secret_key(pair["key"].strip("\"'")):
            continue
        value = _VALUE.match(text, pair.end())
        if value is None or value[0] == MASK:
            continue
        kept.append(text[pos : pair.end()])
        kept.append(MASK)
        pos = value.end()
    kept.append(text[pos:])
    return "".join(kept)


def _sub(pattern: re.Pattern[str], replacement: str) -> Callable[[str], str]:
    """The rule that replaces each match of ``pattern`` by ``replacement`` (group references allowed)."""
    return functools.partial(pattern.sub, replacement)


_RULES: list[Callable[[str], str]] = [
    _sub(re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)", re.S), MASK),
    # user:password@ in a URL; a password may hold "/", but "host:8080/path@x" is a port and a path. A scheme is
    # at most 32 characters, so that a long run of scheme characters costs linear time.
    _sub(re.compile(r"(?i)\b([a-z][a-z0-9+.-]{0,31}://[^\s:/@]*):(?!\d+/)[^\s@]*@"), rf"\1:{MASK}@"),
    _sub(re.compile(r"(?i)\b(authorization\s*[:=]\s*)(?:(?:bearer|basic|token)\s+)?[^\s,;\"']+"), rf"\1{MASK}"),
    _sub(re.compile(r"(?i)\b((?:set-)?cookie\s*:\s*)[^\r\n\"']+"), rf"\1{MASK}"),
    _sub(re.compile(rf"(?i)\b(bearer|basic)\s+{_TOKEN_CHARS}{{8,}}"), rf"\1 {MASK}"),
    # "token <value>": a value with a digit (8+ characters) or a long one, not a word ("token expired").
    _sub(
        re.compile(rf"(?i)\b(token)\s+(?:(?={_TOKEN_CHARS}*\d){_TOKEN_CHARS}{{8,}}|{_TOKEN_CHARS}{{20,}})"),
        rf"\1 {MASK}",
    ),
    _mask_pairs,
    _sub(re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"), MASK),
    _sub(
        re.compile(
            r"\b(?:gh[pousr]_[A-Za-z0-9]{16,}|github_pat_[A-Za-z0-9_]{20,}"
            r"|[sr]k_(?:live|test)_[A-Za-z0-9]{8,}|sk-[A-Za-z0-9_-]{16,}"
            r"|xox[abposr]-[A-Za-z0-9-]{8,}|AIza[A-Za-z0-9_-]{30,})"
        ),
        MASK,
    ),
    _sub(re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]+"), MASK),
]

_TRIGGERS = (
    *("@", "auth", "credential", "dsn", "bearer", "basic", "akia", "asia", "-----begin", "passw", "passphrase"),
    *("pwd", "secret", "token", "key", "cookie", "session", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    *("sk_", "rk_", "sk-", "xox", "aiza", "eyj"),
)
"""Text containing none of these (lower-cased) matches no rule: the rules are skipped (the renewal hot path)."""


def _trigger_pattern(triggers: tuple[str, ...]) -> re.Pattern[str]:
    """One search for any of ``triggers`` in lower-cased text, grouped by first character (``a(?:iza|kia|...)``)
    so that a position is tried once per group, not once per trigger: faster than 25 substring tests on text of
    a few dozen characters and about as fast on longer text."""
    groups: dict[str, list[str]] = {}
    for trigger in triggers:
        groups.setdefault(trigger[0], []).append(re.escape(trigger[1:]))
    return re.compile("|".join(f"{re.escape(first)}(?:{'|'.join(rests)})" for first, rests in groups.items()))


_TRIGGER = _trigger_pattern(_TRIGGERS)

_SECRET_KEY = re.compile(
    r"pass(?:wd|word|phrase)|secret|token$|^pwd$|_pwd$|api_?key|access_?key|private_?key|signing_?key"
    r"|authori[sz]ation|cookie|credentials?$|session_?id$|^auth$|^dsn$"
)

Redactor = Callable[[str], str]
"""A function from text to the same text with its secrets masked."""


_KEY_SEPARATORS = re.compile(r"[-. ]")
_CACHED_KEY_CHARS = 128
"""Keys up to this long have their answer kept (:func:`_secret_key_cached`); longer ones are checked each time."""


def secret_key(key: str) -> bool:
    """Whether the value under ``key`` is a secret; case-insensitive, ``-``, ``.``, space as ``_`` (``X-Api-Key``).
    The answers for the last 1,024 distinct keys of up to 128 characters are kept."""
    if len(key) <= _CACHED_KEY_CHARS:
        return _secret_key_cached(key)
    return _is_secret_key(key)


def _is_secret_key(key: str) -> bool:
    return _SECRET_KEY.search(_KEY_SEPARATORS.sub("_", key.lower())) is not None


_secret_key_cached = functools.lru_cache(maxsize=1024)(_is_secret_key)


def redact_text(text: str) -> str:
    """``text`` with the secrets :data:`_RULES` find masked by ``***``: each rule is a function from text to text."""
    if _TRIGGER.search(text.lower()) is None:
        return text
    for rule in _RULES:
        text = rule(text)
    return text


def redact_value(value: Any, redactor: Redactor = redact_text) -> Any:
    """``value`` (a string or JSON-shaped data) with every secret masked, at any depth: strings by ``redactor``
    (default :func:`redact_text`), and the whole value under a key that names a secret (:func:`secret_key`)."""
    if isinstance(value, str):
        return redactor(value)
    if isinstance(value, dict):
        return {
            key: _masked(item) if isinstance(key, str) and secret_key(key) else redact_value(item, redactor)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact_value(item, redactor) for item in value]
    return value


def _masked(value: Any) -> Any:
    """What a value under a secret's key becomes: ``***``; nothing (``None``, ``""``) and booleans stay."""
    if value is None or isinstance(value, bool) or value == "":
        return value
    return MASK


_configured: Redactor = redact_text


def configure(redactor: Redactor | None) -> None:
    """Set the process's redactor (``AGENTLEASE_REDACTOR``); ``None``: the default. ConfigurationError: it is
    not a function from text to text (tried once on a probe text)."""
    global _configured
    if redactor is not None:
        from agentlease.errors import ConfigurationError

        if not callable(redactor):
            raise ConfigurationError(f"bad redactor: a function (str) -> str, not {type(redactor).__name__}")
        try:
            probe = redactor("agentlease redactor probe")
        except Exception as exc:  # noqa: BLE001 - any failure of a deployment's function is a bad setting
            raise ConfigurationError(f"bad redactor: it raised {type(exc).__name__} on a probe text") from None
        if not isinstance(probe, str):
            raise ConfigurationError(f"bad redactor: it returned {type(probe).__name__}, not text")
    _configured = redactor or redact_text


def redact(value: Any) -> Any:
    """``value`` redacted with the process's redactor (:func:`configure`): the call point of every way out."""
    return redact_value(value, _configured)


__all__ = ["MASK", "Redactor", "configure", "redact", "redact_text", "redact_value", "secret_key"]
