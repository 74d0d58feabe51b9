"""One keyed call at a downstream's edge, as the MCP guard and the HTTP middleware run it: its handler shielded
from its client's disconnect, its key ended as ``docs/edge.md`` ("A key's life") says."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any, TypeVar

import anyio
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agentlease.errors import ConfigurationError, StaleFencingTokenError
from agentlease.fencing import FencingToken, advance_fence, refusals_told
from agentlease.idempotency.store import Claimed, IdempotencyStore, StoredResponse

_T = TypeVar("_T")


class Verdict(Enum):
    """What a handler's result says of its call, as its guard reads it."""

    ANSWERED = "answered"
    """A definite answer (an MCP result that is not an error; an HTTP status below 500): stored and replayed."""
    FAILED = "failed"
    """A failure the handler did not vouch for (an MCP error result; an HTTP 5xx): the key is held in doubt."""
    ASKED = "asked"
    """The handler asked its client for more input before it could act (an MCP ``InputRequiredResult``): nothing is
    stored, the key is given back for the round that brings the answers."""


@dataclass(eq=False)
class GuardedCall:
    """What a guarded handler knows of its call (:func:`current_call`).

    Attributes:
        idempotency_key: the call's key as the client sent it (not scoped to the caller); ``None`` for a fenced
            MCP call without one (``LeaseGuard(require_key=False)``), whose fence :func:`effect_transaction`
            checks at the commit.
        fencing: the fenced resource (the caller's own copy of it) and the call's generation; ``None`` when the
            call carried no token.
        caller: the caller the key is scoped to (``""``: anonymous, or the one client of a stdio server).
        tool: the MCP tool called; ``None`` for an HTTP request.
        lease_expires_at: when the client's lease lapses unless renewed, by its estimate; ``None`` if not sent.
        resource: the fenced resource as the client named it; ``None`` when the call carried no token.
    """

    idempotency_key: str | None
    fencing: FencingToken | None
    caller: str
    tool: str | None = None
    lease_expires_at: datetime | None = None
    resource: str | None = None
    _store: IdempotencyStore | None = field(default=None, repr=False)
    _claim: Claimed | None = field(default=None, repr=False)
    _answer_of: Callable[[Any], StoredResponse] | None = field(default=None, repr=False)
    _clock: Callable[[], datetime] | None = field(default=None, repr=False)
    _promised: bool = field(default=False, repr=False)
    _no_effect: bool = field(default=False, repr=False)
    _in_transaction: bool = field(default=False, repr=False)
    _committed: bool = field(default=False, repr=False)
    _fence_refused: StaleFencingTokenError | None = field(default=None, repr=False)
    _ended: bool = field(default=False, repr=False)

    def _now(self) -> datetime | None:
        return None if self._clock is None else self._clock()

    def not_applied(self) -> None:
        """Say that this call failed before any effect: its key is given back when the handler ends, and a
        retry with it runs the handler again. Say it only when it is true (``docs/edge.md``)."""
        self._no_effect = True

    @property
    def committed(self) -> bool:
        """Whether the call's effect committed with its key (:func:`effect_transaction`)."""
        return self._committed


_current: ContextVar[GuardedCall | None] = ContextVar("agentlease_guarded_call", default=None)


def current_call() -> GuardedCall | None:
    """The guarded call the running handler serves; ``None`` outside one (an unguarded handler; a call with
    neither key nor fencing token)."""
    return _current.get()


@contextmanager
def serving(call: GuardedCall) -> Iterator[None]:
    """Make ``call`` the :func:`current_call` of the code in the block, which records a refusal of the call's own
    fence, in the guard store's database, in it: the refusal the guard answers."""
    token, told = _current.set(call), refusals_told.set(functools.partial(_refused_in, call))
    try:
        yield
    finally:
        refusals_told.reset(told)
        _current.reset(token)


def _refused_in(call: GuardedCall, refused: StaleFencingTokenError, engine: AsyncEngine) -> None:
    own = call.fencing is not None and refused.resource_key == call.fencing.resource_key
    if own and call._store is not None and _same_database(engine, call._store.engine):
        call._fence_refused = refused


class EffectTransaction:
    """The open transaction of :func:`effect_transaction`.

    Attributes:
        conn: the transaction's connection: every write of the effect goes through it.
    """

    def __init__(self, conn: AsyncConnection) -> None:
        self.conn = conn
        self.answer: Any = None
        self.answered = False

    def done(self, answer: Any) -> None:
        """The call's answer, stored under its key in this transaction: what a retry with the key gets
        (the MCP tool's return value; the HTTP handler's response)."""
        self.answer = answer
        self.answered = True


def _same_database(a: AsyncEngine, b: AsyncEngine) -> bool:
    return a is b or a.url.render_as_string(hide_password=True) == b.url.render_as_string(hide_password=True)


@asynccontextmanager
async def effect_transaction(engine: AsyncEngine) -> AsyncIterator[EffectTransaction]:
    """A transaction whose commit is the call's effect AND its key becoming done with the answer given to
    :meth:`EffectTransaction.done`, or neither (the fence is checked first; an exception in the block gives the
    key back). For a fenced call without a key (an MCP guard's ``require_key=False``), or in a task the handler left
    running once its call ended, the fence is checked and nothing is stored. Outside a guarded call, a plain
    transaction.

    Args:
        engine: the database of the effect, which must be the guard's (its ``IdempotencyStore``'s).

    Yields:
        The :class:`EffectTransaction`.

    Raises:
        StaleFencingTokenError: a newer generation holds the call's resource; nothing was written.
        KeyTakenOverError: the key was taken over after its lock timed out; nothing was written.
        ConfigurationError: the guard's keys live in another database, the block did not call ``done``, or
            the call already committed an effect transaction.
    """
    call = current_call()
    if call is None or call._store is None:
        async with engine.begin() as conn:
            yield EffectTransaction(conn)
        return
    # Once the call ended (a task its handler left running), its key is settled: the fence is still checked.
    store, claim = call._store, None if call._ended else call._claim
    if not _same_database(engine, store.engine):
        raise ConfigurationError(
            "effect_transaction: the guard keeps its keys and fences in another database, so they cannot "
            "commit with the effect; open it on the guard's store.engine"
        )
    if claim is not None and call._in_transaction:  # a call without a key stores nothing: each commit is fenced
        raise ConfigurationError("effect_transaction: a guarded call commits its effect in one transaction")
    call._in_transaction = True
    if claim is not None and not call._promised:
        await store.promise_effect_in_transaction(claim)
    ended = False
    try:
        async with engine.begin() as conn:
            if call.fencing is not None:
                await advance_fence(conn, call.fencing.resource_key, call.fencing.generation)
            transaction = EffectTransaction(conn)
            yield transaction
            if claim is not None:  # a call without a key has its fence checked, and no answer to store
                if not transaction.answered:
                    raise ConfigurationError("effect_transaction: call done(answer) before the block ends")
                assert call._answer_of is not None
                await store.record_done(conn, claim, call._answer_of(transaction.answer), now=call._now())
            ended = True
    except BaseException:
        if not ended:  # rolled back before its commit: nothing of the effect happened
            call.not_applied()
        raise
    call._committed = True


async def run_guarded(
    call: GuardedCall,
    handler: Callable[[], Awaitable[_T]],
    verdict: Callable[[_T], tuple[Verdict, StoredResponse | None]],
) -> _T:
    """Run a claimed call's handler, shielded from its client's disconnect, and end its key (``docs/edge.md``).

    Args:
        call / handler: the claimed call (its store and claim set); runs the handler once.
        verdict: what the handler's result says, and the answer to store (``None`` for :attr:`Verdict.ASKED`).

    Returns:
        The handler's result; whatever the handler or ``verdict`` raised is raised after the key was settled.
    """
    store, claim = call._store, call._claim
    assert store is not None and claim is not None
    with serving(call), anyio.CancelScope(shield=True):
        try:
            result = await handler()
            said, answer = verdict(result)  # an answer that cannot be stored leaves the handler's effect in doubt
        except BaseException as exc:
            if exc is call._fence_refused:
                call.not_applied()  # the handler let its own fence's refusal out: it says its write did not happen
            await _settle(store, claim, call, None)
            raise
        if said is Verdict.ASKED:
            call.not_applied()
        await _settle(store, claim, call, answer if said is Verdict.ANSWERED else None)
    return result


async def _settle(store: IdempotencyStore, claim: Claimed, call: GuardedCall, answer: StoredResponse | None) -> None:
    call._ended = True  # from here on, what the call's handler left running is outside it
    if call.committed:
        if answer is not None:  # the handler's whole answer replaces the one stored with the effect
            await store.replace_answer(claim, answer)
    elif call._no_effect:
        await store.release(claim)
    elif answer is not None:
        await store.complete(claim, answer, now=call._now())
    else:
        await store.hold_in_doubt(claim, now=call._now())
