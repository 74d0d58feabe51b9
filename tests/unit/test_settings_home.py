"""One home per setting: the CLI's flags and docs/settings.md are made from AgentLeaseSettings and held to it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.main import get_command

from agentlease.cli.app import app
from agentlease.cli.options import COMMANDS, with_settings_table
from agentlease.settings import AgentLeaseSettings, default_text, env_var
from agentlease.worker import main

ROOT = Path(__file__).resolve().parents[2]
SETTINGS_PAGE = ROOT / "docs" / "settings.md"


def _options() -> dict[str, list[typer.core.TyperOption]]:
    """Every option of every command, by its variable."""
    found: dict[str, list[typer.core.TyperOption]] = {}

    def walk(command: object) -> None:
        for param in getattr(command, "params", []):
            if param.envvar:
                found.setdefault(param.envvar, []).append(param)
        for sub in getattr(command, "commands", {}).values():
            walk(sub)

    walk(get_command(app))
    return found


def test_every_setting_has_a_documented_field() -> None:
    undocumented = [name for name, field in AgentLeaseSettings.model_fields.items() if not field.description]
    assert undocumented == []


def test_every_setting_is_a_flag_whose_help_is_the_fields_description() -> None:
    options = _options()
    for name, field in AgentLeaseSettings.model_fields.items():
        assert env_var(name) in options, f"no flag reads {env_var(name)}"
        for option in options[env_var(name)]:
            assert option.default is None, (name, option.default)  # the default is the model's
            assert (field.description or "").replace("`", "") in (option.help or ""), name
            if field.get_default(call_default_factory=True) is not None:
                assert f"Default {default_text(name)}." in (option.help or ""), name


def test_every_variable_a_flag_reads_is_a_setting() -> None:
    # The flags of settings come from the model; no command reads an AGENTLEASE_ variable of its own.
    assert set(_options()) == {env_var(name) for name in AgentLeaseSettings.model_fields}


def test_every_setting_has_a_command() -> None:
    placed = {flag.setting for group in COMMANDS.values() for flag in group}
    assert placed == set(AgentLeaseSettings.model_fields)


def test_the_docs_settings_table_is_the_models() -> None:
    page = SETTINGS_PAGE.read_text()
    assert page == with_settings_table(page), (
        "docs/settings.md drifted from AgentLeaseSettings; rewrite its table with "
        "`.venv/bin/python -m agentlease.cli.options docs/settings.md`"
    )


def test_a_command_without_its_extra_says_which_to_install() -> None:
    code = (
        "import sys; sys.modules['uvicorn'] = None\nfrom agentlease.cli.app import _run\nsys.exit(_run(sys.argv[1:]))\n"
    )
    for command, extra in (("ui", "ui"), ("codec-server", "ui"), ("demo", "demo"), ("dev", "demo")):
        argv = [sys.executable, "-c", code, command]
        done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done
        assert done.stderr == (
            f"error: agentlease {command} needs the {extra!r} extra: pip install 'agentlease[{extra}]'\n"
        ), done.stderr


def test_a_bad_setting_is_named_by_its_variable_in_a_workers_script(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python worker.py`` (``agentlease.worker.main``) names the variable, as the CLI does."""
    monkeypatch.setenv("AGENTLEASE_APPROVAL_TTL", "1e12")
    assert main() == 2
    assert capsys.readouterr().err == (
        "error: bad setting: AGENTLEASE_APPROVAL_TTL: Input should be less than or equal to 30 days\n"
    )
