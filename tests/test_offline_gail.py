"""GAIL: the discriminator's input and reward convention, a learning test and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlpipe.algos import gail, get_algo
from rlpipe.errors import RlpipeError
from rlpipe.nets.checkpoint import load_checkpoint
from rlpipe.training import Batch
from rlpipe.training.optim import adam


def test_discriminator_input_encoding() -> None:
    obs = torch.tensor([[0.1, 0.2], [0.3, 0.4]])
    discrete = gail.Discriminator(obs_dim=2, act_dim=3, discrete=True)
    torch.testing.assert_close(
        discrete.encode(obs, torch.tensor([2, 0])), torch.tensor([[0.1, 0.2, 0.0, 0.0, 1.0], [0.3, 0.4, 1.0, 0.0, 0.0]])
    )
    continuous = gail.Discriminator(obs_dim=2, act_dim=1, discrete=False)
    # PPO's Gaussian samples are unbounded; D sees what the env receives, clipped to [-1, 1].
    torch.testing.assert_close(continuous.encode(obs, torch.tensor([[1.7], [-0.5]])), torch.tensor([[0.1, 0.2, 1.0], [0.3, 0.4, -0.5]]))
    assert discrete(obs, torch.tensor([2, 0])).shape == (2,)


def test_expert_like_pairs_get_higher_reward() -> None:
    """After training D on expert vs policy pairs, -log D is higher on the expert's pairs."""
    torch.manual_seed(0)
    disc = gail.Discriminator(obs_dim=2, act_dim=2, discrete=True, hidden=(32,))
    optimizer = adam(disc.parameters(), 1e-2)
    obs = torch.randn(256, 2)
    expert_actions = (obs[:, 0] > 0).long()  # the expert pushes towards the sign of x
    policy_actions = 1 - expert_actions  # the policy does the opposite
    expert = Batch(obs, expert_actions, torch.zeros(256), obs, torch.zeros(256))
    for _ in range(200):
        loss = gail.discriminator_update(disc, optimizer, obs, policy_actions, expert)
    assert loss < 0.3
    with torch.no_grad():
        expert_reward = gail.imitation_reward(disc(obs, expert_actions))
        policy_reward = gail.imitation_reward(disc(obs, policy_actions))
    assert torch.all(expert_reward > 0) and torch.all(policy_reward > 0)  # -log D > 0
    assert expert_reward.mean() > 1.0 and policy_reward.mean() < 0.3, (expert_reward.mean(), policy_reward.mean())


@pytest.mark.slow
def test_gail_learns_cartpole_from_30_expert_pairs(offline_store: Path, learning_seed: int, record_property) -> None:
    """A smoke and regression test of GAIL's loop (D trained on every rollout, PPO on its
    reward), not evidence of imitation: -log D is always positive and CartPole ends only on
    failure, so a constant reward learns it as well (PPO with reward 1 and these settings:
    500.0, 500.0, 407.5 for seeds 0-2). Imitation that survival cannot explain is
    shown by DAC on Pendulum (tests/test_offline_dac.py)."""
    config = get_algo("gail").make_config(
        "CartPole-v1",
        dataset="cartpole-expert",
        store=str(offline_store),
        max_samples=30,
        env_steps=30_000,
        eval_every=30_000,
        seed=learning_seed,
    )
    result = get_algo("gail").train(config, progress=False)
    m = result.metrics
    record_property("eval_return_mean", m["eval_return_mean"])
    assert m["dataset_transitions"] == 30 and m["discriminator_updates"] > 0
    assert m["train_episodes"] <= 500  # the bar: within 500 episodes of interaction
    assert m["eval_return_mean"] >= 400, m  # seeds 0-4: 500.0 x 4, 453.1; a random policy scores ~22


def test_gail_cli_continuous_and_bad_input(offline_store: Path, tmp_path: Path, cli) -> None:
    out = tmp_path / "gail"
    ok = cli(
        "train",
        "gail",
        "--dataset",
        "pendulum-mixed",
        "--store",
        offline_store,
        "--env-steps",
        "500",
        "--num-envs",
        "2",
        "--max-samples",
        "100",
        "--set",
        "num_steps=128",
        "--set",
        "eval_episodes=1",
        "--out",
        out,
        "--no-progress",
    )
    assert ok.code == 0, ok.err
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["algo"] == "gail" and metrics["env_steps"] >= 500 and metrics["gradient_updates"] > 0
    # one discriminator update per rollout: two rollouts of 2 envs x 128 steps reach 500 steps
    assert metrics["discriminator_updates"] == 2 and metrics["dataset_transitions"] == 100
    saved = load_checkpoint(out).state_dict("discriminator")  # to resume or inspect the reward
    assert saved and all(torch.isfinite(v).all() for v in saved.values())
    evaluated = cli("eval", out, "--episodes", "1", "--json")
    assert evaluated.code == 0 and json.loads(evaluated.out)["env_id"] == "Pendulum-v1"
    bad = cli("train", "gail", "--dataset", "cartpole-expert", "--store", offline_store, "--updates", "10", "--no-progress")
    assert bad.code == 2 and "unknown gail option(s): updates" in bad.err
    with pytest.raises(RlpipeError, match="collected in 'CartPole-v1', not 'Pendulum-v1'"):
        gail.train(get_algo("gail").make_config("Pendulum-v1", dataset="cartpole-expert", store=str(offline_store)), progress=False)
    with pytest.raises(RlpipeError, match="setting disc_updates=0: expected a positive number"):
        get_algo("gail").make_config("CartPole-v1", disc_updates=0)
