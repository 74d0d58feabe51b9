"""This deployment's restock run: find what runs low, then reserve each product once.

Each step is a leased tool call (``agentlease.workflow.call_tool``): the lookup is this repository's
own ``low_stock`` tool, the reservations are the built-in ``sql_upsert``, keyed by product so that a
second run of the same day reserves nothing twice.
"""

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.stock import low_stock
    from agentlease.tools.builtin import sql_upsert
    from agentlease.workflow import call_tool


@workflow.defn
class RestockWorkflow:
    @workflow.run
    async def run(self, below: int) -> list[str]:
        found = await call_tool(low_stock, {"below": below}, step_id="find-low-stock")
        if not found.settled or found.output is None:
            return []
        reserved = []
        for row in found.output["result"]:
            sku = row["sku"]
            reservation = {"sku": sku, "reserved": below - int(row["quantity"])}
            done = await call_tool(
                sql_upsert,
                {"table": "inventory", "record_key": f"reservation:{sku}", "row": reservation},
                step_id=f"reserve-{sku}",
            )
            if done.settled:
                reserved.append(sku)
        return reserved
