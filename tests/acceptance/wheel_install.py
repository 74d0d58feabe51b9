"""The project's wheel, built and installed into a fresh virtualenv as a user installs it.

``pip wheel --no-deps`` builds it from the checkout; ``python -m venv`` plus ``pip install
'<wheel>[openai-agents,pydantic-ai,langgraph,google-adk]'`` installs it (pip reuses the machine's cache). What the wheel
put into site-packages is read from its ``RECORD``. CI has made that virtualenv already (``.ci/run``)
and names it in ``AGENTLEASE_TEST_WHEEL_VENV``: it is used once its ``RECORD`` shows this checkout's
modules, byte for byte.
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

INSTALL_TIMEOUT_S = 600.0
"""Deadline of building the wheel and installing it with its dependencies. Default 600s."""


@dataclass(frozen=True)
class InstalledWheel:
    """A virtualenv holding the wheel.

    Attributes:
        venv: the virtualenv's directory.
        top_level: the names the wheel installed at the root of site-packages (``*.dist-info`` excluded).
        scripts: the files it installed into the virtualenv's ``bin``.
    """

    venv: Path
    top_level: frozenset[str]
    scripts: frozenset[str]

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def bin(self, name: str) -> Path:
        return self.venv / "bin" / name


def _run(*command: str | Path, cwd: Path) -> None:
    done = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        env=clean_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"{' '.join(map(str, command))} -> {done.returncode}\n{done.stdout}\n{done.stderr}"


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The caller's environment without anything that points Python at this checkout or a virtualenv
    (``PYTHONPATH``, ``VIRTUAL_ENV``) or configures agentlease (``AGENTLEASE_*``), plus ``extra``."""
    dropped = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
    env = {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("AGENTLEASE_")}
    env.update(extra or {})
    return env


PREBUILT_VARIABLE = "AGENTLEASE_TEST_WHEEL_VENV"
"""A virtualenv holding this checkout's wheel with the framework extras the run adopts, made before the tests
(``.ci/run``)."""


def build_and_install(work: Path, extras: str) -> InstalledWheel:
    """Build the wheel into ``work/dist`` and install it, with ``extras``, into the fresh ``work/venv``; or
    the virtualenv named in ``AGENTLEASE_TEST_WHEEL_VENV`` when its wheel holds this checkout's modules."""
    prebuilt = os.environ.get(PREBUILT_VARIABLE)
    if prebuilt:
        venv = Path(prebuilt)
        assert _holds_this_checkout(venv), f"{PREBUILT_VARIABLE}={venv} holds another agentlease than {REPO}"
        return InstalledWheel(venv, *installed_names(venv))
    dist, venv = work / "dist", work / "venv"
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", dist, REPO, cwd=work)
    [wheel] = dist.glob("agentlease-*.whl")
    _run(sys.executable, "-m", "venv", venv, cwd=work)
    _run(venv / "bin" / "python", "-m", "pip", "install", "--quiet", f"{wheel}[{extras}]", cwd=work)
    return InstalledWheel(venv, *installed_names(venv))


def _record(venv: Path) -> list[tuple[str, str]]:
    """``(path, digest)`` of each file the ``agentlease`` distribution installed into ``venv`` (its ``RECORD``)."""
    [record] = venv.glob("lib/python*/site-packages/agentlease-*.dist-info/RECORD")
    return [(path, digest) for path, digest, _size in (line.rsplit(",", 2) for line in record.read_text().splitlines())]


def installed_names(venv: Path) -> tuple[frozenset[str], frozenset[str]]:
    """``(top-level names, scripts)`` that the ``agentlease`` distribution installed into ``venv``."""
    top_level: set[str] = set()
    scripts: set[str] = set()
    for path, _digest in _record(venv):
        if not path:
            continue
        if path.startswith("../"):  # outside site-packages: a console script in bin/
            scripts.add(Path(path).name)
            continue
        first = path.split("/", 1)[0]
        if not first.endswith(".dist-info"):
            top_level.add(first.removesuffix(".py"))
    return frozenset(top_level), frozenset(scripts)


def _holds_this_checkout(venv: Path) -> bool:
    """Whether the ``agentlease`` installed in ``venv`` has exactly this checkout's modules (by ``RECORD``)."""
    recorded = {
        path: digest for path, digest in _record(venv) if path.startswith("agentlease/") and path.endswith(".py")
    }
    ours = {
        str(p.relative_to(REPO)): "sha256="
        + base64.urlsafe_b64encode(hashlib.sha256(p.read_bytes()).digest()).rstrip(b"=").decode()
        for p in (REPO / "agentlease").rglob("*.py")
    }
    return recorded == ours
