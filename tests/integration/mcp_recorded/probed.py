"""The recorded CRM tools with a probe on ``crm_create_contact`` that looks the contact up with
``crm_find_contact`` (called directly, outside any lease), for worker processes
(``AGENTLEASE_TOOL_MODULES=tests.integration.mcp_recorded.probed``; the server as
:func:`tests.acceptance.mcp_fault_tools.crm_server` reaches it)."""

from __future__ import annotations

from agentlease import ProbeQuery, ProbeResult
from tests.acceptance.mcp_fault_tools import crm_server
from tests.integration.mcp_recorded import crm_tools


async def contact_created(query: ProbeQuery) -> ProbeResult:
    """Did the call create its contact? The CRM lists the contacts of an email."""
    email = query.arguments.model_dump()["email"]
    found = await crm_find_contact(email=email)
    contacts = found.get("contacts")
    if not isinstance(contacts, list):
        return ProbeResult.cannot_tell(f"find_contact answered {found!r:.200}")
    if not contacts:  # the guard fences older generations and replays by key: the retry cannot add a second
        return ProbeResult.not_happened(contacts=0)
    receipt = query.receipt("crm", str(contacts[0]["id"]), "created", email=email)
    return ProbeResult.happened(receipt, contacts=len(contacts))


# The default lease (15 s): the probe starts a stdio server of its own within 80% of it.
crm_create_contact, crm_find_contact, crm_import_contacts = crm_tools(crm_server(), probe=contact_created)
