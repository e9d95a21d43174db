"""Shared fixtures: a temporary dataset store and an in-process CLI runner."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
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
    """The store's entries, without the root marker, lock and verification-cache folders every store has."""
    return sorted(p.name for p in store.iterdir() if p.name not in (".rlpipe-root", ".locks", ".verified"))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With $RLPIPE_TEST_RECORD set, append each learning test's recorded returns to that
    JSON-lines file as soon as it finishes (a seed sweep's partial results survive)."""
    path = os.environ.get("RLPIPE_TEST_RECORD")
    relayed = getattr(report, "node", None) is not None  # pytest-xdist's controller sees each worker's report again
    if path and not relayed and report.when == "call" and report.user_properties:
        with open(path, "a") as f:
            record = {"test": report.nodeid, "outcome": report.outcome, **dict(report.user_properties)}
            f.write(json.dumps(record) + "\n")


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """An empty dataset store directory."""
    path = tmp_path / "store"
    path.mkdir()
    return path


@pytest.fixture(
    scope="session", params=[int(s) for s in os.environ.get("RLPIPE_TEST_SEED", "0").split(",")], ids=lambda seed: f"seed{seed}"
)
def learning_seed(request: pytest.FixtureRequest) -> int:
    """The training seed of a learning test: $RLPIPE_TEST_SEED, default 0; a comma list
    (`RLPIPE_TEST_SEED=0,1,2,3,4 pytest -m slow --junitxml=sweep.xml`) runs every learning
    test once per seed in one session, to check that thresholds hold for seeds 0-4 without
    editing the tests (each test records its returns with ``record_property``, so they land
    in the XML)."""
    return request.param


@pytest.fixture(scope="session")
def non_learning_returns() -> Callable[..., dict[str, float]]:
    """``returns(env_id, seed, episodes=10)`` -> mean returns of the controls a learning test's
    bar must clear: zero action and uniform random actions, evaluated as a run with ``seed``
    evaluates its policy (same eval env seeds)."""
    from rlpipe.training.env import env_spaces
    from rlpipe.training.evaluation import evaluate
    from rlpipe.training.run import EVAL_SEED_OFFSET

    def returns(env_id: str, seed: int, episodes: int = 10) -> dict[str, float]:
        space = env_spaces(env_id)[1]
        rng = np.random.default_rng(seed)
        policies = {
            "zero": lambda obs: np.zeros((len(obs), *space.shape), space.dtype),
            "uniform": lambda obs: rng.uniform(space.low, space.high, (len(obs), *space.shape)).astype(space.dtype),
        }
        eval_seed = seed + EVAL_SEED_OFFSET
        return {name: evaluate(policy, env_id, episodes, eval_seed).mean for name, policy in policies.items()}

    return returns


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
    (every transition of a 10k-step SAC run from scratch, as in the reference CQL chapter)
    and `pendulum-expert` (20 episodes of that run's final policy; `pendulum-expert-sampled`:
    the same with its sampled actions)."""
    from rlpipe.algos import get_algo
    from rlpipe.commands.collect import collect_dataset

    root = tmp_path_factory.mktemp("offline")
    store, models = root / "datasets", root / "models"
    ppo = get_algo("ppo")
    ppo.train(ppo.make_config("CartPole-v1", stop_at_return=500.0), models / "ppo-cartpole", progress=False)
    collect_dataset(
        "CartPole-v1",
        expert="ppo",
        expert_run=models / "ppo-cartpole",
        episodes=20,
        num_envs=4,
        name="cartpole-expert",
        store=store,
        progress=False,
    )
    collect_dataset(
        "Pendulum-v1",
        expert="sac",
        from_training=True,
        expert_run=models / "sac-mixed",
        seed=0,
        name="pendulum-mixed",
        store=store,
        progress=False,
    )
    # The end of that run: an expert like the pipeline's.
    for name, stochastic in [("pendulum-expert", False), ("pendulum-expert-sampled", True)]:
        collect_dataset(
            "Pendulum-v1",
            expert="sac",
            expert_run=models / "sac-mixed",
            episodes=20,
            num_envs=4,
            stochastic=stochastic,
            name=name,
            store=store,
            progress=False,
        )
    return store
