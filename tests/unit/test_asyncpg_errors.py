"""asyncpg's error classes are looked at only once asyncpg is imported (a PostgreSQL connection imports it):
a SQLite ledger's process never imports it, and no asyncpg error can reach it."""

from __future__ import annotations

import subprocess
import sys

import asyncpg

from agentlease.ledger.engine import asyncpg_errors, is_refused_value, is_unavailable


def test_without_asyncpg_there_is_no_asyncpg_error() -> None:
    code = (
        "import sys; from agentlease.ledger.engine import asyncpg_errors, is_unavailable; "
        "assert asyncpg_errors('PostgresError') == (); assert not is_unavailable(ValueError('x')); "
        "assert 'asyncpg' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_once_imported_its_classes_are_named() -> None:
    assert asyncpg_errors("PostgresError", "InterfaceError") == (asyncpg.PostgresError, asyncpg.InterfaceError)
    assert is_unavailable(asyncpg.exceptions.CannotConnectNowError("restarting"))
    assert is_refused_value(asyncpg.exceptions.InsufficientPrivilegeError("no"))
    assert not is_unavailable(asyncpg.exceptions.UniqueViolationError("dup"))
