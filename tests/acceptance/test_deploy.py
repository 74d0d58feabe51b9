"""The deployment files: the compose file validates, and the worker image's entrypoint, run outside
Docker (no Docker engine runs here), migrates a ledger and serves as a worker until SIGTERM."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import tomllib
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml  # type: ignore[import-untyped]
from sqlalchemy.engine import make_url
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


async def polled(address: str, queue: str = "deploy-check", identity: str = "image-check") -> None:
    client = await Client.connect(address)
    await wait_for_poller(client, queue, identity, timeout=60)


def test_the_entrypoint_migrates_and_serves_a_worker_until_sigterm(
    cli: Cli, temporal_address: str, tmp_path: Path
) -> None:
    env = image_env(
        cli,
        AGENTLEASE_LEDGER_URL=f"sqlite:///{tmp_path / 'ledger.db'}",
        AGENTLEASE_TEMPORAL_ADDRESS=temporal_address,
        AGENTLEASE_TASK_QUEUE="deploy-check",
    )
    migrated = _run_image(cli, env, "db", "upgrade")
    assert migrated.returncode == 0, migrated.stderr
    assert "is at the newest schema" in migrated.stdout, migrated.stdout

    worker = Background(cli, env={**env, "AGENTLEASE_WORKER_IDENTITY": "image-check"}, program=ENTRYPOINT)
    worker.wait_for_line(r"worker on .* queue deploy-check", timeout=60)  # no arguments: the CMD, `worker`
    asyncio.run(polled(temporal_address))
    assert worker.stop(signal.SIGTERM) == 0, "".join(worker.stderr)


def _run_image(cli: Cli, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """One command of the image, through its entrypoint, outside Docker."""
    return subprocess.run(
        [str(ENTRYPOINT), *args],
        env={**os.environ, **cli.env(env)},
        cwd=cli.cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def _compose_config() -> dict[str, Any]:
    result = subprocess.run(
        ["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "config"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return yaml.safe_load(result.stdout)


def test_the_compose_workers_connect_as_the_role_the_grants_restrict() -> None:
    services = _compose_config()["services"]
    worker_url = make_url(services["agentlease-worker"]["environment"]["AGENTLEASE_LEDGER_URL"])
    grants = services["ledger-grants"]["command"]
    assert f"--worker-role={worker_url.username}" in grants, grants
    assert "--apply" in grants
    owner = make_url(services["migrate"]["environment"]["AGENTLEASE_LEDGER_URL"]).username
    assert worker_url.username != owner, "workers must not connect as the ledger's owner"
    assert services["agentlease-worker"]["depends_on"]["ledger-grants"]["condition"] == "service_completed_successfully"
    # docker-compose 1.x prints short volume syntax, SOURCE:TARGET:MODE
    init = [v for v in services["ledger-db"]["volumes"] if "/docker-entrypoint-initdb.d/" in str(v)]
    assert init and "deploy/ledger/create-roles.sh:" in str(init[0]), services["ledger-db"]["volumes"]


@pytest.mark.postgres
def test_the_image_sets_up_least_privilege_roles_and_serves_as_the_worker_role(
    cli: Cli, temporal_address: str, pg_ledger_url: str
) -> None:
    """What the compose stack does at its first start, run outside Docker on real PostgreSQL: the
    init script makes the three roles, migrate and ledger-grants run as the owner, then a worker
    serves as the worker role, which cannot delete evidence; the reader role reads."""
    suffix = uuid.uuid4().hex[:8]
    roles = {kind: f"agentlease_{kind}_{suffix}" for kind in ("worker", "operator", "reader")}
    url = make_url(pg_ledger_url)
    made = subprocess.run(
        [str(ROOT / "deploy" / "ledger" / "create-roles.sh")],
        env={
            **os.environ,
            "POSTGRES_USER": url.username or "postgres",
            "POSTGRES_DB": url.database or "",
            "PGHOST": url.host or "127.0.0.1",
            "PGPORT": str(url.port or 5432),
            **{f"LEDGER_{kind.upper()}_ROLE": name for kind, name in roles.items()},
            **{f"LEDGER_{kind.upper()}_PASSWORD": f"pw-{kind}" for kind in roles},
        },
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    try:
        assert made.returncode == 0, made.stderr
        owner = image_env(cli, AGENTLEASE_LEDGER_URL=pg_ledger_url)
        upgraded = _run_image(cli, owner, "db", "upgrade")
        assert upgraded.returncode == 0, upgraded.stderr
        granted = _run_image(
            cli,
            owner,
            "db",
            "grant",
            f"--worker-role={roles['worker']}",
            f"--operator-role={roles['operator']}",
            f"--reader-role={roles['reader']}",
            "--apply",
        )
        assert granted.returncode == 0, granted.stderr

        def as_role(kind: str, **extra: str) -> dict[str, str]:
            role_url = url.set(username=roles[kind], password=f"pw-{kind}").render_as_string(hide_password=False)
            return image_env(cli, AGENTLEASE_LEDGER_URL=role_url, **extra)

        queue, identity = f"roles-{suffix}", f"role-check-{suffix}"  # pollers are remembered: new names
        worker_env = as_role("worker", AGENTLEASE_TEMPORAL_ADDRESS=temporal_address, AGENTLEASE_TASK_QUEUE=queue)
        worker = Background(cli, env={**worker_env, "AGENTLEASE_WORKER_IDENTITY": identity}, program=ENTRYPOINT)
        worker.wait_for_line(rf"worker on .* queue {queue}", timeout=60)
        asyncio.run(polled(temporal_address, queue, identity))
        assert worker.stop(signal.SIGTERM) == 0, "".join(worker.stderr)

        # The worker role cannot widen its own privileges: the grants need the ledger's owner.
        widened = _run_image(
            cli, as_role("worker"), "db", "grant", f"--worker-role={roles['worker']}", "--reader-role=x", "--apply"
        )
        assert widened.returncode != 0, widened.stdout
        assert "Traceback" not in widened.stderr and len(widened.stderr.strip().splitlines()) == 1, widened.stderr
        read = _run_image(cli, as_role("reader"), "runs")
        assert read.returncode == 0, read.stderr
    finally:
        for name in roles.values():
            asyncio.run(_drop_role(pg_ledger_url, name))


async def _drop_role(url: str, role: str) -> None:
    admin = await asyncpg.connect(make_url(url).set(drivername="postgresql").render_as_string(hide_password=False))
    try:
        if await admin.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", role):
            await admin.execute(f'DROP OWNED BY "{role}"')
            await admin.execute(f'DROP ROLE "{role}"')
    finally:
        await admin.close()


def test_the_namespace_setup_creates_every_search_attribute_with_its_type() -> None:
    from agentlease.observability import search_attributes

    script = (ROOT / "deploy" / "temporal" / "create-namespace.sh").read_text()
    listed = set(re.findall(r"\b(AgentLease\w+):(\w+)", script))
    assert listed == {(key.name, search_attributes.type_name(key)) for key in search_attributes.ALL}
