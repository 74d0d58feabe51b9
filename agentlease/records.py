"""Records: frozen, typed values that cross process and workflow boundaries.

Timestamps are timezone-aware; a naive datetime is rejected. Durations are
``timedelta``. These models travel through Temporal with the pydantic data converter.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import string
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    StrictBool,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from agentlease import limits
from agentlease.clock import from_ms, require_aware
from agentlease.enums import EventKind, RunState, SideEffectClass, Stage, StepStatus, TaskStatus
from agentlease.limits import MAX_STEP_ID_CHARS

AwareDatetime = Annotated[datetime, AfterValidator(require_aware)]

STEP_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
"""1-128 letters, digits, ``_``, ``.``, ``-``, from a letter or digit; no ``/`` (a task id is ``<run>/<step>``)."""
_STEP_ID = re.compile(STEP_ID_PATTERN)
_NOT_STEP_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def step_id_from(text: str) -> str:
    """A valid step id made from any text (a model's tool-call id), stable for the same text: other characters
    become ``-``, and text that had to change (or is too long) keeps a 12-character digest of the original."""
    cleaned = _NOT_STEP_CHARS.sub("-", text).strip("-_.") or "step"
    if cleaned == text and len(text) <= MAX_STEP_ID_CHARS:
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{cleaned[: MAX_STEP_ID_CHARS - 13]}-{digest}"


def is_step_id(value: str) -> bool:
    """Whether ``value`` is a step id (:data:`STEP_ID_PATTERN`)."""
    return _STEP_ID.fullmatch(value) is not None


def task_id_for(agent_run_id: str, step_id: str) -> str:
    """The stable task id: ``"<agent_run_id>/<step_id>"``."""
    return f"{agent_run_id}/{step_id}"


SHARED_KEY_PREFIX = "shared:"
"""How a key shared across runs begins in the ledger: a run-scoped key begins with :func:`run_key_prefix`."""

DIGEST_MARK = "%sha256-"
"""How a digested part of a key begins: no :func:`key_part` holds a ``%`` but in ``%25`` and ``%3A``."""


def key_part(text: str) -> str:
    """``text`` as one part of an idempotency key, so that parts joined by ``:`` never read as other parts:
    ``%`` becomes ``%25`` and ``:`` becomes ``%3A``; any other text is unchanged."""
    return text.replace("%", "%25").replace(":", "%3A")


def _digest(text: str) -> str:
    return DIGEST_MARK + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def wire_part(text: str) -> str:
    """``text`` if it can be a key on the wire (:func:`~agentlease.limits.is_wire_key`), else its digest,
    ``%sha256-<32 hex>`` (:data:`DIGEST_MARK`)."""
    return text if limits.is_wire_key(text) else _digest(text)


def run_key_prefix(agent_run_id: str) -> str:
    """How every run-scoped key of ``agent_run_id`` begins: ``"<key_part(run id)>:"``, or ``"%sha256-<32 hex>:"``
    when that is longer than :data:`~agentlease.limits.MAX_RUN_ID_CHARS` or not printable ASCII."""
    part = key_part(agent_run_id)
    if len(part) > limits.MAX_RUN_ID_CHARS or not limits.is_wire_key(part):
        part = _digest(agent_run_id)
    return f"{part}:"


def bounded_key(prefix: str, rest: str) -> str:
    """The key ``prefix + rest``, or ``prefix + wire_part(rest)`` when that is not a key on the wire (over
    :data:`~agentlease.limits.MAX_WIRE_KEY_CHARS` characters or not printable ASCII): the one way every key
    agentlease mints is kept within the downstream convention (``docs/security.md``, "Idempotency keys")."""
    key = prefix + rest
    return key if limits.is_wire_key(key) else prefix + _digest(rest)


def idempotency_key_for(agent_run_id: str, step_id: str) -> str:
    """The default idempotency key, ``"<run_key_prefix(run id)><step id>"`` (``acme:refund`` for run ``acme``),
    never Temporal's ``activity_id`` (G4); bounded by :func:`bounded_key`."""
    return bounded_key(run_key_prefix(agent_run_id), key_part(step_id))


def scoped_idempotency_key(agent_run_id: str, key: str, *, shared: bool = False) -> str:
    """The ledger's idempotency key of a caller-chosen ``key``: ``"<run_key_prefix(run id)><key>"``, or
    ``"shared:<key>"`` shared across runs (``docs/security.md``, "Idempotency keys"); bounded by
    :func:`bounded_key`."""
    return bounded_key(SHARED_KEY_PREFIX if shared else run_key_prefix(agent_run_id), key)


def action_key_fields(template: str) -> list[str]:
    """The argument names a declared action key template uses (``"refund:{order_id}"`` -> ``["order_id"]``):
    plain ``{name}`` fields only (``docs/action-keys-and-probes.md``); ``ValueError``: a malformed template, a field
    that is not a plain name, no field at all, or a NUL, control character or lone surrogate in it."""
    limits.check_id(template, f"action key {template!r}")
    fields: list[str] = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(f"action key {template!r} is not a template: {exc}") from None
    for _text, name, spec, conversion in parsed:
        if name is None:
            continue
        if not name.isidentifier() or spec or conversion:
            raise ValueError(
                f"action key {template!r}: {{{name}{'!' + conversion if conversion else ''}"
                f"{':' + spec if spec else ''}}} is not a plain argument name such as {{order_id}}"
            )
        fields.append(name)
    if not fields:
        raise ValueError(f"action key {template!r} names no argument: every call would be one action")
    return fields


def _same_numbers(value: Any) -> Any:
    """``value`` with every float that is a whole number as an int (``100.0`` is ``100``)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {name: _same_numbers(item) for name, item in value.items()}
    if isinstance(value, list | tuple):
        return [_same_numbers(item) for item in value]
    return value


def _canonical(value: Any) -> str:
    return json.dumps(_same_numbers(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _key_text(value: Any) -> str:
    """An argument's value as a key's text: a string as it is, anything else as canonical JSON."""
    return value if isinstance(value, str) else _canonical(value)


def normalized_arguments(arguments: dict[str, Any], defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """A call's JSON ``arguments`` as the same action always has them: ``defaults`` filling those it leaves out,
    and every whole-number float an int (``100.0`` is ``100``). What action keys and
    :func:`arguments_fingerprint` are computed from (deterministic: workflow code)."""
    return _same_numbers({**(defaults or {}), **arguments})


def action_key_for(template: str, arguments: dict[str, Any], defaults: dict[str, Any] | None = None) -> str:
    """The action key ``template`` (:func:`action_key_fields`) makes from a call's JSON ``arguments``
    (:func:`normalized_arguments` with ``defaults``), each value a :func:`key_part` (``n:{a}:{b}`` makes
    ``n:x%3Ay:z`` and ``n:x:y%3Az`` of ``x:y, z`` and ``x, y:z``). ``ValueError``: a named argument is missing."""
    given = normalized_arguments(arguments, defaults)
    values: dict[str, str] = {}
    for name in action_key_fields(template):
        if name not in given:
            raise ValueError(f"action key {template!r} needs the argument {name!r}, which the call does not give")
        values[name] = key_part(_key_text(given[name]))
    return template.format_map(values)


def arguments_fingerprint(arguments: dict[str, Any]) -> str:
    """SHA-256 (hex) of ``arguments`` as canonical JSON (whole-number floats as ints): what a stored receipt is
    bound to besides its tool. The workflow gives the tool its :func:`normalized_arguments`."""
    return hashlib.sha256(_canonical(arguments).encode("utf-8", "surrogatepass")).hexdigest()


class ApprovalRequest(_Frozen):
    """What a person is asked to approve: the call's ``tool``, its ``arguments`` redacted (a secret's value
    shows as ``***``) and ``arguments_sha256``, the fingerprint of the arguments as they are
    (:func:`arguments_fingerprint`), the one an approval is bound to (``approve --arguments-sha256``).

    Attributes:
        approvals_required: how many people must approve the call (``ApprovalRule.approvers``). Default 1.
        approved_by: who approved it so far, in order (as the ledger shows it; empty when asked).
        expires_at: when the approval given (the first of several) lapses on the ledger's clock; ``None``:
            none given yet, or a ledger that does not know the tool's approval TTL.
    """

    tool: str
    arguments: dict[str, Any]
    arguments_sha256: str
    approvals_required: int = Field(default=1, ge=1)
    approved_by: list[str] = Field(default_factory=list)
    expires_at: AwareDatetime | None = None

    def shown(self) -> list[tuple[str, str]]:
        """Each argument's name and its value as text (a string as it is, anything else as canonical JSON)."""
        return [(name, _key_text(value)) for name, value in self.arguments.items()]

    def progress(self) -> str | None:
        """``1 of 2 approvals (alice), expires at <time>``; ``None`` for one approver and no approval yet."""
        if self.approvals_required == 1 and not self.approved_by:
            return None
        given = f"{len(self.approved_by)} of {self.approvals_required} approvals"
        if self.approved_by:
            given += f" ({', '.join(self.approved_by)})"
        if self.expires_at is not None:
            given += f", expires at {self.expires_at.isoformat(timespec='seconds')}"
        return given

    def describe(self) -> str:
        """One line: ``refund order_id: A-1001, amount_cents: 4200 (arguments sha256 <hex>)``, then the
        :meth:`progress` of several approvals: ``; 1 of 2 approvals (alice), expires at <time>``."""
        shown = ", ".join(f"{name}: {text}" for name, text in self.shown())
        progress = self.progress()
        return f"{self.tool} {shown} (arguments sha256 {self.arguments_sha256})" + (f"; {progress}" if progress else "")


class TraceLink(_Frozen):
    """Where an attempt ran in Temporal (and, tracing on, its OpenTelemetry ``trace_id``, 32 lowercase hex)."""

    workflow_id: str | None = None
    run_id: str | None = None
    activity_id: str | None = None
    attempt: int | None = None
    trace_id: str | None = None

    @classmethod
    def from_mapping(cls, m: Any) -> TraceLink:
        return cls(**{name: m[f"trace_{name}"] for name in _TRACE_FIELDS}, trace_id=m.get("trace_id"))

    def columns(self) -> dict[str, Any]:
        return {**{f"trace_{name}": getattr(self, name) for name in _TRACE_FIELDS}, "trace_id": self.trace_id}


_TRACE_FIELDS = ("workflow_id", "run_id", "activity_id", "attempt")  # stored in the trace_<field> columns


class PlanStep(_Frozen):
    """One tool call of an agent run.

    Attributes:
        step_id: unique within the run; letters, digits, ``_ . -``; at most 128 characters.
        tool: the registered tool name, at most 128 characters.
        arguments: the tool's arguments: at most 64 KiB as JSON, 32 levels deep, no NaN, Infinity, NUL or
            lone surrogate (``docs/limits.md``).
        idempotency_key: optional caller-chosen key (at most 256 characters), scoped to the run
            (``"<run>:<key>"``); default ``"<run>:<step>"``.
        share_idempotency_key: share ``idempotency_key`` across runs (``"shared:<key>"``). Default false.
    """

    step_id: str
    tool: str = Field(min_length=1, max_length=limits.MAX_TOOL_NAME_CHARS)
    arguments: dict[str, Any] = Field(default_factory=dict)
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=limits.MAX_IDEMPOTENCY_KEY_CHARS)
    share_idempotency_key: StrictBool = False

    @field_validator("step_id")
    @classmethod
    def _check_step_id(cls, value: str) -> str:
        if not _STEP_ID.fullmatch(value):
            raise ValueError("step_id must be 1-128 letters, digits, '_', '.', '-', starting with a letter or digit")
        return value

    @field_validator("tool", "idempotency_key")
    @classmethod
    def _check_ids(cls, value: str | None) -> str | None:
        return None if value is None else limits.check_id(value)

    @field_validator("arguments")
    @classmethod
    def _bounded_arguments(cls, value: dict[str, Any]) -> dict[str, Any]:
        return limits.check_json(value, max_bytes=limits.MAX_ARGUMENTS_BYTES)


class AgentRunPlan(_Frozen):
    """Input of ``AgentRunWorkflow``: an ordered list of tool calls.

    Attributes:
        agent_run_id: the workflow id of the run, at most 127 characters; ``None`` lets the CLI make one.
        steps: executed in order; step ids must be unique; at most 1000 (with ``submit``s).
        keep_open: when true (a JSON boolean) the run waits for ``submit`` updates until a ``close`` signal.
        continue_as_new_after: steps per Temporal run; default ``None``: when Temporal suggests it.
        carried: set by the run itself when it continues as new: what it had done so far.
    """

    agent_run_id: str | None = Field(default=None, min_length=1, max_length=limits.MAX_RUN_ID_CHARS)
    steps: list[PlanStep] = Field(default_factory=list, max_length=limits.MAX_STEPS_PER_RUN)
    keep_open: StrictBool = False
    continue_as_new_after: int | None = Field(default=None, ge=1, le=limits.MAX_STEPS_PER_RUN)
    carried: RunCarry | None = None

    @field_validator("agent_run_id")
    @classmethod
    def _check_run_id(cls, value: str | None) -> str | None:
        return None if value is None else limits.check_run_id(value)

    @field_validator("steps")
    @classmethod
    def _unique_steps(cls, steps: list[PlanStep]) -> list[PlanStep]:
        seen: set[str] = set()
        for step in steps:
            if step.step_id in seen:
                raise ValueError(f"duplicate step_id {step.step_id!r}")
            seen.add(step.step_id)
        return steps


DEFAULT_START_TO_CLOSE = timedelta(minutes=5)
"""Default bound of one attempt of a tool: 5 minutes."""
DEFAULT_MAX_ATTEMPTS = 5
"""Default number of real attempts before a task is dead-lettered."""


class ApprovalRule(_Frozen):
    """When a call of a tool waits for a person, and for how many (``requires_approval=ApprovalRule(...)``;
    ``docs/decisions.md``, "Approvals"): its argument ``field`` is above ``above``, as the call gives it. A call
    that leaves ``field`` out or gives something other than a number waits too. Without ``field`` (and
    ``above``) every call waits. A rule, not a function: the workflow evaluates it, and it is written to the trail
    as it is.

    Attributes:
        field: the name of an argument of the tool (checked when the tool is declared). Default ``None``: every
            call asks.
        above: the number a call's ``field`` must exceed to need a person (``ValidationError``: not finite, or
            given without ``field`` or ``field`` without it).
        approvers: how many different people must approve a call that asks, 1 to 10. Default 1.
    """

    field: str | None = Field(default=None, min_length=1)
    above: StrictInt | float | None = Field(default=None, allow_inf_nan=False)
    approvers: StrictInt = Field(default=1, ge=1, le=limits.MAX_APPROVERS)

    @model_validator(mode="after")
    def _field_with_bound(self) -> ApprovalRule:
        if (self.field is None) != (self.above is None):
            raise ValueError("an approval rule names both field and above, or neither (every call asks)")
        return self

    def __str__(self) -> str:
        bound = "every call" if self.field is None else f"{self.field} above {self.above}"
        return bound if self.approvers == 1 else f"{bound}, {self.approvers} approvers"

    def asks(self, arguments: dict[str, Any]) -> str | None:
        """Why a call with ``arguments`` waits for a person under this rule; ``None``: it does not."""
        if self.field is None:
            return f"every call asks (rule: {self})"
        if self.field not in arguments:
            return f"{self.field} is not given (rule: {self})"
        value = arguments[self.field]
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            return f"{self.field} is not a number (rule: {self})"
        assert self.above is not None
        return f"{self.field} {value} is above {self.above} (rule: {self})" if value > self.above else None


def approvals_required(requires_approval: bool | ApprovalRule) -> int:
    """How many different people must approve a call of a tool declared with ``requires_approval`` (1 unless
    an :class:`ApprovalRule` names more ``approvers``)."""
    return requires_approval.approvers if isinstance(requires_approval, ApprovalRule) else 1


def approval_reason(tool: str, requires_approval: bool | ApprovalRule, arguments: dict[str, Any]) -> str | None:
    """Why a call of ``tool`` with ``arguments`` waits for a person before it runs (what the trail records with
    the request); ``None``: it runs without one. The one home of the question, asked by the workflow before the
    call and by the activity at the claim."""
    if isinstance(requires_approval, ApprovalRule):
        why = requires_approval.asks(arguments)
        return None if why is None else f"{tool} requires approval: {why}"
    return f"{tool} requires approval" if requires_approval else None


class ToolInfo(_Frozen):
    """What the workflow needs to schedule a tool: its class and lease bounds (as :class:`~agentlease.tools.ToolSpec`),
    when its calls wait for a person (``requires_approval``: always, never, or by an :class:`ApprovalRule`), its
    ``action_key`` template (``None``: ``<run>:<step>``) and ``argument_defaults``, the JSON defaults of its
    arguments (read also as ``action_key_defaults``, as a run recorded it before)."""

    name: str
    side_effect_class: SideEffectClass
    lease_ttl: timedelta
    start_to_close: timedelta
    max_attempts: int
    requires_approval: StrictBool | ApprovalRule = False
    action_key: str | None = None
    argument_defaults: dict[str, Any] = Field(
        default_factory=dict, validation_alias=AliasChoices("argument_defaults", "action_key_defaults")
    )

    def arguments_of(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """A call's ``arguments`` as the tool's same action always has them (:func:`normalized_arguments`)."""
        return normalized_arguments(arguments, self.argument_defaults)

    def key_for(self, arguments: dict[str, Any]) -> str | None:
        """The action key of a call with ``arguments`` (``None``: the tool declares none; ``ValueError``: an
        argument the template names is missing and has no default)."""
        return None if self.action_key is None else action_key_for(self.action_key, arguments, self.argument_defaults)

    def approval_reason(self, arguments: dict[str, Any]) -> str | None:
        """Why a call with ``arguments`` waits for a person (:func:`approval_reason`); ``None``: it does not."""
        return approval_reason(self.name, self.requires_approval, arguments)


class ToolCall(_Frozen):
    """Input of one leased activity: the task to claim and the tool's arguments."""

    task_id: str
    agent_run_id: str
    step_id: str
    tool: str
    arguments: dict[str, Any]
    idempotency_key: str
    share_idempotency_key: bool = False
    """The key is shared across runs (``"shared:<key>"``); otherwise it must be of the call's own run."""
    progress_key: str | None = Field(default=None, min_length=64, max_length=64, pattern=r"^[0-9a-f]{64}$", repr=False)
    """The key the attempt proves its progress signals with (:mod:`agentlease.security.progress`); never stored."""


class TaskSpec(_Frozen):
    """What the ledger records when it first sees a task. A stored receipt settles it only when its tool and
    ``arguments_sha256`` (:func:`arguments_fingerprint`; ``None``: not known, the tool alone counts) match."""

    task_id: str
    agent_run_id: str
    step_id: str
    tool: str
    side_effect_class: SideEffectClass
    idempotency_key: str
    lease_ttl: timedelta
    arguments_sha256: str | None = None
    approval_ttl: timedelta | None = None
    """For a tool that requires approval: the claim needs an unconsumed approval of this call younger than this
    on the ledger's clock (``docs/decisions.md``, "Approvals"). ``None``: it needs none."""

    @classmethod
    def of(
        cls,
        call: ToolCall,
        side_effect_class: SideEffectClass,
        lease_ttl: timedelta,
        *,
        approval_ttl: timedelta | None = None,
    ) -> TaskSpec:
        """The task of a tool call (``pydantic.ValidationError``: a TTL that is not positive)."""
        return cls(
            task_id=call.task_id,
            agent_run_id=call.agent_run_id,
            step_id=call.step_id,
            tool=call.tool,
            side_effect_class=side_effect_class,
            idempotency_key=call.idempotency_key,
            lease_ttl=lease_ttl,
            arguments_sha256=arguments_fingerprint(call.arguments),
            approval_ttl=approval_ttl,
        )

    @field_validator("lease_ttl", "approval_ttl")
    @classmethod
    def _positive_ttl(cls, value: timedelta | None, info: ValidationInfo) -> timedelta | None:
        if value is not None and value <= timedelta(0):
            raise ValueError(f"{info.field_name} must be positive")
        return value


class SettlementReceipt(_Frozen):
    """Proof, made after reading the external state back, that an outcome is durable: ``external_system`` what was
    written (``"sql:inventory"``), ``external_id`` the target's own id for the outcome, ``status`` what the
    readback observed (``"present"``), ``details`` small JSON-able facts, ``verified_at`` when (aware)."""

    external_system: str
    external_id: str
    status: str
    details: dict[str, Any] = Field(default_factory=dict)
    verified_at: AwareDatetime

    @classmethod
    def now(cls, external_system: str, external_id: str, status: str, **details: Any) -> SettlementReceipt:
        """A receipt of what was just read back, verified now."""
        return cls(
            external_system=external_system,
            external_id=external_id,
            status=status,
            details=details,
            verified_at=datetime.now(UTC),
        )


RECEIPT_HEAD_CHARS = 200
"""Characters of ``external_system``, ``external_id`` and ``status`` a receipt stored over the bound keeps."""


def stored_over_the_bound(value: Any) -> Any:
    """A receipt as a ledger row holds it (JSON), or, when over :data:`~agentlease.limits.MAX_RECEIPT_BYTES` (kept
    before the bound), the same receipt without its details, marked: ``details`` = ``{"truncated": true,
    "stored_bytes": <size as compact JSON>, "sha256": <of that JSON>}``. A receipt made in code passes as it is."""
    if not isinstance(value, dict):
        return value
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    if len(text) <= limits.MAX_RECEIPT_BYTES:
        return value
    head = {
        name: str(value.get(name, ""))[:RECEIPT_HEAD_CHARS] for name in ("external_system", "external_id", "status")
    }
    marked = {"truncated": True, "stored_bytes": len(text), "sha256": hashlib.sha256(text).hexdigest()}
    return {**head, "details": marked, "verified_at": value.get("verified_at")}


StoredReceiptValue = Annotated[SettlementReceipt, BeforeValidator(stored_over_the_bound)]
"""A receipt read from the ledger: one stored over the bound is read marked (:func:`stored_over_the_bound`)."""


class StoredReceipt(_Frozen):
    """A settlement receipt as the ledger stores it, unique per idempotency key."""

    idempotency_key: str
    task_id: str
    claim_generation: int
    receipt: StoredReceiptValue


class Claim(_Frozen):
    """A lease the ledger granted to one attempt.

    Attributes:
        generation: claim generation minted by the ledger; the fencing token.
        acquired_at / expires_at: on the ledger's clock; ``attempts``: real attempts so far, this one included.
        previous_stage / previous_error_class: how far the previous attempt got, and how it ended.
        receipt: a settlement receipt already stored for the idempotency key, same tool and arguments (G6).
        receipt_refused: why a receipt stored for the key was not given (another tool or arguments used it).
        lease_token: the holder's secret for its writes; never shown, none in a claim rebuilt from listings or the
            trail (``docs/security-review.md``, "Lease tokens").
        approval_remaining: what was left of the approval this claim consumed (``None``: none consumed).
    """

    task_id: str
    tool: str
    generation: int
    owner: str
    acquired_at: AwareDatetime
    expires_at: AwareDatetime
    lease_ttl: timedelta
    attempts: int
    previous_stage: Stage | None
    previous_error_class: str | None
    idempotency_key: str
    trace: TraceLink = Field(default_factory=TraceLink)
    receipt: StoredReceipt | None = None
    receipt_refused: str | None = None
    lease_token: SecretStr = Field(default=SecretStr(""), repr=False)
    approval_remaining: timedelta | None = None


class TaskRecord(_Frozen):
    """One row of the ``tasks`` table, as a frozen value."""

    task_id: str
    agent_run_id: str
    step_id: str
    tool: str
    side_effect_class: SideEffectClass
    status: TaskStatus
    stage: Stage | None
    lease_owner: str | None
    lease_acquired_at: AwareDatetime | None
    lease_expires_at: AwareDatetime | None
    lease_ttl: timedelta
    claim_generation: int
    attempts: int
    renewal_count: int
    idempotency_key: str
    receipt: StoredReceiptValue | None
    trace: TraceLink
    last_error: str | None
    error_class: str | None
    created_at: AwareDatetime
    updated_at: AwareDatetime
    approval_request: ApprovalRequest | None = None
    """The call a person was last asked to approve (``None``: never asked)."""

    @classmethod
    def from_row(cls, row: Any) -> TaskRecord:  # a SQLAlchemy Row or a mapping
        m = row._mapping if hasattr(row, "_mapping") else row
        converted = {
            "lease_acquired_at": from_ms(m["lease_acquired_at_ms"]),
            "lease_expires_at": from_ms(m["lease_expires_at_ms"]),
            "lease_ttl": timedelta(milliseconds=m["lease_ttl_ms"]),
            "trace": TraceLink.from_mapping(m),
            "created_at": from_ms(m["created_at_ms"]),
            "updated_at": from_ms(m["updated_at_ms"]),
            "approval_request": _request_with_approvals(m),
        }
        return cls(**{name: m[name] for name in cls.model_fields if name not in converted}, **converted)

    def as_json(self) -> dict[str, Any]:
        """The JSON form used by the CLI (``--json``)."""
        return self.model_dump(mode="json")


def _request_with_approvals(m: Any) -> dict[str, Any] | None:
    """A row's approval request, with who approved it so far and when that approval lapses."""
    request = m.get("approval_request")
    if request is None:
        return None
    given = m.get("approvals") or []
    expires_ms = m.get("approval_expires_at_ms")
    return {
        **request,
        "approved_by": [str(a.get("by")) for a in given if isinstance(a, dict)],
        "expires_at": from_ms(expires_ms) if expires_ms is not None else None,
    }


class LeaseEvent(_Frozen):
    """One entry of the evidence trail."""

    event_id: int
    task_id: str
    kind: EventKind
    claim_generation: int
    lease_owner: str | None
    stage: Stage | None
    reason: str | None
    details: dict[str, Any] | None
    trace: TraceLink
    at: AwareDatetime
    authenticated_as: str | None = None
    """The database role the writer authenticated as (PostgreSQL), beside ``lease_owner``."""

    @classmethod
    def from_row(cls, row: Any) -> LeaseEvent:
        m = row._mapping if hasattr(row, "_mapping") else row
        converted = {
            "trace": TraceLink.from_mapping(m),
            "at": from_ms(m["at_ms"]),
            "authenticated_as": m.get("authenticated_as"),
        }
        return cls(**{name: m[name] for name in cls.model_fields if name not in converted}, **converted)


SETTLED_BY_EARLIER_RECEIPT = "earlier_receipt"
"""``settled_by`` of a call that did not run: a receipt stored earlier for its key (or its task) settled it."""
SETTLED_BY_PROBE = "probe"
"""``settled_by`` of a call whose tool's probe found that the action had happened (automatic reconciliation)."""


def settled_note(settled_by: str | None, idempotency_key: str) -> str | None:
    """What a model reads about a call that settled without running its tool to the end (``None``: it ran)."""
    if settled_by == SETTLED_BY_EARLIER_RECEIPT:
        return (
            f"this action (idempotency key {idempotency_key}) had already been done by an earlier call: "
            "it was not run again; the receipt is the earlier one"
        )
    if settled_by == SETTLED_BY_PROBE:
        return (
            f"an earlier attempt of this action (idempotency key {idempotency_key}) had done it: the tool's "
            "probe found it at the downstream, so it was not run again"
        )
    return None


class ToolOutcome(_Frozen):
    """Result of one leased activity, as the workflow records it. ``settled_by``: :data:`SETTLED_BY_EARLIER_RECEIPT`
    or :data:`SETTLED_BY_PROBE` for a call that settled without its tool returning; ``None`` when the tool ran."""

    task_id: str
    status: TaskStatus
    stage: Stage | None
    claim_generation: int
    attempts: int
    receipt: SettlementReceipt | None = None
    result: dict[str, Any] | None = None
    settled_by: str | None = None
    lease_owner: str | None = None
    """The owner of the generation that ended the call."""
    claimed_at: AwareDatetime | None = None
    """When that generation claimed the task (ledger clock)."""
    refused_writes: int | None = None
    """Late holder writes the ledger refused on the task so far, read when a later generation ended the call."""
    approval_request: ApprovalRequest | None = None
    """The call a person is asked to approve, with the approvals given so far (a decision's outcome)."""

    @classmethod
    def of(cls, record: TaskRecord) -> ToolOutcome:
        """The outcome as the ledger's record of the task shows it."""
        return cls(
            task_id=record.task_id,
            status=record.status,
            stage=record.stage,
            claim_generation=record.claim_generation,
            attempts=record.attempts,
            receipt=record.receipt,
            lease_owner=record.lease_owner,
            claimed_at=record.lease_acquired_at,
            approval_request=record.approval_request,
        )


class TaskView(_Frozen):
    """One task as the ``status`` query of a run reports it: ``status`` as the run last learnt it, or how the step
    ended outside the ledger (``failed``, ``skipped``); ``stage`` / ``claim_generation`` / ``lease_owner`` /
    ``progress``: what a running attempt last recorded (its :class:`LeaseProgress`), after it how it ended."""

    task_id: str
    step_id: str
    tool: str
    status: StepStatus
    stage: Stage | None = None
    claim_generation: int | None = None
    attempts: int | None = None
    idempotency_key: str
    receipt: SettlementReceipt | None = None
    error: str | None = None
    lease_owner: str | None = None
    progress: str | None = None
    settled_by: str | None = None
    claimed_at: AwareDatetime | None = None
    """When the generation the view names claimed the task (after a call ended: the one that ended it)."""
    refused_writes: int = 0
    """Late holder writes the ledger refused on the task, as the run learnt them."""
    approval_request: ApprovalRequest | None = None
    """The call a person is asked to approve, once the run asked (``None``: it needs no approval)."""


class LeaseProgress(_Frozen):
    """What a leased attempt tells its own run after the ledger recorded a claim or a renewal: the
    ``agentlease.lease_progress`` signal, proven with its call's key, never the lease token
    (``docs/operator-views.md``).

    Attributes:
        reason: the renewal's reason, or ``claimed`` (at most 500 characters), beside the recorded ``stage``.
        refused_writes: set when the attempt lost its lease: the late writes refused on the task so far.
        proof: ``HMAC-SHA256(call key, the other fields)``, hex.
    """

    step_id: str = Field(max_length=MAX_STEP_ID_CHARS)
    claim_generation: int = Field(ge=1)
    lease_owner: str = Field(max_length=255)
    stage: Stage | None = None
    reason: str = Field(max_length=500)
    refused_writes: int | None = Field(default=None, ge=0)
    proof: str | None = Field(default=None, max_length=64)


class RefusedDecision(_Frozen):
    """A ``decide`` signal the run refused, as the ``status`` query shows it: the ``decision`` as sent, and the
    ``refusal`` (the text an update's validator gives)."""

    decision: str
    step_id: str | None = None
    by: str | None = None
    refusal: str


class RunCarry(_Frozen):
    """What an agent run carries into its next Temporal run when it continues as new: every step's ``views`` so
    far, in order, and ``next_step``, the index of the first one not run yet."""

    views: list[TaskView] = Field(max_length=limits.MAX_STEPS_PER_RUN)
    next_step: int = Field(ge=0)


class RunStatus(_Frozen):
    """Answer of the ``status`` query."""

    agent_run_id: str
    status: RunState
    closed: bool
    tasks: list[TaskView]
    last_decision: str | None = None
    """The run's last operator decision, ``<step>: <approved|...> by <who>: <why>``."""
    refused: list[RefusedDecision] = Field(default_factory=list)
    """``decide`` signals the run refused, oldest first (the last 20)."""
    refused_count: int = 0
    """How many ``decide`` signals the run refused in all."""
    refused_progress: int = 0
    """How many ``agentlease.lease_progress`` signals the run dropped for want of a valid proof."""


AgentRunPlan.model_rebuild()
