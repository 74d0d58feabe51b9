"""How long-running commands learn that they should stop: the stop signals, as an event or a cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Awaitable
from typing import NoReturn, TypeVar

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


async def to_its_end(awaitable: Awaitable[T]) -> T:
    """``awaitable``'s outcome, awaited to its end even when the caller is cancelled meanwhile: a write that must
    not be abandoned half-way (a release, a settle), whose outcome, an error included, still reaches the caller's
    own handling. A cancel that came meanwhile is raised at the caller's next ``await`` (or ends its task
    cancelled); a cancel of ``awaitable`` itself is raised at once. Unlike ``asyncio.shield``, whose caller leaves
    at the cancel, nothing runs on unheard: no error is lost as "Task exception was never retrieved"."""
    task = asyncio.ensure_future(awaitable)
    held = 0  # the caller's cancels held back while the write ran
    try:
        while True:
            try:
                return await asyncio.shield(task)
            except asyncio.CancelledError:
                if task.cancelled():
                    raise
                held += 1  # the caller's: its outcome is read at the next turn, done or not
    finally:
        current = asyncio.current_task()
        if held and current is not None:
            for _ in range(held):
                current.uncancel()
            current.cancel()


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
