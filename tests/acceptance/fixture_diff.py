"""How far a leased agent is from the plain one: the changed lines between ``before/`` and ``after/``.

The measure (``examples/README.md`` documents it):

- the files of both directories are compared line by line (``difflib``, as ``diff -r`` pairs them);
- blank lines do not count (``diff --ignore-blank-lines``): moving an import block is not work;
- a line ending in a marker comment, ``# fencing`` or ``# readback``, does not count, nor the line it
  rewrites: it is what a tool adds or changes to send its fencing token or to read its effect back,
  which the adoption budget leaves out;
- in each hunk, a line rewritten counts once: the hunk counts ``max(removed, added)`` lines.

:func:`changed_lines` also reports the plain ``+added/-removed`` totals of the same comparison.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

MARKER = re.compile(r"#\s*(fencing|readback)\s*$")
"""A trailing comment that marks a line as what a tool adds for fencing or readback."""


def _marked(line: str) -> bool:
    return bool(MARKER.search(line))


@dataclass(frozen=True)
class FixtureDiff:
    """The difference between two fixture directories.

    Attributes:
        changed: changed lines by the measure above.
        added / removed: counted lines only in ``after/`` / only in ``before/``.
        marked: lines not counted because of a marker.
        per_file: ``changed`` by file name.
    """

    changed: int
    added: int
    removed: int
    marked: int
    per_file: dict[str, int]


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def changed_lines(before: Path, after: Path) -> FixtureDiff:
    """Compare the ``*.py`` files of ``before`` and ``after`` (a file in one only compares to nothing)."""
    names = sorted({p.name for p in before.glob("*.py")} | {p.name for p in after.glob("*.py")})
    changed = added = removed = marked = 0
    per_file: dict[str, int] = {}
    for name in names:
        old, new = _lines(before / name), _lines(after / name)
        marked += sum(1 for line in new if _marked(line)) + sum(1 for line in old if _marked(line))
        old_kept = [line for line in old if line.strip()]
        new_kept = [line for line in new if line.strip()]
        matcher = difflib.SequenceMatcher(a=old_kept, b=new_kept, autojunk=False)
        in_file = 0
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag == "equal":
                continue
            gone = [line for line in old_kept[i1:i2] if not _marked(line)]
            came = [line for line in new_kept[j1:j2] if not _marked(line)]
            rewritten = (j2 - j1) - len(came)  # marked lines of the hunk, each rewriting at most one line
            gone_counted = max(0, len(gone) - rewritten)
            removed += gone_counted
            added += len(came)
            in_file += max(gone_counted, len(came))
        per_file[name] = in_file
        changed += in_file
    return FixtureDiff(changed, added, removed, marked, per_file)
