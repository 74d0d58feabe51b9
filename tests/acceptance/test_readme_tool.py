"""docs/plans.md's "Writing a tool", followed literally: its tool, its plan and its shell commands,
taken from the page as they are and run as a user runs them, end with the tool's task settled."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import uuid
from pathlib import Path

import pytest

from .runner import AGENTLEASE, Background, Cli, WriteFile
from .test_cli import FAILED

PAGE = Path(__file__).resolve().parents[2] / "docs" / "plans.md"

DEV_PORTS = (7233, 8233)
"""The ports the guide's `agentlease dev` takes (its defaults: Temporal, its UI)."""

pytestmark = pytest.mark.timeout(300)


def guide() -> str:
    """The "## Writing a tool" section of the page, up to the next section."""
    text = PAGE.read_text()
    section = text[text.index("## Writing a tool") :]
    following = section.find("\n## ", 1)
    return section if following < 0 else section[:following]


def blocks(language: str) -> list[str]:
    """The section's fenced blocks of ``language``, in order."""
    return re.findall(rf"```{language}\n(.*?)```", guide(), re.S)


def readme_tool() -> str:
    """The first Python block of the section: the tool."""
    found = blocks("python")
    assert found, "the Writing a tool section of docs/plans.md has no python block"
    return found[0]


def saved_as(block: str) -> str:
    """The file name the page tells to save ``block`` as (``... as `name`:`` just before it)."""
    before = guide()[: guide().index(block)]
    named = re.findall(r"as `([\w.-]+)`:\s*```\w+\n$", before)
    assert named, f"the page does not say what to save this block as:\n{block}"
    return named[-1]


def commands(block: str) -> list[str]:
    """The commands of a bash block (comments and blank lines left out)."""
    return [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_the_readme_tool_has_one_agentlease_import_line() -> None:
    lines = [line for line in readme_tool().splitlines() if "agentlease" in line and "import" in line]
    assert len(lines) == 1 and lines[0].startswith("from agentlease import "), lines


def test_the_guide_gives_the_tool_a_plan_and_the_commands_that_run_it() -> None:
    [tool] = blocks("python")[:1]
    [plan] = blocks("json")
    first_shell, second_shell = blocks("bash")[:2]
    assert saved_as(tool) == "notes.py" and saved_as(plan).endswith(".json")
    assert [json_step["tool"] for json_step in json.loads(plan)["steps"]] == ["post_note"]
    assert commands(first_shell) == ["PYTHONPATH=. AGENTLEASE_TOOL_MODULES=notes agentlease dev"]
    assert commands(second_shell)[0] == f"agentlease run {saved_as(plan)} --wait"


def _taken(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: past TIME_WAIT
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def test_the_guide_followed_literally_settles_the_tools_task(cli: Cli, write_file: WriteFile) -> None:
    taken = [port for port in DEV_PORTS if _taken(port)]
    if taken:
        pytest.skip(f"the guide's `agentlease dev` takes ports {DEV_PORTS}; {taken} are in use here")
    tool, plan = blocks("python")[0], blocks("json")[0]
    write_file(saved_as(tool), tool)
    write_file(saved_as(plan), plan)
    first_shell, second_shell = (commands(block) for block in blocks("bash")[:2])
    # The shells of a user with the virtualenv active (`source .venv/bin/activate`).
    active = {"PATH": f"{AGENTLEASE.parent}{os.pathsep}{os.environ['PATH']}"}

    # The first shell: its command exactly as the page gives it.
    [stack] = first_shell
    dev = Background(cli, "-c", stack, env=active, program=Path("/bin/bash"))
    try:
        dev.wait_for_line("Ctrl-C stops everything", timeout=120)
        exports = [line.strip() for line in dev.stderr if line.strip().startswith("export ")]
        assert any("AGENTLEASE_TOOL_MODULES=notes" in line for line in exports), dev.stderr
        assert re.search(r"worker:.*tools: .*post_note", "".join(dev.stderr)), dev.stderr

        # The second shell: the export lines pasted, then the page's commands.
        script = "\n".join(["set -e", *exports, *second_shell])
        shell = subprocess.run(
            ["/bin/bash", "-c", script],
            cwd=cli.cwd,
            env=cli.env(active),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert shell.returncode == 0, (shell.stdout, shell.stderr, "".join(dev.stderr))
        assert "Traceback" not in shell.stdout + shell.stderr, shell

        env = dict(pair.split("=", 1) for line in exports for pair in shlex.split(line)[1:])
        run_id = json.loads(Path(cli.cwd / saved_as(plan)).read_text())["agent_run_id"]
        listed = cli("tasks", "--run", run_id, "--json", env=env)
        [record] = json.loads(listed.stdout)
        assert (record["tool"], record["status"], record["stage"]) == ("post_note", "settled", "settled"), listed
        assert record["receipt"]["external_system"] == "publish", listed
        assert record["task_id"] in shell.stdout, shell.stdout  # `tasks --run` printed it

        # As the page says: a worker without the publishing service's address dead-letters the step at
        # its first attempt, with one line naming the setting.
        lacking = {
            **{k: v for k, v in env.items() if k != "AGENTLEASE_PUBLISH_BASE_URL"},
            "AGENTLEASE_TASK_QUEUE": f"guide-{uuid.uuid4().hex[:8]}",
        }
        worker = Background(cli, "worker", env=lacking)
        try:
            worker.wait_for_line(r"worker on ", timeout=60)
            parked = cli("run", saved_as(plan), "--wait", "--json", "--run-id", "no-address", env=lacking, timeout=120)
            assert parked.returncode == FAILED, parked
            [task] = json.loads(cli("tasks", "--run", "no-address", "--json", env=lacking).stdout)
            assert (task["status"], task["attempts"]) == ("dead_lettered", 1), task
            assert "post_note needs AGENTLEASE_PUBLISH_BASE_URL" in task["last_error"], task
        finally:
            worker.stop(signal.SIGINT)
    finally:
        code = dev.stop(signal.SIGINT)
    assert code == 0, "".join(dev.stderr)
