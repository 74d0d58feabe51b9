"""``takeover_write``'s write as a plain Temporal activity, no lease: the first half of the demo's story
(``docs/operator-views.md``). ``python -m agentlease.demo.unleased ADDRESS TASK_QUEUE IDENTITY`` is the worker
the demo pauses: the activity only, one at a time (no open poll takes the retry), until SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.common import RetryPolicy

HEARTBEAT_TIMEOUT = timedelta(seconds=3)
"""The activity's heartbeat timeout: the leased tool's lease TTL."""

HEARTBEAT_EVERY_S = HEARTBEAT_TIMEOUT.total_seconds() / 4
"""How often the holding attempt heartbeats (a quarter of the timeout, as the leased tool renews)."""

ACTIVITY = "demo.plain_write"
WORKFLOW = "demo.PlainWrite"


@dataclass(frozen=True)
class PlainWrite:
    """What to write (``row`` at ``record_key`` of ``runbooks``), where, on which queue; attempt 1 holds
    ``hold_s`` seconds before its write unless Temporal cancels it first."""

    record_key: str
    row: dict[str, Any]
    sql_target_url: str
    activity_queue: str
    hold_s: float = field(default=60.0)


async def _hold(hold_s: float) -> None:
    """Heartbeat just before the write until Temporal cancels the attempt or ``hold_s`` passed."""
    deadline = time.monotonic() + hold_s
    with contextlib.suppress(asyncio.CancelledError):  # the attempt is gone; this worker does not listen
        while time.monotonic() < deadline:
            activity.heartbeat("holding just before the write")
            await asyncio.sleep(HEARTBEAT_EVERY_S)


async def _write(args: PlainWrite, attempt: int, identity: str) -> str:
    from agentlease.demo.takeover import create_tables, write_row
    from agentlease.ledger.engine import create_async_database_engine

    engine = create_async_database_engine(args.sql_target_url, pool_size=1)
    try:
        await create_tables(engine)
        async with engine.begin() as conn:
            await write_row(
                conn,
                args.record_key,
                {**args.row, "attempt": attempt},
                key=f"{activity.info().workflow_id}:{activity.info().activity_id}",
                generation=attempt,  # no claim generation without a lease: the attempt stands in
                written_by=f"attempt {attempt} ({identity})",
            )
    finally:
        await engine.dispose()
    return f"wrote runbooks/{args.record_key} as attempt {attempt}"


class PlainWriter:
    """The activity, as one worker serves it (its ``identity`` goes into the write log)."""

    def __init__(self, identity: str) -> None:
        self.identity = identity

    @activity.defn(name=ACTIVITY)
    async def plain_write(self, args: PlainWrite) -> str:
        """Write the row; attempt 1 holds just before its write until it is cancelled, then writes all the same."""
        attempt = activity.info().attempt
        if attempt == 1:
            await _hold(args.hold_s)
        late = asyncio.ensure_future(_write(args, attempt, self.identity))
        while True:  # deaf to the cancellation of this attempt, as a paused worker is
            try:
                return await asyncio.shield(late)
            except asyncio.CancelledError:
                continue


@workflow.defn(name=WORKFLOW)
class PlainWriteWorkflow:
    """One call of the activity, retried by Temporal alone."""

    @workflow.run
    async def run(self, args: PlainWrite) -> str:
        return await workflow.execute_activity(
            ACTIVITY,
            args,
            task_queue=args.activity_queue,
            start_to_close_timeout=timedelta(minutes=2),
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
            retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=5),
            result_type=str,
        )


async def serve(address: str, task_queue: str, identity: str) -> None:
    """Serve the activity on ``task_queue``, one activity at a time, until SIGTERM or SIGINT."""
    from temporalio.client import Client
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.worker import Worker

    from agentlease.runtime.shutdown import stop_event

    stop = stop_event()
    client = await Client.connect(address, data_converter=pydantic_data_converter)
    worker = Worker(
        client,
        task_queue=task_queue,
        activities=[PlainWriter(identity).plain_write],
        identity=identity,
        max_concurrent_activities=1,
        graceful_shutdown_timeout=timedelta(seconds=2),
    )
    async with worker:
        print(f"plain worker {identity} on {address} queue {task_queue}", file=sys.stderr, flush=True)
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(serve(*sys.argv[1:4]))
