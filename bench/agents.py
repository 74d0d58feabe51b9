"""The lease's cost inside an agent: the same scripted agent making N tool calls with the framework's
own tool activities and with agentlease's leased tools, interleaved on one dev server.

For each framework (the OpenAI Agents SDK, Pydantic AI) two agents run the same script: one turn
per tool call, then an answer. The plain agent's tool is the framework's own activity
(``activity_as_tool``; a ``FunctionToolset`` under ``TemporalDurability``), the leased agent's is
``leased_tool`` / ``LeasedToolset`` over the same three-stage tool with a SQLite (or PostgreSQL)
ledger. Model calls are activities on both sides, so the ratio is the lease's cost in a real agent
loop, not in an isolated call. Prints per side calls/s, leased/plain, the CPU ms per call of this
process (workers, ledger, client) and of the Temporal dev server, and one agent's history (events,
search-attribute upserts, markers, workflow tasks, activities, signals).

    python -m bench.agents --agents 10 --calls 10 --rounds 5 [--pg-url postgresql://...]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic_ai.durable_exec.temporal import PydanticAIPlugin
from temporalio.client import Client
from temporalio.openai_agents import ModelActivityParameters, OpenAIAgentsPlugin
from temporalio.openai_agents.testing import TestModelProvider
from temporalio.worker import Worker

from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.plugin import AgentLeasePlugin
from agentlease.runtime.devserver import dev_server, scratch_postgres_database
from agentlease.runtime.shutdown import exit_process
from agentlease.settings import AgentLeaseSettings
from bench import agent_models as models
from bench import agent_workflows as wf
from bench.runs import cpu_s, history_of, server_pids
from bench.tools import BENCH_TOOL

TARGET_RATIO = 0.9
"""The leased/plain ratio the SQLite ledger should reach inside an agent."""


@dataclass
class Side:
    framework: str
    name: str
    workflow: str
    client: Client
    queue: str
    rates: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    server_ms: list[float] = field(default_factory=list)
    last_run: str = ""


async def run_round(side: Side, agents: int, calls: int, server: Sequence[int] = ()) -> tuple[float, float, float]:
    """``agents`` agents of ``side`` at once, each making ``calls`` tool calls; returns calls/s, this
    process's CPU ms per call (workers, ledger and client share the process) and the CPU ms per call of
    the ``server`` processes (the Temporal dev server)."""
    ids = [f"{side.name}-{uuid.uuid4().hex[:10]}" for _ in range(agents)]
    server_cpu = sum(cpu_s(pid) for pid in server)
    cpu, started = time.process_time(), time.perf_counter()
    await asyncio.gather(
        *(
            side.client.execute_workflow(
                side.workflow, models.AgentBatch(calls=calls), id=wid, task_queue=side.queue, result_type=str
            )
            for wid in ids
        )
    )
    side.last_run = ids[-1]
    seconds = time.perf_counter() - started
    worker_ms = (time.process_time() - cpu) * 1000 / (agents * calls)
    return (
        agents * calls / seconds,
        worker_ms,
        (sum(cpu_s(pid) for pid in server) - server_cpu) * 1000 / (agents * calls),
    )


async def main(opts: argparse.Namespace) -> None:
    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
    data_dir = Path(tempfile.mkdtemp(prefix="agentlease-bench-agents-"))
    async with AsyncExitStack() as stack:
        env = await stack.enter_async_context(dev_server(data_dir / "temporal"))
        server = server_pids(data_dir)
        address = env.client.service_client.config.target_host
        url = f"sqlite:///{data_dir / 'ledger.db'}"
        if opts.pg_url:
            url = await stack.enter_async_context(scratch_postgres_database(opts.pg_url, "agentlease_bench_agents"))
        ledger = Ledger.from_url(url)
        stack.push_async_callback(ledger.close)
        await upgrade(ledger.database)
        settings = AgentLeaseSettings(ledger_url=url, temporal_address=address)
        openai = await Client.connect(
            address,
            plugins=[
                OpenAIAgentsPlugin(
                    model_params=ModelActivityParameters(start_to_close_timeout=timedelta(seconds=60)),
                    model_provider=TestModelProvider(models.CallingModel()),
                )
            ],
        )
        pydantic = await Client.connect(address, plugins=[PydanticAIPlugin()])
        sides = []
        for framework, client, plain, leased, workflows in (
            ("openai-agents", openai, wf.OPENAI_PLAIN, wf.OPENAI_LEASED, [wf.OpenAIPlainAgent, wf.OpenAILeasedAgent]),
            (
                "pydantic-ai",
                pydantic,
                wf.PYDANTIC_PLAIN,
                wf.PYDANTIC_LEASED,
                [wf.PydanticPlainAgent, wf.PydanticLeasedAgent],
            ),
        ):
            queue = f"bench-{framework}-{uuid.uuid4().hex[:6]}"
            worker = Worker(
                client,
                task_queue=queue,
                workflows=workflows,
                activities=[models.bench_plain_tool],
                plugins=[
                    AgentLeasePlugin(
                        settings=settings, ledger=ledger, tools=[BENCH_TOOL], builtins=False, agent_run_workflow=False
                    )
                ],
                max_concurrent_activities=opts.slots,
            )
            await stack.enter_async_context(worker)
            sides += [
                Side(framework, f"{framework}-plain", plain, client, queue),
                Side(framework, f"{framework}-leased", leased, client, queue),
            ]
        for side in sides:  # warm-up: imports, sandbox, first ledger writes
            await run_round(side, 2, 2)
        for index in range(opts.rounds):
            for side in sides if index % 2 == 0 else list(reversed(sides)):
                rate, cpu_ms, server_ms = await run_round(side, opts.agents, opts.calls, server)
                side.rates.append(rate)
                side.cpu_ms.append(cpu_ms)
                side.server_ms.append(server_ms)
        histories = {side.name: await history_of(side.client, side.last_run) for side in sides}
        report(sides, opts, url.split(":")[0], histories)


def report(
    sides: list[Side],
    opts: argparse.Namespace,
    database: str,
    histories: dict[str, dict[str, int]] | None = None,
    out: Any = sys.stdout,
) -> None:
    print(
        f"agents: {opts.agents} at once x {opts.calls} tool calls, {opts.rounds} interleaved rounds; "
        f"ledger {database}; load average {os.getloadavg()[0]:.2f}",
        file=out,
    )
    print(
        f"{'side':<24} {'calls/s (median)':>17} {'min-max':>15} {'leased/plain':>13} {'cpu ms/call':>12} "
        f"{'server ms/call':>15}   history of one agent",
        file=out,
    )
    for side in sides:
        median = statistics.median(side.rates)
        plain = next(s for s in sides if s.framework == side.framework and s.name.endswith("plain"))
        shown = "" if side is plain else f"{median / statistics.median(plain.rates):.2f}"
        h = (histories or {}).get(side.name, {})
        history = ", ".join(f"{count} {kind}" for kind, count in h.items() if kind != "bytes")
        cpu = statistics.median(side.cpu_ms) if side.cpu_ms else 0.0
        server = statistics.median(side.server_ms) if side.server_ms else 0.0
        print(
            f"{side.name:<24} {median:>17.1f} {min(side.rates):>7.1f}-{max(side.rates):<7.1f} {shown:>13} "
            f"{cpu:>12.2f} {server:>15.2f}   {history}",
            file=out,
        )
    for framework in dict.fromkeys(s.framework for s in sides):
        plain, leased = (next(s for s in sides if s.name == f"{framework}-{k}") for k in ("plain", "leased"))
        ratio = statistics.median(leased.rates) / statistics.median(plain.rates)
        verdict = "meets" if ratio >= TARGET_RATIO else "is below"
        print(f"{framework}: leased/plain = {ratio:.2f}, which {verdict} the aim of {TARGET_RATIO}", file=out)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.agents", description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=10, help="agents at once per round (default 10)")
    parser.add_argument("--calls", type=int, default=10, help="tool calls per agent (default 10)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per side (default 5)")
    parser.add_argument("--slots", type=int, default=100, help="worker activity slots (default 100)")
    parser.add_argument("--pg-url", help="a PostgreSQL server for the ledger (a scratch database is made)")
    opts = parser.parse_args(argv)
    if min(opts.agents, opts.calls, opts.rounds) < 1:
        parser.error("--agents, --calls and --rounds must be at least 1")
    return opts


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
    exit_process(0)  # not a finalization the Temporal SDK's threads can abort (agentlease.runtime.shutdown)
