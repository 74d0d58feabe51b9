"""Built-in tools. Every tool here settles only after a readback produced its receipt."""

from activities.builtin.http_get import http_get
from activities.builtin.sql_upsert import sql_upsert

__all__ = ["http_get", "sql_upsert"]
