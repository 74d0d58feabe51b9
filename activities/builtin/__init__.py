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

from activities.builtin.http_get import http_get
from activities.builtin.http_publish import http_publish
from activities.builtin.smtp_send import smtp_send
from activities.builtin.sql_upsert import sql_upsert

TOOLS = (http_get, http_publish, smtp_send, sql_upsert)
"""The built-in tools. The registry reads this tuple, not the package's attributes: each attribute
shares its name with a submodule, and Temporal's workflow sandbox, passing ``activities.builtin.X``
through, sets the package's attribute ``X`` to the submodule."""

__all__ = ["TOOLS", "http_get", "http_publish", "smtp_send", "sql_upsert"]
