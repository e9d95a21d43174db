"""`rlpipe --version` and `python -m rlpipe`: one version, written in one place."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import tomllib

import rlpipe

REPO = Path(__file__).resolve().parents[1]


def test_version_has_one_source(cli) -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert version("rlpipe") == rlpipe.__version__
    result = cli("--version")
    assert (result.code, result.out) == (0, f"rlpipe {rlpipe.__version__}\n")


def test_python_dash_m_runs_the_cli() -> None:
    run = subprocess.run([sys.executable, "-m", "rlpipe", "--version"], capture_output=True, text=True, cwd=REPO)
    assert (run.returncode, run.stdout) == (0, f"rlpipe {rlpipe.__version__}\n")
    run = subprocess.run([sys.executable, "-m", "rlpipe", "train", "no-such-algo"], capture_output=True, text=True, cwd=REPO)
    assert run.returncode == 2 and run.stderr.startswith("error:") and len(run.stderr.strip().splitlines()) == 1
