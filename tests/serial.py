"""Tests marked ``serial`` run alone while the rest of the suite runs in parallel (pytest-xdist).

A test whose guarantee is about real worker processes on a short lease (2 s) must not share the
2 cores with other tests: a renewal starved of CPU past the lease is a takeover the test did not
ask for. Every test of an xdist run passes through :class:`Turnstile`: a ``serial`` test waits
until the tests already running have finished and keeps new ones out until it is over; the others
run side by side. Without xdist (one process) nothing waits.

The locks are ``flock`` on two files shared by the workers of one run (named by xdist's run id):
the gate orders the arrivals (a waiting ``serial`` test is not overtaken), the room holds the tests
that run (shared by parallel tests, exclusive to a ``serial`` one).
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
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

    @classmethod
    def of_this_worker(cls) -> Turnstile | None:
        """The turnstile of this xdist worker's run; ``None`` outside xdist."""
        run_id = os.environ.get(RUN_ID_VARIABLE)
        return cls(lock_dir(run_id)) if run_id else None

    @contextmanager
    def enter(self, *, alone: bool) -> Iterator[None]:
        """Hold the room, alone (``alone=True``) or beside the other parallel tests, while the block runs."""
        fcntl.flock(self._gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(self._gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(self._room, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(self._gate, fcntl.LOCK_UN)
