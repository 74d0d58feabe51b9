"""The deployment files: the compose file validates, and the worker image's entrypoint, run outside
Docker (no Docker engine runs here), migrates a ledger and serves as a worker until SIGTERM."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import tomllib
from pathlib import Path

import pytest
from temporalio.client import Client

from .runner import AGENTLEASE, Background, Cli, wait_for_poller

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "deploy" / "entrypoint.sh"

pytestmark = pytest.mark.timeout(180)


def image_env(cli: Cli, **extra: str) -> dict[str, str]:
    """The environment of the image: its virtualenv's bin first on PATH, as the Dockerfile sets it."""
    return {"PATH": f"{AGENTLEASE.parent}{os.pathsep}{os.environ['PATH']}", **extra}


def test_the_compose_file_validates() -> None:
    result = subprocess.run(
        ["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr


def test_the_image_installs_every_package_with_pinned_versions() -> None:
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for path in project["tool"]["hatch"]["build"]["targets"]["wheel"]["only-include"]:
        assert re.search(rf"^COPY .*\b{re.escape(path)}\b", dockerfile, re.M), f"the image lacks {path}"
    pinned = {
        line.split("==")[0].lower().replace("_", "-")
        for line in (ROOT / "deploy" / "constraints.txt").read_text().splitlines()
        if "==" in line
    }
    for requirement in project["project"]["dependencies"]:
        name = re.split(r"[<>=\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")
        assert name in pinned, f"{name} is not pinned in deploy/constraints.txt"


async def polled(address: str) -> None:
    client = await Client.connect(address)
    await wait_for_poller(client, "deploy-check", "image-check", timeout=60)


def test_the_entrypoint_migrates_and_serves_a_worker_until_sigterm(
    cli: Cli, temporal_address: str, tmp_path: Path
) -> None:
    env = image_env(
        cli,
        AGENTLEASE_LEDGER_URL=f"sqlite:///{tmp_path / 'ledger.db'}",
        AGENTLEASE_TEMPORAL_ADDRESS=temporal_address,
        AGENTLEASE_TASK_QUEUE="deploy-check",
    )
    migrated = subprocess.run(
        [str(ENTRYPOINT), "db", "upgrade"],
        env={**os.environ, **cli.env(env)},
        cwd=cli.cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert migrated.returncode == 0, migrated.stderr
    assert "is at the newest schema" in migrated.stdout, migrated.stdout

    worker = Background(cli, env={**env, "AGENTLEASE_WORKER_IDENTITY": "image-check"}, program=ENTRYPOINT)
    worker.wait_for_line(r"worker on .* queue deploy-check", timeout=60)  # no arguments: the CMD, `worker`
    asyncio.run(polled(temporal_address))
    assert worker.stop(signal.SIGTERM) == 0, "".join(worker.stderr)
