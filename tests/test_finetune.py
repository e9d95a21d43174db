"""Offline-to-online fine-tuning (`--finetune-env-steps`): both phases in one run, minibatches
drawn from the dataset and the online data together."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import torch

from rlpipe.datasets.loader import TransitionArrays
from rlpipe.training.buffer import ReplayBuffer
from rlpipe.training.offline import DatasetAndOnline
from rlpipe.training.sampler import TransitionSampler


def zero_dataset(rows: int) -> TransitionArrays:
    return TransitionArrays(
        obs=np.zeros((rows, 2), np.float32),
        action=np.zeros((rows, 1), np.float32),
        reward=np.zeros(rows, np.float32),
        next_obs=np.zeros((rows, 2), np.float32),
        terminated=np.zeros(rows, bool),
        truncated=np.zeros(rows, bool),
        episode_id=np.zeros(rows, np.int64),
        step=np.arange(rows),
    )


def test_minibatches_draw_from_dataset_and_online_rows_in_proportion() -> None:
    online = ReplayBuffer(1000, 2, 1)
    replay = DatasetAndOnline(TransitionSampler(zero_dataset(100)), online, seed=0)
    assert float(replay.sample(512).rewards.sum()) == 0.0  # nothing collected yet: the dataset alone
    online.add(np.ones((300, 2)), np.ones((300, 1)), np.ones(300), np.ones((300, 2)), np.zeros(300))
    batch = replay.sample(4096)
    assert batch.obs.shape == (4096, 2) and batch.actions.shape == (4096, 1)
    share = float(batch.rewards.mean())  # online rows carry reward 1: 300 of 400 rows
    assert 0.72 < share < 0.78
    assert torch.equal(batch.obs[:, 0], batch.rewards)  # rows stay whole across the two sources


def test_a_mixing_ratio_fixes_the_dataset_share_of_each_minibatch() -> None:
    online = ReplayBuffer(1000, 2, 1)
    replay = DatasetAndOnline(TransitionSampler(zero_dataset(100)), online, seed=0, mixing_ratio=0.25)
    assert float(replay.sample(512).rewards.sum()) == 0.0  # nothing collected yet: the dataset alone
    online.add(np.ones((3, 2)), np.ones((3, 1)), np.ones(3), np.ones((3, 2)), np.zeros(3))
    batch = replay.sample(400)
    assert batch.obs.shape == (400, 2) and float(batch.rewards.sum()) == 300.0  # 3 online rows of 103 fill 3/4 of it
    assert torch.equal(batch.obs[:, 0], batch.rewards)


def test_a_finetuned_run_records_both_phases(tmp_path: Path, cli) -> None:
    store = tmp_path / "datasets"
    assert cli("collect", "--env", "Pendulum-v1", "--episodes", "3", "--num-envs", "3", "--store", store, "--quiet").code == 0
    run = tmp_path / "iql"
    result = cli(
        "train",
        "iql",
        "--dataset",
        "pendulum-random",
        "--store",
        store,
        "--updates",
        "200",
        "--finetune-env-steps",
        "400",
        "--set",
        "finetune_eval_every=200",
        "--set",
        "eval_every=100",
        "--set",
        "eval_episodes=2",
        "--set",
        "heldout_eval_episodes=2",
        "--out",
        run,
        "--no-progress",
        "--device",
        "cpu",
    )
    assert result.code == 0, result.err
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["offline_updates"] == 200 and metrics["finetune_env_steps"] == 400 and metrics["env_steps"] == 400
    assert metrics["gradient_updates"] == 600  # one update per env step after the offline ones
    assert {"offline_eval_return_mean", "offline_heldout_return_mean", "heldout_return_mean"} <= set(metrics)
    with open(run / "dvclive" / "plots" / "metrics" / "eval" / "return_mean.tsv") as fh:
        steps = [int(row["step"]) for row in csv.DictReader(fh, delimiter="\t")]
    assert steps == [100, 200, 400, 600]  # the offline curve, then every 200 env steps, in updates


def test_a_goal_dataset_finetunes_in_its_goal_env(tmp_path: Path, cli) -> None:
    """A Cal-QL run on GoalWorld's data fine-tunes in GoalWorld: the env's Dict observations are
    flattened online as the dataset's were, so the actor and the online rows read one layout."""
    store = tmp_path / "datasets"
    assert cli("collect", "--env", "GoalWorld-v0", "--episodes", "4", "--num-envs", "2", "--store", store, "--quiet").code == 0
    run = tmp_path / "calql"
    settings = "--updates 20 --finetune-env-steps 120 --set finetune_eval_every=60 --set eval_every=20 --set eval_episodes=1"
    tiny = "--set heldout_eval_episodes=1 --set hidden=[16,16] --no-progress --device cpu"
    result = cli("train", "calql", "--dataset", "goalworld-random", "--store", store, *settings.split(), *tiny.split(), "--out", run)
    assert result.code == 0, result.err
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["finetune_env_steps"] == 120 and metrics["gradient_updates"] == 140
    assert {"offline_heldout_return_mean", "heldout_return_mean", "bound_rate"} <= set(metrics)


def test_finetuning_is_refused_where_it_does_not_apply(tmp_path: Path, cli) -> None:
    store = tmp_path / "datasets"
    assert cli("collect", "--env", "CartPole-v1", "--episodes", "3", "--num-envs", "3", "--store", store, "--quiet").code == 0
    for args, message in (
        (["bc", "--dataset", "cartpole-random"], "go on online ("),
        (["cql", "--dataset", "cartpole-random", "--updates", "10"], "continuous-action dataset"),
    ):
        result = cli("train", *args, "--store", store, "--finetune-env-steps", "10", "--out", tmp_path / "run", "--no-progress")
        assert result.code == 2 and message in result.err and len(result.err.strip().splitlines()) == 1, result.err
        assert not (tmp_path / "run").exists()
