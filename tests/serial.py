"""Tests marked ``serial`` run alone while the rest of the suite runs in parallel (pytest-xdist).

A test whose guarantee is about real worker processes on a short lease (2 s) must not share the
2 cores with other tests: a renewal starved of CPU past the lease is a takeover the test did not
ask for. Every test of an xdist run passes through :class:`Turnstile`: a ``serial`` test waits
until the tests already running have finished and keeps new ones out until it is over; the others
run side by side. A process keeps the room from one ``serial`` test to the next (the tests of a
serial file run in one go: the others, thousands of quick ones, would otherwise pass one at a time
between them). Without xdist (one process) nothing waits.

The locks are ``flock`` on two files shared by the workers of one run (named by xdist's run id):
the gate orders the arrivals (a waiting ``serial`` test is not overtaken), the room holds the tests
that run (shared by parallel tests, exclusive to a ``serial`` one).
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path

RUN_ID_VARIABLE = "PYTEST_XDIST_TESTRUNUID"
"""Set by pytest-xdist in each worker: the run id its workers share."""


def lock_dir(run_id: str) -> Path:
    """Where the lock files of the xdist run ``run_id`` live."""
    return Path(tempfile.gettempdir()) / f"agentlease-tests-{run_id}"


class Turnstile:
    """Lets ``serial`` tests run alone and the others together, across the worker processes of one run."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(exist_ok=True)
        self._gate = os.open(directory / "gate", os.O_RDWR | os.O_CREAT, 0o600)
        self._room = os.open(directory / "room", os.O_RDWR | os.O_CREAT, 0o600)
        self._alone: bool | None = None
        """How this process holds the room: alone, beside others, or not at all (``None``)."""

    @classmethod
    def of_this_worker(cls) -> Turnstile | None:
        """The turnstile of this xdist worker's run; ``None`` outside xdist."""
        run_id = os.environ.get(RUN_ID_VARIABLE)
        return cls(lock_dir(run_id)) if run_id else None

    def enter(self, *, alone: bool) -> None:
        """Take the room, alone (``alone=True``) or beside the other parallel tests; a no-op while this
        process still holds it from the ``serial`` test before."""
        if self._alone is not None:
            return
        fcntl.flock(self._gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(self._gate, fcntl.LOCK_UN)
        self._alone = alone

    def leave(self) -> None:
        """Give the room back (and the gate, after a ``serial`` test)."""
        fcntl.flock(self._room, fcntl.LOCK_UN)
        if self._alone:
            fcntl.flock(self._gate, fcntl.LOCK_UN)
        self._alone = None
