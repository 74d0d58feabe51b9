"""Proof that a lease progress signal comes from an attempt its run scheduled.

The run mints a secret in a local activity; each leased call carries its step's key (an HMAC of the
secret), and each progress signal an HMAC of its fields under that key. Why, and what it relies on:
``docs/security-input.md`` ("Lease progress").
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentlease.records import LeaseProgress

PROGRESS_SECRET = "agentlease.progress_secret"
"""Local activity that mints a run's progress secret (hex of 32 random bytes)."""

_KEY_LABEL = b"agentlease-progress-key\n"
_PROOF_LABEL = b"agentlease-progress\n"


def mint_secret() -> str:
    """A new run secret: 32 random bytes, hex."""
    return secrets.token_hex(32)


def step_key(secret: str, step_id: str) -> str:
    """The key of one step's calls: ``HMAC-SHA256(secret, step id)``, hex."""
    return hmac.new(secret.encode("ascii"), _KEY_LABEL + step_id.encode("utf-8"), hashlib.sha256).hexdigest()


def _message(progress: LeaseProgress) -> bytes:
    fields = progress.model_dump(mode="json", exclude={"proof"})
    return _PROOF_LABEL + json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def prove(key: str, progress: LeaseProgress) -> LeaseProgress:
    """``progress`` with its proof: ``HMAC-SHA256(key, its fields)``, hex."""
    proof = hmac.new(key.encode("ascii"), _message(progress), hashlib.sha256).hexdigest()
    return progress.model_copy(update={"proof": proof})


def proven(key: str, progress: LeaseProgress) -> bool:
    """Whether ``progress`` carries the proof ``key`` makes for its fields."""
    if progress.proof is None:
        return False
    expected = hmac.new(key.encode("ascii"), _message(progress), hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, progress.proof)


__all__ = ["PROGRESS_SECRET", "mint_secret", "prove", "proven", "step_key"]
