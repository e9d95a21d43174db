"""AWAC: the actor's advantage weights by hand, its settings' checks, learning on
`pendulum-mixed` against the control without the weighting (plain likelihood behaviour
cloning), and a fine-tuned run through the CLI (the beats-BC margin is in
test_offline_rl_beats_bc.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from rlpipe.algos import get_algo
from rlpipe.algos.awac import awac_weights
from rlpipe.errors import RlpipeError
from rlpipe.training import Batch


class LinearTwinQ:
    """Twin critics Q_i(s, a) = c_i * a (one action dimension): known advantages."""

    def __call__(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return torch.stack([1.0 * actions[:, 0], 2.0 * actions[:, 0]])


class ZeroActor:
    """An actor whose sampled action is always 0, so min Q(s, a_pi) = 0."""

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros(obs.shape[0], 1), torch.zeros(obs.shape[0])


def batch(actions: list[float]) -> Batch:
    n = len(actions)
    zeros = torch.zeros(n)
    return Batch(torch.zeros(n, 1), torch.tensor(actions)[:, None], zeros, torch.zeros(n, 1), zeros)


def test_actor_weights_by_hand() -> None:
    # A = min_i c_i a - 0: a = 1 -> 1, a = -1 -> -2, a = 0 -> 0, a = 3 -> 3.
    weights = awac_weights(LinearTwinQ(), ZeroActor(), batch([1.0, -1.0, 0.0, 3.0]), awac_lambda=0.5, exp_adv_max=100.0)
    # exp(A / lambda): e^2, e^-4, 1, and e^6 = 403 clipped at 100.
    torch.testing.assert_close(weights, torch.tensor([math.exp(2.0), math.exp(-4.0), 1.0, 100.0]))
    assert not weights.requires_grad
    # A very large lambda weighs every row 1: likelihood behaviour cloning (the control below).
    torch.testing.assert_close(awac_weights(LinearTwinQ(), ZeroActor(), batch([1.0, -1.0]), 1e6, 100.0), torch.ones(2), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["awac_lambda", "exp_adv_max"])
@pytest.mark.parametrize("value", [0.0, -1.0])
def test_non_positive_weight_settings_are_refused_in_one_line(name: str, value: float) -> None:
    with pytest.raises(RlpipeError) as info:
        get_algo("awac").make_config("Pendulum-v1", **{name: value})
    assert str(info.value) == f"setting {name}={value!r}: expected a positive number"


def test_the_normal_actor_trains_and_reloads(offline_store: Path, tmp_path: Path) -> None:
    """``actor=normal`` (CORL's Gaussian, shared with IQL) is the saved policy, and reloads as it."""
    from rlpipe.algos import load_policy
    from rlpipe.algos.iql import NormalActor

    awac = get_algo("awac")
    config = awac.make_config(
        "Pendulum-v1", dataset="pendulum-mixed", store=str(offline_store), updates=20, eval_every=20, eval_episodes=1,
        heldout_eval_episodes=0, actor="normal",
    )  # fmt: skip
    result = awac.train(config, tmp_path / "awac", progress=False)
    loaded = load_policy(tmp_path / "awac")
    assert isinstance(result.policy, NormalActor) and isinstance(loaded.actor, NormalActor)
    probe = torch.zeros(3, 3)
    torch.testing.assert_close(loaded.actor.act(probe), result.policy.act(probe))


@pytest.mark.heavy  # two runs of 25-45 CPU-seconds each
def test_advantage_weights_lift_the_policy_far_above_likelihood_cloning(offline_store: Path, learning_seed: int, record_property) -> None:
    """On `pendulum-mixed` AWAC at its Pendulum defaults learns; the control, the same with
    every weight 1 (awac_lambda 1e6: likelihood behaviour cloning of the data's actions, the
    critics trained but unused), copies the data's mixed behaviour and stays below."""
    awac = get_algo("awac")
    returns = {}
    for name, settings in [("awac", {}), ("unweighted", dict(awac_lambda=1e6))]:
        config = awac.make_config("Pendulum-v1", dataset="pendulum-mixed", store=str(offline_store), seed=learning_seed, **settings)
        returns[name] = awac.train(config, progress=False).metrics["eval_return_mean"]
        record_property(name, returns[name])
    # Seeds 0-4: AWAC -158, -221, -197, -236, -182; unweighted -286.3, -348.0, -389.8, -536.1,
    # -377.5 (gaps 127 to 300). Likelihood cloning scores well above MSE BC's -524 to -781 here.
    assert returns["awac"] >= -300.0 and returns["awac"] >= returns["unweighted"] + 100.0, returns


def test_a_finetuned_run_through_the_cli_records_both_phases(tmp_path: Path, cli) -> None:
    store = tmp_path / "datasets"
    assert cli("collect", "--env", "Pendulum-v1", "--episodes", "2", "--num-envs", "2", "--store", store, "--quiet").code == 0
    run = tmp_path / "awac"
    settings = ("finetune_eval_every=100", "eval_every=100", "eval_episodes=1", "heldout_eval_episodes=1", "hidden=[32,32]")
    result = cli(
        "train", "awac", "--dataset", "pendulum-random", "--store", store, "--updates", "100", "--finetune-env-steps", "200",
        *(arg for setting in settings for arg in ("--set", setting)), "--out", run, "--no-progress", "--device", "cpu",
    )  # fmt: skip
    assert result.code == 0, result.err
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["offline_updates"] == 100 and metrics["finetune_env_steps"] == 200 and metrics["gradient_updates"] == 300
    assert {"offline_eval_return_mean", "offline_heldout_return_mean", "heldout_return_mean"} <= set(metrics)
