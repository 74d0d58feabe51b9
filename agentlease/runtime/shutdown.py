"""How long-running commands learn that they should stop: the stop signals, as an event or a cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Awaitable
from typing import Any, NoReturn, TypeVar

from agentlease.errors import AgentLeaseError

T = TypeVar("T")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""SIGTERM (a supervisor), SIGINT (Ctrl-C) and SIGHUP (the terminal went away)."""


def stop_event() -> asyncio.Event:
    """An event the running loop (the caller's) sets on any of :data:`STOP_SIGNALS`."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    return stop


async def stopped_by_signals(main: Awaitable[T]) -> T:
    """Run ``main`` so that SIGTERM and SIGHUP cancel it as Ctrl-C does, closing every ``async with`` on the way
    out. AgentLeaseError: a signal stopped it (after everything it started was stopped)."""
    task = asyncio.ensure_future(main)
    loop = asyncio.get_running_loop()
    received: list[str] = []

    def stop(sig: signal.Signals) -> None:
        if not received:  # once only: the clean-up must run to its end (uvicorn raises a captured signal again)
            task.cancel()
        received.append(sig.name)

    for sig in (s for s in STOP_SIGNALS if s is not signal.SIGINT):  # asyncio.run handles Ctrl-C
        loop.add_signal_handler(sig, stop, sig)
    try:
        return await task
    except asyncio.CancelledError:
        if not received:
            raise
        raise AgentLeaseError(f"stopped by {received[0]}; everything it started is stopped") from None


WAIT_AFTER_CANCEL_S = 10.0
"""How long :func:`to_its_end` keeps its cancelled caller waiting for the write. Default 10 s."""


async def to_its_end(awaitable: Awaitable[T], *, wait_after_cancel_s: float = WAIT_AFTER_CANCEL_S) -> T:
    """``awaitable``'s outcome; a write that must not be abandoned half-way (a release, a settle) runs to its end
    even when the caller is cancelled meanwhile. The caller then waits for it, at most ``wait_after_cancel_s``
    (default :data:`WAIT_AFTER_CANCEL_S`), and the cancel is raised as it came, every cancel counted (so
    ``asyncio.timeout`` and task groups read it as theirs): what must happen with the write's outcome, an error
    included, belongs inside ``awaitable``. A write still running then goes on alone, and its outcome is read when
    it ends. Unlike ``asyncio.shield``, nothing is left unread ("Task exception was never retrieved")."""
    task = asyncio.ensure_future(awaitable)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError as exc:
        if task.cancelled():
            raise
        cancel = exc
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_after_cancel_s
    while not task.done() and loop.time() < deadline:
        try:
            await asyncio.wait({task}, timeout=deadline - loop.time())
        except asyncio.CancelledError as again:  # counted by the task like the first: one raise answers all
            cancel = again
    task.add_done_callback(_read_outcome)
    raise cancel


def _read_outcome(task: asyncio.Future[Any]) -> None:
    """Mark a finished write's outcome read: its caller, cancelled, has left (:func:`to_its_end`)."""
    if not task.cancelled():
        task.exception()


__all__ = ["STOP_SIGNALS", "stop_event", "stopped_by_signals", "to_its_end"]


def exit_process(code: int) -> NoReturn:
    """Leave the process with ``code`` once everything it started has stopped, without finalizing the interpreter
    (the Temporal SDK's runtime threads could turn a clean exit into SIGABRT then): spans, logs and the standard
    streams are flushed, then ``os._exit``."""
    from agentlease.observability.tracing import flush

    flush()  # spans still buffered for the OTLP exporter (tracing on), before atexit is skipped
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError):  # a reader that went away: nothing left to deliver to
            stream.flush()
    os._exit(code)
