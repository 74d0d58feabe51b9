"""A worker process of the effect-safety benchmark, started ahead and told which task queue to serve.

``python -m bench.effects_worker SYSTEM IDENTITY`` connects to Temporal (``EFFECTS_BENCH_TEMPORAL``)
with SYSTEM's client plugin (the OpenAI Agents SDK's with the scripted model, or Pydantic AI's),
prints ``ready`` and then follows its standard input, one command a line:

- ``serve QUEUE``: run a Temporal worker on QUEUE (SYSTEM's workflow from
  :func:`workflow_class`, its tool, :class:`bench.effects_tools.EffectsInterceptor`;
  for a leased system ``AgentLeasePlugin`` with the SQLite ledger of ``EFFECTS_BENCH_LEDGER``), then
  print ``serving QUEUE``;
- ``stop``: shut that worker down, then print ``stopped``.

SYSTEM is one of :data:`SYSTEMS` or :data:`EXTRA_SYSTEMS`.

End of input or SIGTERM ends the process. Every worker has the same settings: 100 activity
slots, a sticky queue given up after 1 s (a killed worker's runs move on quickly, on every side
alike), no shutdown grace. The process leaves with ``os._exit`` once its worker stopped
(temporalio/sdk-python#300).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import traceback
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

TEMPORAL_ENV = "EFFECTS_BENCH_TEMPORAL"
LEDGER_ENV = "EFFECTS_BENCH_LEDGER"
SYSTEMS = (
    "openai-native",
    "openai-leased",
    "pydantic-native",
    "pydantic-leased",
    "langgraph-native",
    "langgraph-leased",
    "adk-native",
    "adk-leased",
)
"""The systems the benchmark runs by default."""
EXTRA_SYSTEMS = ("openai-native-keyed", "strands-native", "strands-leased")
"""Run when named: ``openai-native`` whose tool sends a key made from its activity (workflow id, activity id); the
Strands agent native and leased (:mod:`bench.effects_strands`, in a virtualenv of its own: ``bench/README.md``)."""


def workflow_class(system: str) -> Any:
    """``system``'s workflow class, importing only its framework."""
    if system.startswith("strands"):
        from bench.effects_strands import WORKFLOWS as STRANDS_WORKFLOWS

        return STRANDS_WORKFLOWS[system]
    from bench.effects_workflows import WORKFLOWS

    return WORKFLOWS[system]


async def connect(system: str, address: str) -> Client:
    """A client with ``system``'s framework plugin (the benchmark's driver uses the same)."""
    if system.startswith("openai"):
        os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
        from agentlease.demo.agents.openai_agent import scripted_model_plugin

        return await Client.connect(address, plugins=[scripted_model_plugin()])
    if system.startswith("langgraph"):
        from temporalio.contrib.pydantic import pydantic_data_converter

        return await Client.connect(address, data_converter=pydantic_data_converter)
    if system.startswith("strands"):
        from temporalio.strands_agents import StrandsPlugin

        from bench.effects_strands import MODEL, ScriptedEffects

        return await Client.connect(address, plugins=[StrandsPlugin(models={MODEL: ScriptedEffects})])
    if system.startswith("adk"):
        from temporalio.google_adk import GoogleAdkPlugin

        import bench.effects_adk  # noqa: F401  (registers the scripted model in this process)

        return await Client.connect(address, plugins=[GoogleAdkPlugin()])
    from pydantic_ai.durable_exec.temporal import PydanticAIPlugin

    return await Client.connect(address, plugins=[PydanticAIPlugin()])


def build(client: Client, system: str, queue: str, identity: str) -> Worker:
    """The worker of ``system`` on ``queue``."""
    from bench.effects_tools import REFUND_TOOL, EffectsInterceptor, refund_activity

    options: dict[str, Any] = {
        "task_queue": queue,
        "workflows": [workflow_class(system)],
        "interceptors": [EffectsInterceptor()],
        "identity": f"{identity}/{queue}",
        "max_concurrent_activities": 100,
        "sticky_queue_schedule_to_start_timeout": timedelta(seconds=1),
        "graceful_shutdown_timeout": timedelta(0),
    }
    if system.startswith(("openai-native", "adk-native", "strands-native")):
        options["activities"] = [refund_activity]
    if system.startswith("langgraph"):
        from temporalio.langgraph import LangGraphPlugin

        from bench.effects_graphs import GRAPH, effects_graph

        options["plugins"] = [LangGraphPlugin(graphs={GRAPH: effects_graph(system.endswith("leased"))})]
    if system.endswith("leased"):
        from agentlease.plugin import AgentLeasePlugin
        from agentlease.settings import AgentLeaseSettings

        settings = AgentLeaseSettings(
            temporal_address=os.environ[TEMPORAL_ENV],
            task_queue=queue,
            ledger_url=os.environ[LEDGER_ENV],
            worker_identity=f"{identity}/{queue}",
        )
        options["plugins"] = [
            *options.get("plugins", []),
            AgentLeasePlugin(settings=settings, tools=[REFUND_TOOL], builtins=False, agent_run_workflow=False),
        ]
    return Worker(client, **options)


async def main(system: str, identity: str) -> None:
    if system.endswith("-keyed"):
        from bench.effects_tools import NATIVE_KEY_ENV

        os.environ[NATIVE_KEY_ENV] = "1"
    client = await connect(system, os.environ[TEMPORAL_ENV])
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    ended = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, ended.set)
    worker: Worker | None = None
    running: asyncio.Task[None] | None = None
    print("ready", flush=True)
    while not ended.is_set():
        reading = asyncio.ensure_future(reader.readline())
        waiting = asyncio.ensure_future(ended.wait())
        await asyncio.wait([reading, waiting], return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        if not reading.done():
            reading.cancel()
            break
        command, _, queue = reading.result().decode().strip().partition(" ")
        if command == "serve" and worker is None:
            worker = build(client, system, queue, identity)
            running = asyncio.create_task(worker.run())
            print(f"serving {queue}", flush=True)
        elif command == "stop" and worker is not None and running is not None:
            await worker.shutdown()
            await running
            worker = running = None
            print("stopped", flush=True)
        elif not command:
            break  # end of input: the benchmark is gone
    if worker is not None and running is not None:
        await worker.shutdown()
        await running


if __name__ == "__main__":
    code = 0
    try:
        asyncio.run(main(sys.argv[1], sys.argv[2]))
    except BaseException:  # noqa: BLE001 - reported in the log, then the same exit
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
