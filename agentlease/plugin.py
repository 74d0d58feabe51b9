"""``AgentLeasePlugin``: agentlease on any Temporal worker, beside the agent frameworks' plugins
(``docs/agents.md``, "The plugin").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterable
from datetime import timedelta
from types import ModuleType
from typing import Any

import temporalio.activity
from temporalio.plugin import SimplePlugin
from temporalio.worker import PollerBehaviorSimpleMaximum, Worker, WorkerConfig, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from agentlease.decisions._activity import DecisionActivities
from agentlease.errors import ConfigurationError, LedgerUnavailableError, UnknownToolError
from agentlease.ledger.grants import require_writable
from agentlease.ledger.migrate import require_current, upgrade
from agentlease.ledger.store import Ledger
from agentlease.ledger.unknown_tools import UnknownToolActivities
from agentlease.observability import search_attributes
from agentlease.observability.metrics import LeaseMetrics
from agentlease.runtime.temporal import worker_client
from agentlease.security.decision_auth import decision_verifier
from agentlease.security.redaction import configure as configure_redaction
from agentlease.settings import AgentLeaseSettings, default_identity, load_object
from agentlease.tools._declaration import ToolSpec
from agentlease.tools._leased import LeasedActivities
from agentlease.tools._registry import ToolRegistry, load_registry
from agentlease.tools._resources import ToolResources
from agentlease.workflow._calls import LeasedCallError
from agentlease.workflow._interceptor import LeasedCallsInterceptor
from agentlease.workflow._plan import AgentRunWorkflow

PLUGIN_NAME = "agentlease.AgentLeasePlugin"

MAX_HEARTBEAT_THROTTLE = timedelta(seconds=1)
"""The longest the SDK holds a heartbeat back on a worker with the plugin (``docs/ttl.md``)."""

_SDK_POLLS = PollerBehaviorSimpleMaximum()
"""Temporal's default task polls, which the plugin replaces by ``AGENTLEASE_ACTIVITY_POLLERS`` and
``AGENTLEASE_WORKFLOW_POLLERS``."""
_SDK_STICKY_WAIT = timedelta(seconds=10)
"""Temporal's default sticky queue wait, which the plugin replaces by ``AGENTLEASE_STICKY_SCHEDULE_TO_START``."""


def tool_registry(tools: Iterable[str | ModuleType | ToolSpec], *, builtins: bool = False) -> ToolRegistry:
    """``tools`` (module names, modules, or declared tools), and the built-in tools with ``builtins``
    (``ConfigurationError``: a module cannot be imported, or two tools share a name)."""
    items = list(tools)
    registry = load_registry([item for item in items if isinstance(item, str)], builtins=builtins)
    for item in items:
        if isinstance(item, ModuleType):
            registry.add_module(item)
        elif isinstance(item, ToolSpec):
            registry.add(item)
    return registry


class AgentLeasePlugin(SimplePlugin):
    """Does on its worker the set-up a leased agent needs: the leased and decision activities (and, when asked,
    ``AgentRunWorkflow``), the sandbox passthrough, every workflow's status query and decision updates, the
    search attributes and the ledger's schema; task polls and the sticky wait left at Temporal's defaults are
    the settings' (``activity_pollers``, ``workflow_pollers``, ``sticky_schedule_to_start``: ``docs/agents.md``).

    Args:
        settings / ledger: default from the ``AGENTLEASE_*`` environment; a ledger given is the caller's to close.
        tools: tool modules (import paths or modules) or declared tools, besides the built-ins, or
            a ready :class:`~agentlease.tools._registry.ToolRegistry`. Default ``settings.tool_modules``.
        builtins: serve the built-in tools too. Default false (``agentlease worker`` serves them).
        identity: the lease owner of its claims; default ``settings.worker_identity``, else the worker's.
        agent_run_workflow: register ``AgentRunWorkflow`` too. Default false (``agentlease worker`` does).
        register_search_attributes: add missing search attributes to the namespace at start; false (Temporal
            Cloud) only checks they exist. Default true.

    Raises:
        ConfigurationError: a tool module cannot be imported, two tools share a name, or a bad URL; from
            ``Worker(...)``: a worker activity has a leased tool's name; at start: missing search attributes.
        LedgerUnavailableError: at start (``worker.run()``, ``async with worker``): the ledger it opened
            cannot be reached or is not at this version's schema.
    """

    def __init__(
        self,
        *,
        settings: AgentLeaseSettings | None = None,
        ledger: Ledger | None = None,
        tools: ToolRegistry | Iterable[str | ModuleType | ToolSpec] | None = None,
        builtins: bool = False,
        identity: str | None = None,
        agent_run_workflow: bool = False,
        register_search_attributes: bool = True,
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
        self._register_search_attributes = register_search_attributes
        super().__init__(
            PLUGIN_NAME,
            activities=self._activities,
            workflows=[AgentRunWorkflow] if agent_run_workflow else None,
            workflow_runner=_pass_through,
            interceptors=[LeasedCallsInterceptor()],
            workflow_failure_exception_types=[LeasedCallError],
        )

    @property
    def identity(self) -> str:
        """The lease owner of this worker's claims (known once a worker is configured)."""
        return self._identity or default_identity()

    def configure_worker(self, config: WorkerConfig) -> WorkerConfig:
        if self._identity is None:
            self._identity = config.get("identity") or config["client"].identity
        config["client"] = worker_client(config["client"])  # an unopenable payload fails only its own signal
        throttle = config.get("max_heartbeat_throttle_interval") or MAX_HEARTBEAT_THROTTLE
        config["max_heartbeat_throttle_interval"] = min(throttle, MAX_HEARTBEAT_THROTTLE)
        # Left at Temporal's defaults, the polls and the sticky wait are the settings' (docs/ttl.md): a paused
        # worker's open polls each take a retry of a call and hold it for a lease TTL.
        settings = self.settings
        for kind, polls in (("activity", settings.activity_pollers), ("workflow", settings.workflow_pollers)):
            behavior = f"{kind}_task_poller_behavior"
            if config.get(f"max_concurrent_{kind}_task_polls") is None and config.get(behavior) == _SDK_POLLS:
                config[behavior] = PollerBehaviorSimpleMaximum(polls)  # type: ignore[literal-required]
        if config.get("sticky_queue_schedule_to_start_timeout") == _SDK_STICKY_WAIT:
            config["sticky_queue_schedule_to_start_timeout"] = settings.sticky_schedule_to_start
        return super().configure_worker(config)

    def _approval_ttl(self, tool: str) -> timedelta:
        """How long an approval of ``tool`` lasts: its ``approval_ttl``, else ``AGENTLEASE_APPROVAL_TTL``."""
        try:
            declared = self.registry.get(tool).approval_ttl
        except UnknownToolError:  # an MCP tool, or one another worker serves
            declared = None
        return declared or self.settings.approval_ttl

    def _activities(self, existing: Any) -> list[Callable[..., Any]]:
        leased = LeasedActivities(self.ledger, self.registry, self.identity, self.settings, self.resources)
        decisions = DecisionActivities(self.ledger, decision_verifier(self.settings), approval_ttl=self._approval_ttl)
        ours = [*leased.activities(), *decisions.activities()]
        ours += UnknownToolActivities(self.ledger).activities()
        _refuse_duplicates(list(existing or []), ours)
        self._leased.append(leased)
        return [*(existing or []), *ours]

    async def run_worker(self, worker: Worker, next: Callable[[Worker], Awaitable[None]]) -> None:
        try:
            try:  # before the worker polls: a run must not meet a ledger or a namespace it cannot use
                if self._owns_ledger:
                    await (upgrade if self.settings.migrate_on_start else require_current)(self.ledger.database)
                await require_writable(self.ledger.database)  # a reader role's worker would retry runs forever
                await search_attributes.require_registered(
                    worker.client, worker.client.namespace, register=self._register_search_attributes
                )
            except (LedgerUnavailableError, ConfigurationError):
                _never_started(worker)
                raise
            await next(worker)
        finally:
            for leased in self._leased:  # writes still deferred by a ledger outage: logged, left to the sweeper
                await leased.close()
            await self.resources.close()
            if self._owns_ledger:
                await self.ledger.close()


def _activity_name(activity: Callable[..., Any]) -> str | None:
    """The activity type ``@activity.defn`` gave ``activity`` (``None``: not an activity, Temporal says so)."""
    defn = getattr(activity, "__temporal_activity_definition", None)
    return defn.name if isinstance(defn, temporalio.activity._Definition) else None


def _refuse_duplicates(existing: list[Callable[..., Any]], ours: list[Callable[..., Any]]) -> None:
    """One line instead of Temporal's ``More than one activity named ...`` for a leased tool's name."""
    names = {_activity_name(activity) for activity in ours}
    for activity in existing:
        name = _activity_name(activity)
        if name is not None and name in names:
            raise ConfigurationError(
                f"activity {name!r} is given to the worker and is also a leased tool of AgentLeasePlugin (a leased "
                f"tool's activity type is its name): drop your own {name!r} from activities=[...] (the leased one "
                "replaces it), or give one of them another name"
            )


def _never_started(worker: Worker) -> None:
    """Release a worker the plugin refused to start, as ``Worker._run`` does when its own check fails."""
    bridge = getattr(worker, "_bridge_worker", None)
    if bridge is not None:
        bridge.initiate_shutdown()
    done = getattr(worker, "_shutdown_complete_event", None)
    if done is not None:
        done.set()


PASSTHROUGH_MODULES = ("agentlease",)
"""Modules the workflow sandbox imports once, outside it (one copy of each class keeps pydantic's checks true)."""


def _pass_through(runner: WorkflowRunner | None) -> WorkflowRunner:
    if runner is None:
        runner = SandboxedWorkflowRunner()
    if isinstance(runner, SandboxedWorkflowRunner):
        return dataclasses.replace(
            runner, restrictions=runner.restrictions.with_passthrough_modules(*PASSTHROUGH_MODULES)
        )
    return runner


__all__ = ["MAX_HEARTBEAT_THROTTLE", "PLUGIN_NAME", "AgentLeasePlugin", "tool_registry"]
