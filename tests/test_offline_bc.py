"""Behaviour cloning and the shared offline pieces (dataset checks, subsets, CLI)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rlpipe.algos import get_algo
from rlpipe.datasets.loader import load_dataset
from rlpipe.errors import RlpipeError
from rlpipe.training.offline import subset_rows


def test_subset_rows_come_from_the_first_episodes(offline_store: Path) -> None:
    data = load_dataset("cartpole-expert", offline_store)
    rows = subset_rows(data, 30, seed=0)
    assert len(rows) == 30 and len(np.unique(rows)) == 30
    assert np.all(data.episode_id[rows] == 0)  # one expert episode holds 500 steps
    np.testing.assert_array_equal(rows, subset_rows(data, 30, seed=0))
    with pytest.raises(RlpipeError, match="at least 1"):
        subset_rows(data, 0, seed=0)


@pytest.mark.slow
def test_bc_clones_the_cartpole_expert(offline_store: Path, learning_seed: int, record_property) -> None:
    bc = get_algo("bc")
    config = bc.make_config("CartPole-v1", dataset="cartpole-expert", store=str(offline_store), updates=1000, seed=learning_seed)
    result = bc.train(config, progress=False)
    record_property("eval_return_mean", result.metrics["eval_return_mean"])
    assert result.metrics["eval_return_mean"] >= 475  # seeds 0-4: 500.0 each


@pytest.mark.slow
def test_bc_from_30_pairs(offline_store: Path, learning_seed: int, record_property) -> None:
    bc = get_algo("bc")
    config = bc.make_config(
        "CartPole-v1", dataset="cartpole-expert", store=str(offline_store), updates=1000, max_samples=30, seed=learning_seed
    )
    result = bc.train(config, progress=False)
    record_property("eval_return_mean", result.metrics["eval_return_mean"])
    assert result.metrics["dataset_transitions"] == 30
    # Seeds 0-4: 380.0, 144.5, 188.6, 310.4, 357.4 (the reference text: 199.3 of v0's 200);
    # random actions score about 22. Thirty pairs of one episode leave the rest of the state
    # space to chance: more updates do not help (seed 1 stays at 145-151 up to 4000 updates,
    # seed 2 reaches 230), so the bar is set below the worst seed, far above random.
    assert result.metrics["eval_return_mean"] >= 100


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["mse", "gaussian"])
def test_bc_continuous_learns_from_the_late_part_of_pendulum_mixed(
    offline_store: Path, loss: str, learning_seed: int, record_property, non_learning_returns
) -> None:
    """Cloning a mixed dataset gives a mediocre policy, clearly better than not learning:
    zero torque and uniform random actions on the same eval episodes are the controls."""
    bc = get_algo("bc")
    config = bc.make_config(
        "Pendulum-v1", dataset="pendulum-mixed", store=str(offline_store), updates=2000, continuous_loss=loss, seed=learning_seed
    )
    result = bc.train(config, progress=False).metrics["eval_return_mean"]
    controls = non_learning_returns("Pendulum-v1", learning_seed)
    record_property("eval_return_mean", result)
    record_property("controls", controls)
    # Controls, seeds 0-4 (zero torque / uniform random): -1071.7/-1118.2, -1167.3/-1185.9,
    # -1113.9/-1117.0, -1173.6/-1202.0, -1139.6/-1224.3.
    assert max(controls.values()) < -1000, controls
    # Seeds 0-4, mse: -524.3, -569.1, -627.4, -780.8, -753.3; gaussian: -449.7, -364.4, -461.2,
    # -587.4, -378.9. Above the better control by 386 to 803.
    assert result >= -900, result
    assert result - max(controls.values()) >= 250, (result, controls)


def test_offline_cli_and_bad_input(offline_store: Path, tmp_path: Path, cli) -> None:
    out = tmp_path / "bc"
    ok = cli("train", "bc", "--dataset", "cartpole-expert", "--store", offline_store, "--updates", "200", "--out", out, "--no-progress")
    assert ok.code == 0, ok.err
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["gradient_updates"] == 200 and metrics["dataset"] == "cartpole-expert"
    assert (out / "dvclive" / "plots" / "metrics" / "eval" / "return_mean.tsv").exists()
    evaluated = cli("eval", out, "--episodes", "2", "--json")
    assert evaluated.code == 0 and json.loads(evaluated.out)["env_id"] == "CartPole-v1"
    for args, message in [
        (["bc"], "give --dataset NAME"),
        (["bc", "--dataset", "missing"], "dataset 'missing' not found"),
        (["bc", "--dataset", "cartpole-expert", "--env", "CartPole-v1"], "drop --env"),
        (["bc", "--dataset", "cartpole-expert", "--env-steps", "10"], "unknown bc option(s): env_steps"),
        (["sac", "--dataset", "pendulum-mixed"], "--dataset is for offline algorithms"),
        (
            ["bc", "--dataset", "cartpole-expert", "--set", "continuous_loss=l1"],
            "setting continuous_loss='l1': expected 'mse' or 'gaussian'",
        ),
    ]:
        result = cli("train", *args, "--store", offline_store, "--out", tmp_path / "bad", "--no-progress")
        assert result.code == 2 and message in result.err, (args, result.err)
        assert len(result.err.strip().splitlines()) == 1
    assert not (tmp_path / "bad").exists()
