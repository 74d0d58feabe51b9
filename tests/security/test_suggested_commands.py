"""The decision commands ``waiting``, its ``--json`` and the web view suggest are safe to paste into a POSIX shell
(third round): a run id made to run a command (``x$(touch${IFS}PWNED)``) stays one argument, and nothing runs."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from agentlease.decisions.table import suggested_commands
from agentlease.enums import TaskStatus

NOWHERE = {"AGENTLEASE_TEMPORAL_ADDRESS": "127.0.0.1:1", "AGENTLEASE_LEDGER_URL": "sqlite:////nonexistent/ledger.db"}
"""Where the commands reach nothing: what they read of their arguments is all that is tested."""

HOSTILE_RUN_IDS = ("x$(touch${IFS}PWNED)", "a`touch PWNED`b", "r;touch PWNED", 'it\'s "quoted" & more', "-n", "-rf2")


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
                decision, *args = printed.stdout.splitlines()
                run, step = args[args.index("--") + 1 :] if "--" in args else args[:2]
                assert (run, step) == (run_id, "refund"), (line, printed.stdout)
                assert decision in {"approve", "reject", "redrive", "reconcile", "cancel", "abandon"}, decision
                suggested += 1
    assert suggested > 0
    assert list(tmp_path.iterdir()) == []  # nothing ran


def test_a_suggested_command_for_a_run_id_beginning_with_a_dash_is_read_as_its_ids() -> None:
    """``agentlease reconcile -rf2 s1 ...`` was refused ``No such option: -r``: what ``waiting`` suggested failed."""
    from typer.testing import CliRunner

    from agentlease.cli.app import app

    for status in TaskStatus:
        for line in suggested_commands(status, "-rf2", "refund"):
            args = shlex.split(line[line.index("agentlease ") :])[1:]
            args = [{"WHO": "alice", "WHY": "seen"}.get(a, a) for a in args]
            if "--action" in args:
                args[args.index("--action") + 1] = "abandon"
            result = CliRunner().invoke(app, args, env=NOWHERE)
            # 1: it read its ids and went on to reach the ledger or Temporal; 2: a usage error
            assert result.exit_code == 1 and "No such option" not in result.output, (line, result.output)
