"""What `agentlease dev` tells a second shell to export: everything it needs, a password never."""

from __future__ import annotations

import shlex

import pytest

from agentlease.demo.cli.local import export_lines
from agentlease.settings import AgentLeaseSettings


def exported(lines: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in lines:
        words = shlex.split(line)
        assert words[0] == "export", line
        found.update(word.split("=", 1) for word in words[1:])  # type: ignore[misc]
    return found


def test_the_exports_carry_the_stack_the_tools_and_where_they_import_from(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/srv/my tools")
    settings = AgentLeaseSettings(
        temporal_address="127.0.0.1:7233",
        namespace="agents",
        task_queue="dev-q",
        ledger_url="sqlite:////tmp/dev/ledger.db",
        tool_modules="mytools,moretools",
        workflow_modules="myagents",
        http_base_url="http://127.0.0.1:9000",
    )
    lines, masked = export_lines(settings)
    assert not masked
    assert exported(lines) == {
        "AGENTLEASE_TEMPORAL_ADDRESS": "127.0.0.1:7233",
        "AGENTLEASE_TASK_QUEUE": "dev-q",
        "AGENTLEASE_LEDGER_URL": "sqlite:////tmp/dev/ledger.db",
        "AGENTLEASE_NAMESPACE": "agents",
        "AGENTLEASE_TOOL_MODULES": "mytools,moretools",
        "AGENTLEASE_WORKFLOW_MODULES": "myagents",
        "AGENTLEASE_HTTP_BASE_URL": "http://127.0.0.1:9000",
        "AGENTLEASE_SMTP_PORT": "25",
        "PYTHONPATH": "/srv/my tools",
    }


def test_a_ledger_password_is_masked_and_said_to_be() -> None:
    settings = AgentLeaseSettings(ledger_url="postgresql://agentlease:s3cret@db:5432/ledger")
    lines, masked = export_lines(settings)
    assert masked
    assert "s3cret" not in "\n".join(lines)
    assert exported(lines)["AGENTLEASE_LEDGER_URL"] == "postgresql://agentlease:***@db:5432/ledger"
