"""Shared fixtures: a temporary dataset store and an in-process CLI runner."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from rlpipe.cli.main import main

torch.set_num_threads(1)


@dataclass
class CliResult:
    code: int
    out: str
    err: str


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """An empty dataset store directory."""
    path = tmp_path / "store"
    path.mkdir()
    return path


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """Run `rlpipe ARGS...` in-process; returns exit code, stdout and stderr."""

    def run(*args: str) -> CliResult:
        monkeypatch.setattr(sys, "argv", ["rlpipe", *map(str, args)])
        with pytest.raises(SystemExit) as exit_info:
            main()
        captured = capsys.readouterr()
        return CliResult(int(exit_info.value.code or 0), captured.out, captured.err)

    return run
