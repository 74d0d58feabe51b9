"""The tool of docs/plans.md's "Writing a tool", taken from the page as it is, served by an
`agentlease worker` process beside `agentlease dev`, settles through `agentlease run --wait`."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from .runner import Background, Cli, WriteFile
from .test_cli import free_port

PAGE = Path(__file__).resolve().parents[2] / "docs" / "plans.md"

pytestmark = pytest.mark.timeout(240)


def readme_tool() -> str:
    """The first Python block after the page's "## Writing a tool" heading."""
    text = PAGE.read_text()
    section = text[text.index("## Writing a tool") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "the Writing a tool section of docs/plans.md has no python block"
    return match.group(1)


def test_the_readme_tool_has_one_agentlease_import_line() -> None:
    lines = [line for line in readme_tool().splitlines() if "agentlease" in line and "import" in line]
    assert len(lines) == 1 and lines[0].startswith("from agentlease import "), lines


def all_exports(dev: Background) -> dict[str, str]:
    """Every ``NAME=value`` that `agentlease dev` tells a second shell to export."""
    exports: dict[str, str] = {}
    dev.wait_for_line("Ctrl-C stops everything", timeout=120)
    for line in dev.stderr:
        if line.strip().startswith("export "):
            exports.update(tuple(pair.split("=", 1)) for pair in line.split()[1:])  # type: ignore[misc]
    return exports


def test_a_tool_written_from_the_readme_runs_under_a_worker_and_settles(
    cli: Cli, background: Callable[..., Background], write_file: WriteFile
) -> None:
    write_file("notes.py", readme_tool())
    dev = background("dev", "--port", str(free_port()), "--ui-port", str(free_port()))
    shell = all_exports(dev)
    assert "AGENTLEASE_PUBLISH_BASE_URL" in shell, dev.stderr
    # The user's worker serves the new tool on its own task queue, beside the dev stack's worker.
    env = {
        **shell,
        "AGENTLEASE_TASK_QUEUE": f"readme-{uuid.uuid4().hex[:8]}",
        "AGENTLEASE_TOOL_MODULES": "notes",
        "PYTHONPATH": str(cli.cwd),
    }
    worker = background("worker", env=env)
    worker.wait_for_line(r"worker on ", timeout=60)

    plan = {
        "steps": [
            {
                "step_id": "note",
                "tool": "post_note",
                "arguments": {"slug": "readme-note", "title": "From the README", "body": "It settles."},
            }
        ]
    }
    write_file("plan.json", json.dumps(plan))
    done = cli("run", "plan.json", "--wait", "--json", "--run-id", "readme-run", env=env, timeout=120)
    assert done.returncode == 0, done
    [task] = json.loads(done.stdout)["tasks"]
    assert (task["status"], task["receipt"]["external_system"]) == ("settled", "publish"), done

    listed = cli("tasks", "--run", "readme-run", "--json", env=env)
    [record] = json.loads(listed.stdout)
    assert (record["tool"], record["status"], record["stage"]) == ("post_note", "settled", "settled"), listed
    assert record["receipt"]["details"] == {"slug": "readme-note"}, listed
