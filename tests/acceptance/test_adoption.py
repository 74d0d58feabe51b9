"""Adoption as a team meets it: the wheel, an existing agent leased, workers as separate processes.

Per framework (OpenAI Agents SDK, Pydantic AI, LangGraph, Google ADK; Strands in the Strands virtualenv:
:data:`~tests.acceptance.adoption_project.STRANDS_RUN`), ``examples/<framework>/`` holds a plain agent on
Temporal with two tools of its own (``before/``) and the same agent leased (``after/``). Here:

- the wheel, installed into a fresh virtualenv, puts one import name into site-packages, and
  imports from a directory holding its own ``activities.py``, ``workflows.py`` and ``worker.py``;
- ``before/`` and ``after/`` differ by at most :data:`DIFF_BUDGET` changed lines
  (:mod:`tests.acceptance.fixture_diff`);
- ``after/``, copied into a project directory of its own and run with the wheel's Python on a
  stock ``temporal server start-dev``, completes a run with one refund;
- SIGKILL: the worker dies inside ``issue_refund``'s external call, after the refund service
  applied the refund and before the tool returned; a second worker takes over at generation 2 and
  the run completes with one refund;
- SIGSTOP: the worker stops inside the external call, before the service applied it; its lease
  lapses, a second worker takes over at generation 2 and completes; the stopped worker resumes and
  its late write is refused by the service (stale fencing token); one refund.

The refund service (``examples/refund_service.py``) runs on threads of this process, with a gate
the test opens (:mod:`tests.acceptance.refund_gate`); the ledger is a SQLite file the project's
processes share, created with ``agentlease db upgrade``.
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client, WorkflowHandle

from agentlease.enums import TaskStatus
from agentlease.ledger.store import Ledger
from agentlease.observability import search_attributes
from agentlease.records import TaskRecord
from tests.acceptance.adoption_project import EXAMPLES, FRAMEWORKS, STRANDS_RUN, WHEEL_EXTRAS, Project
from tests.acceptance.fixture_diff import changed_lines
from tests.acceptance.fleet import Worker
from tests.acceptance.refund_gate import GatedRefunds, Seen, running_refund_service
from tests.acceptance.stock_temporal import StockServer, connect, stock_dev_server
from tests.acceptance.wheel_install import InstalledWheel, build_and_install, clean_env
from tests.eventually import assert_eventually

pytestmark = pytest.mark.timeout(480)

DIFF_BUDGET = 12
"""Most changed lines between a plain agent and the same agent leased (the issue's acceptance)."""

RUN_TIMEOUT_S = 240.0
"""Deadline of one agent run, takeovers included. Default 240s."""

HOLD_TIMEOUT_S = 150.0
"""Deadline for the refund call to reach the service's gate (worker start, two model turns). Default 150s."""

AGENT_WORKFLOW = "SupportAgentWorkflow"
PRIVATE_IMPORT = re.compile(r"\bagentlease(\.\w+)*\._\w+|from agentlease\S* import .*\b_\w+")
"""An import of a private agentlease module or name (``agentlease.tools._wrap``, ``import _x``)."""
AGENTLEASE_SEARCH_ATTRIBUTES = {key.name for key in search_attributes.ALL}


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> InstalledWheel:
    """The wheel, built from this checkout and installed with the run's framework extras in a fresh venv."""
    return build_and_install(tmp_path_factory.mktemp("wheel"), WHEEL_EXTRAS)


@pytest.fixture
def stock_server(wheel: InstalledWheel, tmp_path: Path) -> Iterator[StockServer]:
    """A fresh stock dev server (the wheel's own ``temporal``), for this test alone."""
    with stock_dev_server(wheel.bin("temporal"), tmp_path / "temporal.log") as server:
        yield server


@pytest.fixture(scope="module")
def shared_server(wheel: InstalledWheel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StockServer]:
    """A stock dev server shared by the fault scenarios (each on a task queue of its own)."""
    log = tmp_path_factory.mktemp("temporal") / "temporal.log"
    with stock_dev_server(wheel.bin("temporal"), log) as server:
        yield server


# -- the wheel -------------------------------------------------------------------------------------


FRAMEWORK_IMPORTS = (
    "from agentlease.strands import leased_tool, run_agent"
    if STRANDS_RUN
    else """from agentlease.openai_agents import leased_tool, run_agent
from agentlease.pydantic_ai import LeasedToolset
from agentlease.langgraph import leased_tool_messages, leased_tools_node, run_graph
from agentlease.google_adk import leased_tool as adk_leased_tool, run_agent as run_adk_agent"""
)
PUBLIC_IMPORTS = f"""
import agentlease
from agentlease import AgentLeasePlugin, AgentLeaseSettings, lease, leased
{FRAMEWORK_IMPORTS}
import agentlease.cli.app
import os
import activities, worker, workflows  # the user's own modules, from the working directory
assert os.path.dirname(os.path.abspath(activities.__file__)) == os.getcwd(), activities.__file__
print(agentlease.__file__)
"""


def test_the_wheel_installs_one_import_name_and_imports_beside_a_users_modules(
    wheel: InstalledWheel, tmp_path: Path
) -> None:
    """The wheel's RECORD names one top-level package and the console script; from a directory of a
    user's own ``activities.py``, ``workflows.py`` and ``worker.py`` the public names import, from
    site-packages, and the console script runs."""
    assert wheel.top_level == {"agentlease"}, sorted(wheel.top_level)
    assert wheel.scripts == {"agentlease"}, sorted(wheel.scripts)

    project = tmp_path / "project"
    project.mkdir()
    for name in ("activities.py", "workflows.py", "worker.py"):
        (project / name).write_text(f'"""A user\'s own {name}."""\n')
    env = clean_env()
    imported = subprocess.run(
        [str(wheel.python), "-c", PUBLIC_IMPORTS],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip().startswith(str(wheel.venv)), imported.stdout
    helped = subprocess.run(
        [str(wheel.bin("agentlease")), "--help"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert helped.returncode == 0, helped.stderr


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_leasing_the_agent_changes_at_most_twelve_lines(framework: str) -> None:
    """``diff before/ after/``: at most :data:`DIFF_BUDGET` changed lines, and none for fencing: ``issue_refund``
    declares its downstream (``fenced=``) and sends with the team's own client; the examples import only public
    names."""
    diff = changed_lines(EXAMPLES / framework / "before", EXAMPLES / framework / "after")
    assert diff.changed <= DIFF_BUDGET, diff
    assert diff.marked == 0, diff  # no line of the tool is there for fencing
    tools = (EXAMPLES / framework / "after" / "activities.py").read_text()
    assert "fenced=REFUND_SERVICE_URL)" in tools and "downstream_headers" not in tools
    for path in (EXAMPLES / framework).glob("*/*.py"):
        private = PRIVATE_IMPORT.search(path.read_text())
        assert private is None, f"{path}: {private[0] if private else ''} is not a public name"


# -- a run on a stock dev server -------------------------------------------------------------------


async def registered_search_attributes(client: Client) -> set[str]:
    listed = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace)
    )
    return set(listed.custom_attributes)


@dataclass
class Adoption:
    """One scenario: the project, the refund service, a client of the dev server."""

    project: Project
    refunds: GatedRefunds
    client: Client
    order_id: str
    run_id: str

    @property
    def prompt(self) -> str:
        return f"Refund order {self.order_id}"

    async def worker(self) -> Worker:
        return await self.project.polling(self.client, self.project.start_worker())

    async def start(self) -> WorkflowHandle[object, str]:
        queue = self.project.env["AGENTLEASE_TASK_QUEUE"]
        return await self.client.start_workflow(
            AGENT_WORKFLOW, self.prompt, id=self.run_id, task_queue=queue, result_type=str
        )

    async def held(self, holder: Worker) -> None:
        """Wait until the refund request waits at the service's gate (its worker still alive)."""

        def at_the_gate() -> None:
            assert holder.alive, f"worker {holder.identity} exited:\n{holder.stderr_tail(40)}"
            assert self.refunds.held.is_set(), "the refund has not reached the gate"

        await assert_eventually(at_the_gate, timeout=HOLD_TIMEOUT_S, interval=0.2, message="the refund at the gate")

    async def refund_task(self) -> TaskRecord:
        ledger = Ledger.from_url(self.project.ledger_url)
        try:
            tasks = [task for task in await ledger.list_tasks(self.run_id) if task.tool == "issue_refund"]
        finally:
            await ledger.close()
        assert len(tasks) == 1, tasks
        return tasks[0]


@asynccontextmanager
async def adoption(
    framework: str, wheel: InstalledWheel, server: StockServer, root: Path, *, variant: str = "after"
) -> AsyncIterator[Adoption]:
    """The project ``examples/<framework>/<variant>/`` in ``root``, its ledger created, the refund service up."""
    client = await connect(server, root / "temporal.log")
    tag = uuid.uuid4().hex[:8]
    with running_refund_service() as (refunds, url):
        env = {
            "AGENTLEASE_TEMPORAL_ADDRESS": server.address,
            "AGENTLEASE_TASK_QUEUE": f"adoption-{tag}",
            "REFUND_SERVICE_URL": url,
        }
        project = Project.copy(framework, root, wheel, env, variant=variant)
        try:
            await project.upgrade_ledger()
            yield Adoption(project, refunds, client, f"A-{tag}", f"support-{framework}-{tag}")
        finally:
            await asyncio.to_thread(project.stop_workers)


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_the_leased_agent_completes_a_run_on_a_stock_dev_server(
    framework: str, wheel: InstalledWheel, stock_server: StockServer, tmp_path: Path
) -> None:
    """A worker with only ``AgentLeasePlugin`` (beside the framework's own plugin) on a dev server with
    nothing registered: it registers agentlease's search attributes itself, ``python starter.py``
    sees the agent answer after one refund, and the run's ``AgentLeaseStatus`` ends ``completed``."""
    async with adoption(framework, wheel, stock_server, tmp_path) as a:
        assert not AGENTLEASE_SEARCH_ATTRIBUTES & await registered_search_attributes(a.client)
        await a.worker()
        answer = await a.project.ask(a.prompt)
        assert f"Refunded order {a.order_id}" in answer, answer
        assert a.refunds.effects(a.order_id) == 1
        registered = await registered_search_attributes(a.client)
        assert registered >= AGENTLEASE_SEARCH_ATTRIBUTES, registered

        async def run_completed() -> None:
            query = f'TaskQueue = "{a.project.env["AGENTLEASE_TASK_QUEUE"]}"'
            runs = [run async for run in a.client.list_workflows(query)]
            assert len(runs) == 1, runs
            status = runs[0].typed_search_attributes.get(search_attributes.RUN_STATUS)
            assert status == "completed", f"AgentLeaseStatus of {runs[0].id}: {status}"

        await assert_eventually(run_completed, timeout=30, interval=0.5, message="the run's AgentLeaseStatus")


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_the_plain_agent_it_starts_from_completes_a_run_too(
    framework: str, wheel: InstalledWheel, shared_server: StockServer, tmp_path: Path
) -> None:
    """``before/``, the agent as a team has it (no agentlease in it), runs on the same wheel's
    dependencies and refunds once: the diff above is between two working agents."""
    async with adoption(framework, wheel, shared_server, tmp_path, variant="before") as a:
        await a.worker()
        answer = await a.project.ask(a.prompt)
        assert f"Refunded order {a.order_id}" in answer, answer
        assert a.refunds.requests() == [Seen(None, "applied")], a.refunds.requests()


# -- faults inside the refund's external call ------------------------------------------------------


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_a_worker_killed_after_the_refund_is_taken_over_at_generation_two_with_one_refund(
    framework: str, wheel: InstalledWheel, shared_server: StockServer, tmp_path: Path
) -> None:
    """SIGKILL inside ``issue_refund``'s external call, after the service refunded and before the tool
    returned: a second worker retries at generation 2 with the same idempotency key, the service
    answers with the first refund, the run completes; one refund."""
    async with adoption(framework, wheel, shared_server, tmp_path) as a:
        a.refunds.hold_next("after")
        first = await a.worker()
        handle = await a.start()
        await a.held(first)
        assert a.refunds.effects(a.order_id) == 1  # applied; its answer waits at the gate
        # Killed before the second worker starts: under load that start can outlast the first attempt's
        # own patience, whose retry would then run (and settle at generation 2) on the first worker.
        first.signal(signal.SIGKILL)
        second = await a.worker()

        answer = await asyncio.wait_for(handle.result(), RUN_TIMEOUT_S)
        task = await a.refund_task()

    assert f"Refunded order {a.order_id}" in answer, answer
    assert a.refunds.effects(a.order_id) == 1
    assert a.refunds.requests() == [Seen(1, "applied"), Seen(2, "replayed")], a.refunds.requests()
    assert (task.status, task.claim_generation, task.lease_owner) == (TaskStatus.SETTLED, 2, second.identity), task


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_a_paused_worker_is_taken_over_and_its_late_refund_is_refused_by_the_fence(
    framework: str, wheel: InstalledWheel, shared_server: StockServer, tmp_path: Path
) -> None:
    """SIGSTOP inside ``issue_refund``'s external call, before the service applied the refund: the
    lease (5 s) lapses, a second worker refunds at generation 2 and the run completes; resumed, the
    first worker's request reaches the service late and is refused as a stale fencing token; one
    refund, and the ledger keeps generation 2's settlement."""
    async with adoption(framework, wheel, shared_server, tmp_path) as a:
        a.refunds.hold_next("before")
        first = await a.worker()
        handle = await a.start()
        await a.held(first)
        first.signal(signal.SIGSTOP)
        second = await a.worker()

        answer = await asyncio.wait_for(handle.result(), RUN_TIMEOUT_S)
        assert a.refunds.requests() == [Seen(2, "applied")], a.refunds.requests()
        first.signal(signal.SIGCONT)
        a.refunds.open()

        def refused_late() -> None:
            assert a.refunds.requests() == [Seen(2, "applied"), Seen(1, "stale")], a.refunds.requests()

        await assert_eventually(refused_late, timeout=60, message="the resumed worker's refund refused")
        task = await a.refund_task()

    assert f"Refunded order {a.order_id}" in answer, answer
    assert a.refunds.effects(a.order_id) == 1
    assert (task.status, task.claim_generation, task.lease_owner) == (TaskStatus.SETTLED, 2, second.identity), task
