"""What the tools of one worker share: database engines by URL, made once and closed with the worker."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from agentlease.ledger.engine import create_async_database_engine


class ToolResources:
    """Connections a worker's tools reuse across calls (``pool_size`` per PostgreSQL engine, default 2)."""

    def __init__(self, *, pool_size: int = 2) -> None:
        self._pool_size = pool_size
        self._engines: dict[str, AsyncEngine] = {}

    def sql_engine(self, url: str) -> AsyncEngine:
        """The worker's engine for ``url`` (``sqlite:///PATH`` or ``postgresql://...``), made on first use
        (``ConfigurationError``: a bad URL)."""
        engine = self._engines.get(url)
        if engine is None:
            engine = self._engines[url] = create_async_database_engine(url, pool_size=self._pool_size)
        return engine

    async def close(self) -> None:
        """Dispose of every engine; a later :meth:`sql_engine` makes a new one."""
        engines, self._engines = self._engines, {}
        for engine in engines.values():
            await engine.dispose()
