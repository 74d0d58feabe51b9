"""Operator decisions signed with an operator's Ed25519 key: the CLI signs (:class:`OperatorKey`), the worker
verifies (:class:`DecisionVerifier`); a signed decision applies once, to the generation it was signed for.
``docs/security-operations.md`` ("Authenticated decisions")."""

from __future__ import annotations

import base64
import binascii
import json
import re
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from agentlease import limits
from agentlease.errors import AgentLeaseError, ConfigurationError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from agentlease.settings import AgentLeaseSettings

# cryptography is imported where keys are made, loaded, used: a command that only reads the ledger does not pay for it.

OPEN = "open"
AUTHENTICATED = "authenticated"
_NAME_LINE = "agentlease-operator: "
_NAME = re.compile(r"[A-Za-z0-9._@-]{1,200}")
FUTURE_SKEW = timedelta(minutes=5)
"""How far in the future a proof's ``signed_at`` may be (clocks differ). 5 minutes."""
DECISION_ID_PATTERN = r"^[A-Za-z0-9_-]{16,64}$"
"""What a decision id looks like (:meth:`OperatorKey.sign` makes 32 hex digits)."""


class DecisionProof(BaseModel):
    """An operator's signature of one decision request: ``operator`` (the key file's name), ``signed_at``,
    ``signature`` (Ed25519 of :func:`signed_message`, base64), ``decision_id`` (random, applied once; ``None``
    only in old proofs, refused) and ``generation`` (the task's claim generation seen; ``None``: not bound)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    operator: str = Field(min_length=1, max_length=200)
    signed_at: AwareDatetime
    signature: str = Field(min_length=1, max_length=200)
    decision_id: str | None = Field(default=None, pattern=DECISION_ID_PATTERN)
    generation: int | None = Field(default=None, ge=0)


class SignedDecision(BaseModel):
    """A signed request as the workflow received it (``proof`` included), and its update's name."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    command: str
    request: dict[str, Any]

    @property
    def proof(self) -> DecisionProof | None:
        """The request's proof (``None``: none, or a malformed one)."""
        try:
            return DecisionProof.model_validate(self.request.get("proof"))
        except ValueError:
            return None

    @property
    def decision_id(self) -> str | None:
        """The signed decision id of the request's proof (``None``: no proof, or one without an id)."""
        proof = self.proof
        return None if proof is None else proof.decision_id


class DecisionRefusedError(AgentLeaseError):
    """A decision's signature is missing, unknown, wrong, stale, or does not match the decision."""


class DecisionReplayedError(DecisionRefusedError):
    """A signed decision whose decision id the ledger already holds: refused non-retryably, nothing changes."""

    def __init__(self, decision_id: str, kind: str, task_id: str, applied: str) -> None:
        self.decision_id = decision_id
        self.task_id = task_id
        super().__init__(
            f"replayed decision: {kind} {decision_id} on {task_id} was used already ({applied}); "
            "a signed decision applies once: sign a new one"
        )


def signed_message(
    agent_run_id: str,
    command: str,
    request: Mapping[str, Any],
    operator: str,
    signed_at: str,
    decision_id: str | None = None,
    generation: int | None = None,
) -> bytes:
    """The bytes an operator signs: canonical JSON of the run, command, request (without its proof), operator,
    time, decision id and generation (the last two absent for an old proof, so its entries still verify)."""
    body: dict[str, Any] = {
        "agentlease-decision": 1,
        "run": agent_run_id,
        "command": command,
        "request": {k: v for k, v in request.items() if k != "proof"},
        "operator": operator,
        "signed_at": signed_at,
    }
    if decision_id is not None:
        body.update({"agentlease-decision": 2, "decision_id": decision_id, "generation": generation})
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _signed_by(key: Ed25519PublicKey, agent_run_id: str, signed: SignedDecision, proof: DecisionProof) -> bool:
    from cryptography.exceptions import InvalidSignature

    at = proof.signed_at.isoformat()
    message = signed_message(
        agent_run_id, signed.command, signed.request, proof.operator, at, proof.decision_id, proof.generation
    )
    try:
        key.verify(base64.b64decode(proof.signature, validate=True), message)
    except (InvalidSignature, binascii.Error, ValueError):
        return False
    return True


# -- keys --------------------------------------------------------------------------------------------


def new_operator_keys(name: str, directory: Path) -> tuple[Path, Path]:
    """Write ``NAME.key`` (private, mode 0600) and ``NAME.pub`` into ``directory``; returns both paths.

    Raises:
        ConfigurationError: a bad name, a file that already exists, or a directory not writable.
    """
    if not _NAME.fullmatch(name):
        raise ConfigurationError(f"bad operator name {name!r}: use letters, digits, '.', '_', '@', '-'")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    header = f"{_NAME_LINE}{name}\n".encode()
    paths = (directory / f"{name}.key", directory / f"{name}.pub")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for path, data, mode in ((paths[0], private, 0o600), (paths[1], public, 0o644)):
            with path.open("xb") as file:
                path.chmod(mode)
                file.write(header + data)
    except FileExistsError as exc:
        raise ConfigurationError(f"{exc.filename} exists already; not overwritten") from None
    except OSError as exc:
        raise ConfigurationError(f"cannot write operator keys into {directory}: {exc.strerror or exc}") from None
    return paths


def _key_file(path: Path, setting: str, kind: str, operator: str | None = None) -> tuple[str, Any]:
    """The operator a key file of ``agentlease keys new-operator`` names, and its Ed25519 ``private``/``public`` key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

    try:
        data = limits.read_file(path, limits.MAX_KEY_FILE_BYTES)
    except OSError as exc:
        raise ConfigurationError(f"{setting}: cannot read {path}: {exc.strerror or exc}") from None
    first = data.split(b"\n", 1)[0].decode("utf-8", "replace")
    named = first[len(_NAME_LINE) :].strip()
    if not first.startswith(_NAME_LINE) or not _NAME.fullmatch(named):
        raise ConfigurationError(f"{path}: not an agentlease operator key (no {_NAME_LINE.strip()} line)")
    if operator is not None and named != operator:
        raise ConfigurationError(f"{setting}: {path} is the key of another operator, not {operator!r}")
    try:
        if kind == "private":
            key: Any = serialization.load_pem_private_key(data, password=None)
        else:
            key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError):
        raise ConfigurationError(f"{setting}: {path} holds no readable {kind} key") from None
    if not isinstance(key, Ed25519PrivateKey if kind == "private" else Ed25519PublicKey):
        raise ConfigurationError(f"{setting}: {path} is not an Ed25519 key")
    return named, key


class OperatorKey:
    """An operator's private key, from a file of ``agentlease keys new-operator``; ConfigurationError when the
    file cannot be read or holds no Ed25519 operator key."""

    def __init__(self, path: Path) -> None:
        self.operator, self._key = _key_file(path, "AGENTLEASE_OPERATOR_KEY", "private")

    def sign(
        self,
        agent_run_id: str,
        command: str,
        request: Mapping[str, Any],
        now: datetime | None = None,
        *,
        generation: int | None = None,
        decision_id: str | None = None,
    ) -> DecisionProof:
        """The proof of ``request`` (the update payload, as JSON) for ``command`` on ``agent_run_id``, bound to
        ``generation`` (``None``: to none); ``decision_id`` defaults to a new random one (32 hex digits)."""
        signed_at = (now or datetime.now(UTC)).isoformat()
        decision_id = decision_id or uuid.uuid4().hex
        message = signed_message(agent_run_id, command, request, self.operator, signed_at, decision_id, generation)
        signature = base64.b64encode(self._key.sign(message)).decode()
        return DecisionProof(
            operator=self.operator,
            signed_at=datetime.fromisoformat(signed_at),
            signature=signature,
            decision_id=decision_id,
            generation=generation,
        )


def load_public_keys(text: str | None) -> dict[str, Ed25519PublicKey]:
    """``AGENTLEASE_OPERATOR_KEYS`` (``NAME=FILE_OR_BASE64,...``: a ``.pub`` of ``agentlease keys new-operator``
    or the raw 32-byte key in base64) as public keys by operator name.

    Raises:
        ConfigurationError: a malformed entry, an unreadable file, or a file of another operator.
    """
    keys: dict[str, Ed25519PublicKey] = {}
    for entry in (part.strip() for part in (text or "").split(",")):
        if not entry:
            continue
        name, sep, value = entry.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not _NAME.fullmatch(name) or not value:
            raise ConfigurationError("bad AGENTLEASE_OPERATOR_KEYS entry: expected NAME=KEYFILE or NAME=BASE64KEY")
        keys[name] = _public_key(name, value)
    return keys


def _public_key(name: str, value: str) -> Ed25519PublicKey:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if Path(value).is_file():
        key: Ed25519PublicKey = _key_file(Path(value), "AGENTLEASE_OPERATOR_KEYS", "public", operator=name)[1]
        return key
    try:
        return Ed25519PublicKey.from_public_bytes(base64.b64decode(value, validate=True))
    except (binascii.Error, ValueError):
        raise ConfigurationError(
            f"AGENTLEASE_OPERATOR_KEYS: the key of {name!r} is neither a file nor a base64 Ed25519 key"
        ) from None


def public_key_text(key: Ed25519PublicKey) -> str:
    """The raw public key, base64 (the ``NAME=BASE64`` form of ``AGENTLEASE_OPERATOR_KEYS``)."""
    from cryptography.hazmat.primitives import serialization

    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


# -- verifying ------------------------------------------------------------------------------------


class DecisionVerifier:
    """The workers' check of operator decisions, in ``mode`` ``open`` or ``authenticated``, with operator public
    ``keys`` by name; a proof may be ``max_age`` old (default 15m) when the decision is first scheduled.

    Raises:
        ConfigurationError: ``authenticated`` without any key, or an unknown mode.
    """

    def __init__(
        self,
        mode: str = OPEN,
        keys: Mapping[str, Ed25519PublicKey] | None = None,
        max_age: timedelta = timedelta(minutes=15),
    ) -> None:
        if mode not in (OPEN, AUTHENTICATED):
            raise ConfigurationError(f"bad AGENTLEASE_DECISION_MODE {mode!r}: open or authenticated")
        self.mode = mode
        self.keys = dict(keys or {})
        self.max_age = max_age
        if mode == AUTHENTICATED and not self.keys:
            raise ConfigurationError(
                "AGENTLEASE_DECISION_MODE=authenticated needs AGENTLEASE_OPERATOR_KEYS (NAME=KEYFILE,...)"
            )

    def verify(
        self, agent_run_id: str, signed: SignedDecision | None, *, expect: Mapping[str, Any], at: datetime
    ) -> str | None:
        """Check one decision applied to ``agent_run_id``: ``signed`` (``None``: unsigned) must say what ``expect``
        says (command, step_id, by, reason, ...), signed within ``max_age`` of ``at`` (when first scheduled).
        Returns the verified operator; ``None`` in open mode for an unsigned decision or an unknown operator.

        Raises:
            DecisionRefusedError: why the decision is refused.
        """
        if signed is None or signed.request.get("proof") is None:
            if self.mode == AUTHENTICATED:
                raise DecisionRefusedError(
                    "unsigned decision: this deployment is in authenticated decision mode; "
                    "sign it with AGENTLEASE_OPERATOR_KEY"
                )
            return None
        proof = signed.proof
        if proof is None:
            raise DecisionRefusedError("malformed decision signature")
        key = self.keys.get(proof.operator)
        if key is None:
            if self.mode == AUTHENTICATED:
                raise DecisionRefusedError(
                    f"decision signed by {proof.operator!r}, an operator this worker has no key of"
                )
            return None
        if not _signed_by(key, agent_run_id, signed, proof):
            raise DecisionRefusedError(f"bad signature of operator {proof.operator!r} on this decision")
        if proof.decision_id is None:
            raise DecisionRefusedError(
                "the signed decision has no decision id, so it could be applied again: "
                "sign it with this version of agentlease"
            )
        if proof.signed_at < at - self.max_age or proof.signed_at > at + FUTURE_SKEW:
            raise DecisionRefusedError(
                f"decision signed at {proof.signed_at.isoformat()}, outside "
                f"{self.max_age.total_seconds():g}s of when it was sent (stale or replayed)"
            )
        said = {**signed.request, "command": signed.command, "by": signed.request.get("by")}
        for field, value in expect.items():
            if field == "step_id" and signed.command == "cancel" and said.get("step_id") is None:
                continue  # a cancel of the whole run covers each of its steps
            if said.get(field, {} if field == "observed" else None) != value:
                raise DecisionRefusedError(f"the signed decision does not match the one applied ({field} differs)")
        if said.get("by") != proof.operator:
            raise DecisionRefusedError(
                f"the signed decision names {said.get('by')!r}, but {proof.operator!r} signed it"
            )
        return proof.operator


def decision_verifier(settings: AgentLeaseSettings) -> DecisionVerifier:
    """The verifier of ``settings``; ConfigurationError as :class:`DecisionVerifier` and :func:`load_public_keys`."""
    return DecisionVerifier(settings.decision_mode, load_public_keys(settings.operator_keys), settings.decision_max_age)


def verify_recorded_signature(
    agent_run_id: str, details: Mapping[str, Any], keys: Mapping[str, Ed25519PublicKey]
) -> bool:
    """Whether an evidence entry's ``signed_by`` is proven by the signed decision in its ``details["signed"]``,
    by the operator's key in ``keys``, for ``agent_run_id`` (an entry naming an operator without one fails). The
    signature only: :func:`agentlease.decisions.table.verify_recorded` also ties it to the entry's step and kind."""
    try:
        signed = SignedDecision.model_validate(details.get("signed"))
        proof = DecisionProof.model_validate(signed.request.get("proof"))
    except ValueError:
        return False
    key = keys.get(proof.operator)
    if key is None or details.get("signed_by") != proof.operator:
        return False
    return _signed_by(key, agent_run_id, signed, proof)


def signed_decision(command: str, request: BaseModel) -> dict[str, Any]:
    """The ``signed`` field of the decision activity's input; ``{}`` for a request without a proof."""
    if getattr(request, "proof", None) is None:
        return {}
    return {"signed": SignedDecision(command=command, request=request.model_dump(mode="json"))}


__all__ = [
    "AUTHENTICATED",
    "OPEN",
    "DecisionProof",
    "DecisionRefusedError",
    "DecisionReplayedError",
    "DecisionVerifier",
    "OperatorKey",
    "SignedDecision",
    "decision_verifier",
    "load_public_keys",
    "new_operator_keys",
    "public_key_text",
    "signed_decision",
    "signed_message",
    "verify_recorded_signature",
]
