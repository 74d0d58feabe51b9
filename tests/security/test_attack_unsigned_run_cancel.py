"""An unsigned cancel of a whole run does not cancel it in the authenticated mode (found by an attack;
both tests failed before the fix).

Before, ``LeasedToolCalls._cancel`` set ``cancelled = True`` first and, for a whole-run cancel, applied the
decision only to the run's steps that were not final; with none (a ``keep_open`` run between submits, an
adapter's run between two tool calls) no ``agentlease.apply_decision`` ran, so no signature was checked,
and the run ended ``cancelled``: a peer who could send updates cancelled any such run without an
operator's key. Now a whole-run cancel with no open call is refused (nothing would check it), and the run
is marked cancelled only once the ledger applied the cancel to its first call.
"""

from __future__ import annotations

import asyncio
import base64
import uuid
from contextlib import suppress

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.service import RPCError

from agentlease.decisions.table import CancelRequest
from agentlease.settings import AgentLeaseSettings
from agentlease.workflow._plan import AgentRunWorkflow
from tests.integration.test_decisions import wait_for
from tests.integration.test_lease_on_temporal import _plan, _worker, opened_ledger

pytestmark = pytest.mark.timeout(120)


def _public() -> str:
    raw = (
        Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    )
    return base64.b64encode(raw).decode()


async def test_an_unsigned_whole_run_cancel_is_refused_when_no_step_is_open(
    client: Client, settings: AgentLeaseSettings
) -> None:
    settings = settings.model_copy(update={"decision_mode": "authenticated", "operator_keys": f"alice={_public()}"})
    run_id = f"cancel-{uuid.uuid4().hex[:8]}"
    async with opened_ledger(settings) as ledger, _worker(client, ledger, settings, "worker-auth"):
        handle = await client.start_workflow(
            AgentRunWorkflow.run,
            _plan(run_id, ("first", "quick", {}), keep_open=True),
            id=run_id,
            task_queue=settings.task_queue,
        )
        try:
            await wait_for(handle, "first", "settled")  # the run now waits for submits: no open step
            # Mallory, with no operator key, cancels the whole run.
            unsigned = CancelRequest(by="mallory", reason="no key needed").model_dump(mode="json")
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await handle.execute_update("cancel", unsigned)
            assert "has no open call to cancel" in str(refused.value.cause)
            status = await handle.query("status")
            assert status["status"] != "cancelled", status
        finally:
            with suppress(RPCError):
                await handle.terminate("test over")


async def test_refused_unsigned_cancels_in_flight_do_not_cancel_the_run(
    client: Client, settings: AgentLeaseSettings
) -> None:
    """Before, the handler set ``cancelled = True`` before the decision activity checked the cancel, and reset
    it only once the refusal came back: a run whose steps ended meanwhile ended ``cancelled``, and a stream
    of unsigned cancels kept the flag up (about one trial in three ended cancelled). Each trial is a run of
    two steps under a stream of refused cancels; every one must complete."""
    from tests.eventually import assert_eventually
    from tests.integration import tools

    settings = settings.model_copy(update={"decision_mode": "authenticated", "operator_keys": f"alice={_public()}"})
    unsigned = CancelRequest(by="mallory", reason="no key needed").model_dump(mode="json")
    ended: list[tuple[str, list[tuple[str, str, str | None]]]] = []
    async with opened_ledger(settings) as ledger, _worker(client, ledger, settings, "worker-auth"):
        for _ in range(3):
            run_id = f"cancel-{uuid.uuid4().hex[:8]}"
            handle = await client.start_workflow(
                AgentRunWorkflow.run,
                _plan(run_id, ("a", "gated", {}), ("b", "quick", {})),
                id=run_id,
                task_queue=settings.task_queue,
            )
            stop = asyncio.Event()
            refused: list[int] = []

            async def flood(handle: object = handle, stop: asyncio.Event = stop, refused: list[int] = refused) -> None:
                while not stop.is_set():
                    try:
                        await handle.execute_update("cancel", unsigned)  # type: ignore[attr-defined]
                    except WorkflowUpdateFailedError:
                        refused.append(1)
                    except RPCError:
                        return

            floods: list[asyncio.Future[None]] = []
            try:
                await wait_for(handle, "a", "running")
                floods = [asyncio.ensure_future(flood()) for _ in range(8)]

                async def some_refused(refused: list[int] = refused) -> None:
                    assert len(refused) >= 4

                await assert_eventually(some_refused, timeout=60)
                tools.gate(f"{run_id}/a").set()  # step a ends while cancels are still being checked
                result = await asyncio.wait_for(handle.result(), timeout=60)
                ended.append((str(result.status), [(t.step_id, str(t.status), t.error) for t in result.tasks]))
            finally:
                stop.set()
                await asyncio.gather(*floods, return_exceptions=True)
                with suppress(RPCError):
                    await handle.terminate("test over")
    assert all(status == "completed" for status, _ in ended), ended
