"""Built-in tools. Every tool here settles only after a readback produced its receipt.

=================  ===========  =====================================================================
tool               class        readback
=================  ===========  =====================================================================
``http_get``       read_only    the response itself
``http_publish``   fenced       the post, by idempotency key before writing and by id after
``sql_upsert``     idempotent   the row under its record key
``smtp_send``      unsafe       none beyond the server's 250 reply (SMTP has no readback)
=================  ===========  =====================================================================
"""

from agentlease.tools.builtin.http_get import http_get
from agentlease.tools.builtin.http_publish import http_publish
from agentlease.tools.builtin.smtp_send import smtp_send
from agentlease.tools.builtin.sql_upsert import sql_upsert

__all__ = ["TOOLS", "http_get", "http_publish", "smtp_send", "sql_upsert"]

TOOLS = (http_get, http_publish, smtp_send, sql_upsert)
"""Every built-in tool (read this, not the package's attributes, which the sandbox may set to the submodules)."""
