"""This deployment's own tool: which products run low, read from the inventory the file server holds.

Written as any team writes a tool: a typed async function, leased where it is declared. It only
reads, so a retry simply reads again (``docs/wrapping-tools.md``).
"""

import csv
import io
from datetime import timedelta

import httpx

from agentlease import lease, leased


@leased(side_effect="read_only", lease_ttl=timedelta(seconds=10))
async def low_stock(below: int, path: str = "files/inventory.csv") -> list[dict[str, str]]:
    """The inventory rows whose quantity is below ``below`` units."""
    base_url = lease.context().settings.http_base_url
    if base_url is None:
        raise ValueError("low_stock needs AGENTLEASE_HTTP_BASE_URL (the file server holding the inventory)")
    async with httpx.AsyncClient(base_url=str(base_url), timeout=10.0) as http:
        response = await http.get(path)
        response.raise_for_status()
    return [row for row in csv.DictReader(io.StringIO(response.text)) if int(row["quantity"]) < below]
