"""The replay floor (``agentlease/workflow/_versions.py``): one module lists every patch id the library asks for."""

from __future__ import annotations

import re
from pathlib import Path

import agentlease
from agentlease.workflow import _versions

PACKAGE = Path(agentlease.__file__).resolve().parent


def _release(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def test_only_the_versions_module_asks_temporal_for_patches() -> None:
    asking = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if re.search(r"\b(patched|deprecate_patch)\(", path.read_text())
    )
    assert asking == ["workflow/_versions.py"]


def test_every_patch_is_listed_with_a_release_at_or_above_the_floor() -> None:
    assert _versions.FLOOR_MARKER in _versions.PATCHES
    floor = _release(_versions.REPLAY_FLOOR)
    assert all(_release(release)[:2] >= floor for release in _versions.PATCHES.values()), _versions.PATCHES
    assert _release(agentlease.__version__)[:2] >= floor


def test_the_refusal_is_one_line_naming_the_floor() -> None:
    assert _versions.BELOW_FLOOR.splitlines() == [_versions.BELOW_FLOOR]
    assert f"agentlease < {_versions.REPLAY_FLOOR}" in _versions.BELOW_FLOOR
