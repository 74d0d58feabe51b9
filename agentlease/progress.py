"""Proof that a lease progress signal comes from an attempt its run scheduled (``docs/security-input.md``, "Lease progress").

Anyone who can signal a run can send it ``agentlease.lease_progress``. So the run keeps a secret of
its own, 32 random bytes minted by a local activity (:data:`PROGRESS_SECRET`) the first time it
schedules a leased call: the workflow's own randomness is seeded from the run id, which anyone who
can list runs reads, so ``workflow.uuid4()`` would be guessable. Each leased call's input
(:class:`~agentlease.records.ToolCall`) carries its step's key, ``HMAC-SHA256(secret, step id)``;
each progress signal carries ``HMAC-SHA256(key, the signal's fields)``. The run recomputes both and
drops a signal whose proof does not verify, without a trail entry or any state but a count.

The secret is in the run's history (the local activity's marker) and the keys in its activity
inputs: a reader of history who can open its payloads (no payload codec, or the codec's keys) can
prove progress too. With ``AGENTLEASE_CODEC_KEYS`` they are sealed like every other payload.
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
