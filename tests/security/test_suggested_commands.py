"""The decision commands ``waiting``, its ``--json`` and the web view suggest are safe to paste into a POSIX shell
(third round): a run id made to run a command (``x$(touch${IFS}PWNED)``) stays one argument, and nothing runs."""

from __future__ import annotations

import subprocess
from pathlib import Path

from agentlease.decisions.table import suggested_commands
from agentlease.enums import TaskStatus

HOSTILE_RUN_IDS = ("x$(touch${IFS}PWNED)", "a`touch PWNED`b", "r;touch PWNED", 'it\'s "quoted" & more', "-n")


def test_every_suggested_command_passes_a_hostile_run_id_to_the_shell_as_one_argument(tmp_path: Path) -> None:
    suggested = 0
    for status in TaskStatus:
        for run_id in HOSTILE_RUN_IDS:
            for line in suggested_commands(status, run_id, "refund"):
                command = line[line.index("agentlease ") :].removeprefix("agentlease ")
                # the suggestion as the shell runs it, with printf in place of agentlease: one argument per line
                printed = subprocess.run(
                    ["sh", "-c", f"printf '%s\\n' {command}"], cwd=tmp_path, capture_output=True, text=True, check=True
                )
                decision, run, step, *_ = printed.stdout.splitlines()
                assert (run, step) == (run_id, "refund"), (line, printed.stdout)
                assert decision in {"approve", "reject", "redrive", "reconcile", "cancel", "abandon"}, decision
                suggested += 1
    assert suggested > 0
    assert list(tmp_path.iterdir()) == []  # nothing ran
