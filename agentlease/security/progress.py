"""Proof that a lease progress signal comes from an attempt its run scheduled: an HMAC of its fields under the
step's key, itself an HMAC of the run's secret. ``docs/security-input.md`` ("Lease progress")."""

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


def _proof(key: str, progress: LeaseProgress) -> str:
    fields = progress.model_dump(mode="json", exclude={"proof"})
    message = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    return hmac.new(key.encode("ascii"), _PROOF_LABEL + message, hashlib.sha256).hexdigest()


def prove(key: str, progress: LeaseProgress) -> LeaseProgress:
    """``progress`` with its proof: ``HMAC-SHA256(key, its fields)``, hex."""
    return progress.model_copy(update={"proof": _proof(key, progress)})


def proven(key: str, progress: LeaseProgress) -> bool:
    """Whether ``progress`` carries the proof ``key`` makes for its fields."""
    return progress.proof is not None and hmac.compare_digest(_proof(key, progress), progress.proof)


__all__ = ["PROGRESS_SECRET", "mint_secret", "prove", "proven", "step_key"]
