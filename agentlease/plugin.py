"""``AgentLeasePlugin``: agentlease on any Temporal worker, beside the agent frameworks' plugins.

A ``temporalio.plugin.SimplePlugin`` that registers, on the worker it is given to:

- one leased activity per tool (activity type = tool name), built-in tools and yours;
- the decision activity (``agentlease.apply_decision``) and the tool catalog (``agentlease.describe_tools``);
- ``AgentRunWorkflow``, for runs made from plans (optional).

It does not touch the data converter: every agentlease activity and handler takes and returns
plain JSON and validates it, so it works under the pydantic converter, the OpenAI Agents SDK's
and Pydantic AI's alike. Give it to the worker (``Worker(client, plugins=[...])``), after or
beside the frameworks' plugins::

    worker = Worker(client, task_queue="agents", workflows=[MyAgent],
                    plugins=[AgentLeasePlugin(settings=AgentLeaseSettings(), tools=["mytools"])])

When it opens the ledger itself (no ``ledger`` given) it checks its schema as the worker starts
(or migrates it, with ``migrate_on_start``) and closes it when the worker stops. The engines its
tools share (:class:`~agentlease.tools._resources.ToolResources`) close when the worker stops, and so does
the retrying of writes a ledger outage deferred (:mod:`agentlease.tools._deferred`).
"""

from __future__ import annotations

import dataclasses

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from types import ModuleType
from typing import Any

from temporalio.plugin import SimplePlugin
from temporalio.worker import Worker, WorkerConfig, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from agentlease.decision_auth import decision_verifier
from agentlease.ledger.migrate import require_current, upgrade
from agentlease.ledger.store import Ledger
from agentlease.metrics import LeaseMetrics
from agentlease.redaction import configure as configure_redaction
from agentlease.settings import AgentLeaseSettings, default_identity
from agentlease.temporal import load_object
from agentlease.tools._decisions import DecisionActivities
from agentlease.tools._declaration import ToolSpec
from agentlease.tools._leased import LeasedActivities
from agentlease.tools._registry import ToolRegistry, load_registry
from agentlease.tools._resources import ToolResources
from agentlease.workflow._plan import AgentRunWorkflow

PLUGIN_NAME = "agentlease.AgentLeasePlugin"


def tool_registry(tools: Iterable[str | ModuleType | ToolSpec], *, builtins: bool = True) -> ToolRegistry:
    """The built-in tools plus ``tools``: module names, modules, or declared tools.

    Raises:
        ConfigurationError: a module cannot be imported, or two tools share a name.
    """
    items = list(tools)
    registry = load_registry([item for item in items if isinstance(item, str)], builtins=builtins)
    for item in items:
        if isinstance(item, ModuleType):
            registry.add_module(item)
        elif isinstance(item, ToolSpec):
            registry.add(item)
    return registry


class AgentLeasePlugin(SimplePlugin):
    """Registers agentlease's activities (and ``AgentRunWorkflow``) on a worker.

    Args:
        settings: endpoints of the built-in tools, the ledger URL, the lease owner. Default from
            the ``AGENTLEASE_*`` environment.
        ledger: a ledger the caller owns and closes; default one opened from ``settings.ledger_url``
            for the worker's lifetime.
        tools: tool modules (import paths or modules) or declared tools, besides the built-ins, or
            a ready :class:`~agentlease.tools._registry.ToolRegistry`. Default ``settings.tool_modules``.
        builtins: serve the built-in tools (``http_get``, ``sql_upsert``, ``http_publish``,
            ``smtp_send``). Default true.
        identity: the lease owner of this worker's claims; default ``settings.worker_identity``,
            else the worker's Temporal identity.
        agent_run_workflow: register ``AgentRunWorkflow`` too. Default true.

    Raises:
        ConfigurationError: a tool module cannot be imported, two tools share a name, or a bad URL.
    """

    def __init__(
        self,
        *,
        settings: AgentLeaseSettings | None = None,
        ledger: Ledger | None = None,
        tools: ToolRegistry | Iterable[str | ModuleType | ToolSpec] | None = None,
        builtins: bool = True,
        identity: str | None = None,
        agent_run_workflow: bool = True,
    ) -> None:
        self.settings = settings or AgentLeaseSettings()
        if isinstance(tools, ToolRegistry):
            self.registry = tools
        else:
            self.registry = tool_registry(self.settings.tool_modules if tools is None else tools, builtins=builtins)
        self._owns_ledger = ledger is None
        self.ledger = ledger or Ledger.from_url(
            self.settings.ledger_url,
            pool_size=self.settings.ledger_pool_size,
            metrics=LeaseMetrics(namespace=self.settings.namespace, task_queue=self.settings.task_queue),
        )
        self.resources = ToolResources()
        if self.settings.redactor:
            configure_redaction(load_object(self.settings.redactor, "redactor", factory=False))
        self._leased: list[LeasedActivities] = []
        self._identity = identity or self.settings.worker_identity
        super().__init__(
            PLUGIN_NAME,
            activities=self._activities,
            workflows=[AgentRunWorkflow] if agent_run_workflow else None,
            workflow_runner=_pass_through,
        )

    @property
    def identity(self) -> str:
        """The lease owner of this worker's claims (known once a worker is configured)."""
        return self._identity or default_identity()

    def configure_worker(self, config: WorkerConfig) -> WorkerConfig:
        if self._identity is None:
            self._identity = config.get("identity") or config["client"].identity
        return super().configure_worker(config)

    def _activities(self, existing: Any) -> list[Callable[..., Any]]:
        leased = LeasedActivities(self.ledger, self.registry, self.identity, self.settings, self.resources)
        self._leased.append(leased)
        return [
            *(existing or []),
            *leased.activities(),
            *DecisionActivities(self.ledger, decision_verifier(self.settings)).activities(),
        ]

    async def run_worker(self, worker: Worker, next: Callable[[Worker], Awaitable[None]]) -> None:
        async with self._open():
            await next(worker)

    @asynccontextmanager
    async def _open(self) -> AsyncIterator[None]:
        try:
            if self._owns_ledger:
                await (upgrade if self.settings.migrate_on_start else require_current)(self.ledger.database)
            yield
        finally:
            for leased in self._leased:  # writes still deferred by a ledger outage: logged, left to the sweeper
                await leased.close()
            await self.resources.close()
            if self._owns_ledger:
                await self.ledger.close()


PASSTHROUGH_MODULES = ("agentlease",)
"""Modules the workflow sandbox imports once, outside the sandbox: agentlease's records and decisions are
plain data and deterministic helpers, and one copy of each class keeps pydantic's checks of them true."""


def _pass_through(runner: WorkflowRunner | None) -> WorkflowRunner:
    if runner is None:
        runner = SandboxedWorkflowRunner()
    if isinstance(runner, SandboxedWorkflowRunner):
        return dataclasses.replace(
            runner, restrictions=runner.restrictions.with_passthrough_modules(*PASSTHROUGH_MODULES)
        )
    return runner


__all__ = ["PLUGIN_NAME", "AgentLeasePlugin", "tool_registry"]
