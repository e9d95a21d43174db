"""Multi-agent learning tests at small budgets, each beside a control that must fail.

The full bars (issue 12: IPPO wins >= 0.80 on Combat, MADDPG's adversary >= -12 and good
agents >= 4 on simple_adversary after 5000 episodes) take minutes to tens of minutes; these
budgets (~12-23 s of CPU per run) still need real learning.
"""

from __future__ import annotations

import pytest

from rlpipe.algos import get_algo


def _ippo(seed: int, learn: bool = True) -> dict:
    ippo = get_algo("ippo")
    config = ippo.make_config("Combat-v0", seed=seed, env_steps=100_000, num_envs=32, num_steps=64,
                              eval_every=100_000, eval_episodes=100)
    if not learn:  # the control: set on the built config, whose checks refuse a zero rate
        config.learning_rate = 0.0
    return ippo.train(config, progress=False).metrics


@pytest.mark.slow
def test_ippo_team_learns_to_trade_hits_with_the_bots(learning_seed: int, record_property) -> None:
    # Team return (ma-gym's: hits dealt - hits taken; the win bonus only shapes training), 100
    # episodes after 100k game steps. Seeds 0-4: -0.09, -0.15, -0.14, -0.23, -0.09 (tuned:
    # carry_dead + team_reward + mask_attacks; -1.52, -1.26, -1.35, -1.59, -1.41 without the
    # mask); the untrained policy (learning_rate 0): -3.92, -4.01, -3.48, -3.92, -3.64.
    learnt, control = _ippo(learning_seed), _ippo(learning_seed, learn=False)
    record_property("team_return", learnt["eval_team_return_mean"])
    record_property("control_team_return", control["eval_team_return_mean"])
    assert learnt["eval_team_return_mean"] >= -1.0
    assert control["eval_team_return_mean"] < -1.0


def _maddpg(seed: int, learn: bool = True) -> dict:
    maddpg = get_algo("maddpg")
    config = maddpg.make_config("simple_adversary_v3", seed=seed, env_steps=12_000, learning_starts=1000, update_every=25,
                                eval_every=12_000, eval_episodes=50)
    if not learn:  # the control: set on the built config, whose checks refuse a zero rate
        config.actor_lr = config.critic_lr = 0.0
    return maddpg.train(config, progress=False).metrics


@pytest.mark.slow
def test_maddpg_adversary_learns_to_shadow_the_good_agents(learning_seed: int, record_property) -> None:
    # Adversary's mean return, 50 episodes after 12,000 env steps (440 updates), with the
    # tuned settings (velocity inputs, logits penalty 1e-4, twin critics, 2-step targets, policy
    # ensembles of 3); the good agents' return is too noisy at this budget. Seeds 0-4: -14.5,
    # -14.7, -16.1, -14.2, -14.6 (random play: -28.8; session 7's single policies: -18.2 to -23.5
    # under a bar of -27); the same seed without learning (both learning rates 0, its initial
    # actors drift one way): -37.1, -51.5, -44.7, -45.5, -38.5, so the bar is paired: at least 2.5
    # above the seed's own control (margins 22.7 to 36.8).
    learnt, control = _maddpg(learning_seed), _maddpg(learning_seed, learn=False)
    record_property("adversary_return", learnt["adversary_return_mean"])
    record_property("control_adversary_return", control["adversary_return_mean"])
    assert learnt["adversary_return_mean"] >= -20.0
    assert learnt["adversary_return_mean"] >= control["adversary_return_mean"] + 2.5
