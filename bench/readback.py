"""Duplicates of a tool's effect when its downstream shows a write late, with and without the tool's settle window
(``docs/action-keys-and-probes.md``, "A downstream that shows a write late").

::

    python -m bench.readback --trials 20 --lag-ms 200 --scenario kill --scenario dropped

Each trial is one agent run of one ``unsafe`` call (no key, no fence) against the tests' matrix downstream, whose
probe is shown a message ``--lag-ms`` after the downstream accepted it (:mod:`bench.readback_tools`):

- ``kill``: generation 1 sends, holds at ``commit`` and its worker is SIGKILLed; the next attempt, on the other
  worker, asks the probe (two ``agentlease worker`` processes; the killed one is replaced before the next trial);
- ``dropped``: generation 1 sends and loses the answer (the connection dropped), and asks the probe at once.

Each trial runs with the window (``lagging_send``, 10 s) and without it (``unwindowed_send``). It prints, per
scenario and side, the trials whose message was sent more than once, those where a probe answered "not applied"
(always wrong here: generation 1 sent the message), those settled by the probe with no person, and the others.
The ledger is SQLite, Temporal a dev server of its own, both in a temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
import uuid
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from agentlease.enums import EventKind, TaskStatus
from agentlease.errors import TaskNotFoundError
from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.records import AgentRunPlan, PlanStep, TaskRecord
from agentlease.runtime.shutdown import exit_process
from agentlease.workflow._plan import AgentRunWorkflow
from bench.faults import TemporalProcess
from tests.acceptance.fleet import Fleet, Worker, wait_polling
from tests.acceptance.matrix_downstream import MatrixDownstream, running_matrix_downstream
from tests.acceptance.matrix_tools import HOLDING
from tests.acceptance.runner import Cli
from tests.eventually import assert_eventually

SCENARIOS = ("kill", "dropped")
SIDES = {"window": "lagging_send", "no window": "unwindowed_send"}
STEP = "act"
QUEUE = "readback-bench"
TRIAL_TIMEOUT_S = 120.0
FINAL = (TaskStatus.SETTLED, TaskStatus.NEEDS_RECONCILIATION, TaskStatus.DEAD_LETTERED)


@dataclass
class Cell:
    scenario: str
    side: str
    duplicates: int = 0
    wrong: int = 0
    by_probe: int = 0
    trials: int = 0
    others: list[str] = field(default_factory=list)


class Bench:
    def __init__(self, client: Client, ledger: Ledger, fleet: Fleet, downstream: MatrixDownstream, work: Path):
        self.client, self.ledger, self.fleet, self.downstream, self.work = client, ledger, fleet, downstream, work
        self.workers: list[Worker] = []

    async def worker(self) -> Worker:
        started = self.fleet.start(QUEUE, f"readback-{uuid.uuid4().hex[:6]}")
        await wait_polling(self.client, QUEUE, started, timeout=TRIAL_TIMEOUT_S)
        self.workers.append(started)
        return started

    async def trial(self, cell: Cell, lag_ms: int) -> None:
        run_id = f"readback-{uuid.uuid4().hex[:10]}"
        task_id = f"{run_id}/{STEP}"
        arguments: dict[str, Any] = {"base_url": self.downstream.base_url, "target": run_id, "lag_ms": lag_ms}
        if cell.scenario == "kill":
            arguments |= {"hold_at": "commit", "resume_file": str(self.work / "never")}
        else:
            arguments |= {"drop_answer": True}
        step = PlanStep(step_id=STEP, tool=SIDES[cell.side], arguments=arguments)
        plan = AgentRunPlan(agent_run_id=run_id, steps=[step])
        await self.client.start_workflow(AgentRunWorkflow.run, plan, id=run_id, task_queue=QUEUE)
        if cell.scenario == "kill":

            async def holder() -> str:
                events = await self.ledger.events(task_id)
                assert any((e.reason or "").startswith(HOLDING) for e in events), "not holding yet"
                return (await self.ledger.get_task(task_id)).lease_owner or ""

            owner = await assert_eventually(holder, timeout=TRIAL_TIMEOUT_S, interval=0.05)
            [victim] = [w for w in self.workers if w.identity == owner]
            victim.signal(signal.SIGKILL)
            self.workers.remove(victim)

        async def ended() -> TaskRecord:
            try:
                record = await self.ledger.get_task(task_id)
            except TaskNotFoundError:
                raise AssertionError("no task yet") from None
            assert record.status in FINAL, record.status
            return record

        record = await assert_eventually(ended, timeout=TRIAL_TIMEOUT_S, interval=0.1)
        sent = len(await self.downstream.effects(f"{run_id}:{STEP}"))
        events = await self.ledger.events(task_id)
        settled = [e for e in events if e.kind is EventKind.SETTLED]
        cell.trials += 1
        cell.duplicates += sent > 1
        cell.wrong += any((e.reason or "").startswith("probe: the action did not happen") for e in events)
        if settled and (settled[0].details or {}).get("reconciled_by") == "probe":
            cell.by_probe += 1
        else:
            cell.others.append(f"{record.status.value}, sent {sent}")
        if cell.scenario == "kill":
            await self.worker()  # the killed worker's replacement


def report(cells: list[Cell], opts: argparse.Namespace, out: Any) -> None:
    print(f"lag {opts.lag_ms} ms, {opts.trials} trials per row", file=out)
    print(
        f"{'scenario':<9} {'side':<10} {'duplicates':>10} {'wrong not-applied':>17} {'by probe':>9}  others", file=out
    )
    for cell in cells:
        others = ", ".join(sorted(set(cell.others), key=cell.others.index)) or "-"
        counts = f"{cell.duplicates:>4}/{cell.trials:<5} {cell.wrong:>17} {cell.by_probe:>9}"
        print(f"{cell.scenario:<9} {cell.side:<10} {counts}  {others}", file=out)


async def bench(opts: argparse.Namespace) -> list[Cell]:
    work = Path(tempfile.mkdtemp(prefix="agentlease-readback-"))
    (work / "data").mkdir()
    async with AsyncExitStack() as stack:
        temporal = TemporalProcess(work / "temporal")
        temporal.start()
        stack.callback(temporal.close)
        url = f"sqlite:///{work / 'ledger.db'}"
        ledger = Ledger.from_url(url)
        stack.push_async_callback(ledger.close)
        await upgrade(ledger.database)
        downstream = await stack.enter_async_context(running_matrix_downstream(f"sqlite:///{work / 'effects.db'}"))
        client = await Client.connect(temporal.address, data_converter=pydantic_data_converter)
        fleet = Fleet(temporal.address, url, Cli(cwd=work, data_dir=work / "data"), "bench.readback_tools")
        stack.push_async_callback(fleet.stop_all)
        runner = Bench(client, ledger, fleet, downstream, work)
        await asyncio.gather(runner.worker(), runner.worker())
        cells = [Cell(scenario, side) for scenario in opts.scenario for side in SIDES]
        for cell in cells:
            for index in range(opts.trials):
                try:
                    await runner.trial(cell, opts.lag_ms)
                except Exception as exc:  # noqa: BLE001 - a failed trial is reported, the others still run
                    cell.others.append(f"failed: {type(exc).__name__}")
                print(f"{cell.scenario} {cell.side} {index + 1}/{opts.trials}", file=sys.stderr, flush=True)
        return cells


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.readback", description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=20, help="trials per scenario and side (default 20)")
    parser.add_argument("--lag-ms", type=int, default=200, help="how late the downstream shows a write (default 200)")
    parser.add_argument("--scenario", action="append", choices=SCENARIOS, help="kill and/or dropped (default both)")
    opts = parser.parse_args(argv)
    opts.scenario = opts.scenario or list(SCENARIOS)
    return opts


def main(argv: Sequence[str] | None = None) -> None:
    opts = parse_args(argv)
    report(asyncio.run(bench(opts)), opts, sys.stdout)


if __name__ == "__main__":
    main()
    exit_process(0)  # not a finalization the Temporal SDK's threads can abort (agentlease.runtime.shutdown)
