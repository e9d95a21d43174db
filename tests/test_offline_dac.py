"""DAC: the discriminator's gradient penalty and reward sign, imitation of a Pendulum expert
against a constant-reward control, and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from rlpipe.algos import gail, get_algo
from rlpipe.errors import RlpipeError
from rlpipe.nets.checkpoint import load_checkpoint
from rlpipe.training import ActionScaler, Batch, evaluate, policy_fn
from rlpipe.training.env import env_spaces


def test_gradient_penalty_adds_the_squared_excess_slope() -> None:
    """A linear D with slope 2 everywhere: the penalty term is weight * (2 - 1)^2."""
    disc = gail.Discriminator(obs_dim=2, act_dim=1, discrete=False)
    disc.net = nn.Linear(3, 1)
    with torch.no_grad():
        disc.net.weight.copy_(torch.tensor([[2.0, 0.0, 0.0]]))
    frozen_optimizer = torch.optim.SGD(disc.parameters(), lr=0.0)  # the loss is read, D stays as it is
    obs, actions = torch.randn(64, 2), torch.rand(64, 1) * 2 - 1
    expert = Batch(torch.randn(64, 2), torch.rand(64, 1) * 2 - 1, torch.zeros(64), obs, torch.zeros(64))
    plain = gail.discriminator_update(disc, frozen_optimizer, obs, actions, expert)
    penalised = gail.discriminator_update(disc, frozen_optimizer, obs, actions, expert, grad_penalty=10.0)
    assert penalised - plain == pytest.approx(10.0, rel=1e-5)


def test_reward_is_negative_where_d_spots_the_policy() -> None:
    """DAC's reward -logit D = log D_expert - log D_policy: positive on expert-like pairs,
    negative on pairs D attributes to the policy (GAIL's -log D is positive on both)."""
    torch.manual_seed(0)
    disc = gail.Discriminator(obs_dim=1, act_dim=1, discrete=False, hidden=(32,))
    optimizer = torch.optim.Adam(disc.parameters(), lr=1e-2)
    obs = torch.randn(256, 1)
    expert_actions, policy_actions = torch.full((256, 1), 0.8), torch.full((256, 1), -0.8)
    expert = Batch(obs, expert_actions, torch.zeros(256), obs, torch.zeros(256))
    for _ in range(300):
        gail.discriminator_update(disc, optimizer, obs, policy_actions, expert, grad_penalty=10.0)
    with torch.no_grad():
        expert_reward, policy_reward = -disc(obs, expert_actions), -disc(obs, policy_actions)
    assert expert_reward.min() > 0 and policy_reward.max() < 0
    # The penalty keeps D's slope near 1: the pairs are 1.6 apart, so the rewards stay within about ±0.8.
    assert expert_reward.max() < 1.2 and policy_reward.min() > -1.2, (expert_reward, policy_reward)


@pytest.mark.slow
def test_dac_imitates_the_pendulum_expert_and_a_constant_reward_does_not(offline_store: Path, learning_seed: int, record_property) -> None:
    """Pendulum never terminates, so survival earns nothing: only imitation can learn it.
    DAC trains until its 10-episode eval reaches -200 (at most 8k env steps), is then
    scored on 20 fresh episodes; the same SAC learner with reward 1 everywhere (D
    untrained) gets as many env steps and is the control."""
    store = str(offline_store)
    config = get_algo("dac").make_config(
        "Pendulum-v1", dataset="pendulum-expert", store=store, env_steps=8_000, eval_every=1_000, stop_at_return=-200.0, seed=learning_seed
    )
    learned = get_algo("dac").train(config, progress=False)
    steps = learned.metrics["env_steps"]
    scaler = ActionScaler(env_spaces("Pendulum-v1")[1])
    fresh = evaluate(policy_fn(learned.policy, scaler), "Pendulum-v1", 20, seed=learning_seed + 50_000).mean
    control = get_algo("dac").make_config(
        "Pendulum-v1", dataset="pendulum-expert", store=store, env_steps=steps, eval_every=steps, constant_reward=1.0, seed=learning_seed
    )
    constant = get_algo("dac").train(control, progress=False).metrics
    record_property("env_steps", steps)
    record_property("dac_return", fresh)
    record_property("dac_heldout_return_100_episodes", learned.metrics["heldout_return_mean"])
    record_property("constant_reward_return", constant["eval_return_mean"])
    assert constant["discriminator_updates"] == 0  # the control never trains D
    # Measured (env steps, DAC on 20 fresh episodes, control), seeds 0-4: 4000, -527.7, -1291.8;
    # 5000, -478.2, -1288.8; 8000 (cap), -369.5, -1575.6; 8000 (cap), -912.1, -1577.8; 7000,
    # -396.9, -1654.4 (seeds 0-3 reproduced to the digit; seed 4, whose earlier sweep
    # run errored without a trace, passes with no NaN or divergence). The runs' 100-episode
    # held-out returns, seeds 0-3: -516.3, -520.9, -444.3, -707.6.
    # At this budget DAC is early in its swing-up; trained on (15k env steps) seeds 0-2 score
    # -149.1, -154.4, -143.6 over 100 episodes. Zero torque and random actions: -1072 to -1224.
    assert constant["eval_return_mean"] <= -1150, constant
    assert fresh - constant["eval_return_mean"] >= 400, (steps, fresh, constant)  # gaps 666 to 1258


def test_dac_cli_and_bad_input(offline_store: Path, tmp_path: Path, cli) -> None:
    out = tmp_path / "dac"
    ok = cli(
        "train",
        "dac",
        "--dataset",
        "pendulum-expert",
        "--store",
        offline_store,
        "--env-steps",
        "300",
        "--max-samples",
        "100",
        "--set",
        "learning_starts=200",
        "--set",
        "eval_episodes=1",
        "--out",
        out,
        "--no-progress",
    )
    assert ok.code == 0, ok.err
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["algo"] == "dac" and metrics["env_steps"] == 300 and metrics["dataset_transitions"] == 100
    assert metrics["discriminator_updates"] == metrics["gradient_updates"] == 100  # one D step per SAC update
    saved = load_checkpoint(out).state_dict("discriminator")
    assert saved and all(torch.isfinite(v).all() for v in saved.values())
    evaluated = cli("eval", out, "--episodes", "1", "--json")
    assert evaluated.code == 0 and json.loads(evaluated.out)["env_id"] == "Pendulum-v1"
    discrete = cli("train", "dac", "--dataset", "cartpole-expert", "--store", offline_store, "--no-progress")
    assert discrete.code == 2 and "dac" in discrete.err and "Discrete" in discrete.err, discrete.err
    with pytest.raises(RlpipeError, match="collected in 'Pendulum-v1', not 'MountainCarContinuous-v0'"):
        get_algo("dac").train(
            get_algo("dac").make_config("MountainCarContinuous-v0", dataset="pendulum-expert", store=str(offline_store)), progress=False
        )
    with pytest.raises(RlpipeError, match="grad_penalty=-1.0: expected a number >= 0"):
        get_algo("dac").make_config("Pendulum-v1", grad_penalty=-1.0)
