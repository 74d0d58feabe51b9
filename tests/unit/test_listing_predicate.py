"""The partial index of ``agentlease waiting`` names exactly the statuses that wait for a person."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import agentlease.migrations.versions as versions
from agentlease.enums import TaskStatus
from agentlease.ledger.tables import WAITING_PREDICATE


def _statuses(predicate: str) -> set[str]:
    return set(re.findall(r"'([a-z_]+)'", predicate))


def test_the_waiting_predicate_names_every_status_that_waits_for_a_person() -> None:
    assert _statuses(WAITING_PREDICATE) == {s.value for s in TaskStatus if s.waits_for_person}


def test_the_migration_builds_the_index_the_schema_declares() -> None:
    path = Path(versions.__file__).parent / "0002_operator_indexes.py"
    spec = importlib.util.spec_from_file_location("migration_0002", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.WAITING == WAITING_PREDICATE
