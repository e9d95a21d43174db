"""docs/contributing.md's "add an algorithm" steps are complete: a tiny algorithm written
here by those steps alone (one module with its Config, TUNED, ACTION_SPACES and train, and its
AlgoSpec row registered) trains, evaluates and loads through the same code paths as a shipped one."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from rlpipe.algos import load_policy, registry
from rlpipe.algos.registry import OFFLINE_OBSERVATION_KINDS, AlgoSpec, Family
from rlpipe.errors import RlpipeError
from tests.test_collector import collect_dataset

# Behaviour cloning on a small MLP, the shortest algorithm the shared pieces allow.
TINY_ALGORITHM = '''
"""Tiny behaviour cloning: a small categorical policy fitted to the dataset's actions."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlpipe.algos.registry import REGISTRY
from rlpipe.nets.networks import CategoricalActor
from rlpipe.training import Batch, OfflineConfig, TrainResult
from rlpipe.training.config import positive
from rlpipe.training.env import DISCRETE
from rlpipe.training.offline import Learner, load_offline, train_offline
from rlpipe.training.optim import adam, optimizer_step

ACTION_SPACES = (DISCRETE,)
SPEC = REGISTRY["tinybc"]


@dataclass
class Config(OfflineConfig):
    updates: int = positive(50)
    batch_size: int = positive(32)
    learning_rate: float = positive(1e-2)
    hidden: tuple[int, ...] = positive((16,))


TUNED: dict[str, dict[str, Any]] = {"CartPole-v1": dict(updates=40)}


def train(config: Config, out_dir: str | Path | None = None, *, progress: bool = True) -> TrainResult:
    data = load_offline(SPEC.name, config, ACTION_SPACES)
    actor = CategoricalActor(data.obs_dim, data.act_dim, config.hidden).to(data.device)
    optimizer = adam(actor.parameters(), config.learning_rate)

    def update(b: Batch, i: int) -> None:
        optimizer_step(optimizer, -actor.dist(b.obs).log_prob(b.actions.long()).mean())

    return train_offline(SPEC.name, config, data, Learner({"policy": actor}, update), out_dir, progress)
'''


@pytest.fixture
def tiny_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The tiny algorithm's module, importable, with the registry restored afterwards."""
    (tmp_path / "tiny_algorithm.py").write_text(textwrap.dedent(TINY_ALGORITHM))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "REGISTRY", dict(registry.REGISTRY))
    return "tiny_algorithm"


def test_an_algorithm_added_by_the_documented_steps_trains_evaluates_and_loads(tiny_module: str, tmp_path: Path, cli) -> None:
    store, run = tmp_path / "store", tmp_path / "run"
    collect_dataset(store, "CartPole-v1", "cartpole", fmt="arrow", episodes=4, num_envs=2)
    train = ["train", "tinybc", "--dataset", "cartpole", "--store", store, "--out", run, "--no-progress"]
    # control: before registration the name is unknown
    refused = cli(*train)
    assert refused.code == 2 and "unknown algorithm 'tinybc'" in refused.err and not run.exists()

    (spec,) = registry.register(tiny_spec(tiny_module))
    assert spec.name == "tinybc" and spec.module == tiny_module and not spec.online
    assert tiny_module not in sys.modules  # registering reads no code: the module loads when the run needs it
    # its own fields' constraints come from its field declarations, no global list
    bad = cli(*train, "--set", "learning_rate=-1")
    assert bad.code == 2 and bad.err.strip().endswith("setting learning_rate=-1.0: expected a positive number")

    assert cli(*train, "--set", "eval_every=20", "--set", "heldout_eval_episodes=2").code == 0
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["algo"] == "tinybc" and metrics["gradient_updates"] == 40  # its TUNED value for the dataset's env
    evaluated = cli("eval", run, "--episodes", "2", "--json")
    assert evaluated.code == 0 and json.loads(evaluated.out)["episodes"] == 2
    policy = load_policy(run)
    assert policy.env_id == "CartPole-v1"


def tiny_spec(module: str, name: str = "tinybc") -> AlgoSpec:
    return AlgoSpec(
        name=name,
        module=module,
        family=Family.IMITATION,
        online=False,
        observation_kinds_ref=OFFLINE_OBSERVATION_KINDS,
        summary="tiny behaviour cloning",
    )


def test_a_name_is_registered_once_and_a_spec_names_its_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "REGISTRY", dict(registry.REGISTRY))
    with pytest.raises(RlpipeError, match=r"^algorithm name cql is taken$"):
        registry.register(tiny_spec("tiny_algorithm", name="cql"))
    with pytest.raises(RlpipeError, match=r"^algorithm x: its AlgoSpec names no module$"):
        registry.register(tiny_spec("", name="x"))
    # control: a new name with its module registers, once
    assert [spec.name for spec in registry.register(tiny_spec("tiny_algorithm", name="x"))] == ["x"]
    with pytest.raises(RlpipeError, match=r"^algorithm name x is taken$"):
        registry.register(tiny_spec("tiny_algorithm", name="x"))
