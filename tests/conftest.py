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


def store_contents(store: Path) -> list[str]:
    """The store's entries, without the lock and verification-cache folders every store has."""
    return sorted(p.name for p in store.iterdir() if p.name not in (".locks", ".verified"))


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


@pytest.fixture(scope="session")
def offline_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store shared by the offline tests, built once per session (about 30 s):
    `cartpole-expert` (20 episodes of a PPO expert that scores 500) and `pendulum-mixed`
    (every transition of a 10k-step SAC run from scratch, as in the reference CQL chapter)."""
    from rlpipe.algos import get_algo
    from rlpipe.pipeline.collect import collect_dataset

    root = tmp_path_factory.mktemp("offline")
    store, models = root / "datasets", root / "models"
    ppo = get_algo("ppo")
    ppo.train(ppo.make_config("CartPole-v1", stop_at_return=500.0), models / "ppo-cartpole", progress=False)
    collect_dataset("CartPole-v1", expert="ppo", expert_run=models / "ppo-cartpole", episodes=20, num_envs=4,
                    name="cartpole-expert", store=store, progress=False)
    collect_dataset("Pendulum-v1", expert="sac", from_training=True, expert_run=models / "sac-mixed", seed=0,
                    name="pendulum-mixed", store=store, progress=False)
    return store
