"""Fixtures of the security tests: the integration tier's dev server, client and per-test settings."""

from tests.integration.conftest import client, settings, temporal_address

__all__ = ["client", "settings", "temporal_address"]
