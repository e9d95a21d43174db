"""Multi-agent learning tests at small budgets, each beside a control that must fail.

The full bars (IPPO wins >= 0.80 on Combat, MADDPG's adversary >= -12 and good
agents >= 4 on simple_adversary after 5000 episodes) take minutes to tens of minutes; these
budgets (~12-23 s of CPU per run) still need real learning. The MADDPG tests share one module
fixture per seed: a MADDPG run, an independent-DDPG run and an untrained control.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlpipe.algos import get_algo
from rlpipe.commands.evaluate import evaluate_saved_run


def _ippo(seed: int, learn: bool = True) -> dict:
    ippo = get_algo("ippo")
    config = ippo.make_config("Combat-v0", seed=seed, env_steps=100_000, num_envs=32, num_steps=64, eval_every=100_000, eval_episodes=100)
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


# MADDPG's test budget: 12,000 env steps (440 updates) with the tuned settings (velocity inputs,
# logits penalty 1e-4, twin critics, 2-step targets, policy ensembles of 3).
MADDPG_BUDGET = dict(env_steps=12_000, learning_starts=1000, update_every=25, eval_every=12_000, eval_episodes=50, heldout_eval_episodes=0)
MADDPG_RUNS = {
    "maddpg": {},
    "ddpg": {"centralised": False},  # independent DDPG: each critic sees only its own agent
    "untrained": {"env_steps": 25, "eval_every": 25},  # no update (learning_starts 1000): the seed's initial actors
}


@pytest.fixture(scope="module")
def maddpg_runs(learning_seed: int, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The seed's MADDPG, independent-DDPG and untrained runs, shared by the MADDPG tests."""
    maddpg, root = get_algo("maddpg"), tmp_path_factory.mktemp(f"maddpg-seed{learning_seed}")
    for name, overrides in MADDPG_RUNS.items():
        config = maddpg.make_config("simple_adversary_v3", seed=learning_seed, **{**MADDPG_BUDGET, **overrides})
        maddpg.train(config, root / name, progress=False)
    return {name: root / name for name in MADDPG_RUNS}


def _play(runs: dict[str, Path], good: str, adversary: str, seed: int) -> dict:
    """Cross-play (``rlpipe eval GOOD --adversary-run ADV``): 100 episodes, starts disjoint from the runs' own evaluation."""
    return evaluate_saved_run(runs[good], 100, 20_000 + seed, adversary_run=runs[adversary]).report


@pytest.mark.slow
@pytest.mark.xdist_group("maddpg-runs")  # one worker trains the shared runs once
@pytest.mark.heavy  # the shared MADDPG runs take two CPU-minutes
def test_maddpg_adversary_learns_to_shadow_the_good_agents(maddpg_runs: dict[str, Path], record_property) -> None:
    # Adversary's mean return in the run's own 50-episode evaluation. Seeds 0-4: -14.5, -14.7,
    # -16.1, -14.2, -14.6 (random play: -28.8); the same seed without an update (its initial
    # actors drift one way): -37.1, -51.5, -44.7, -45.5, -38.5, so the bar is paired: at least 2.5
    # above the seed's own control (margins 22.7 to 36.8). Independent DDPG passes this one too
    # (seeds 0-4: -16.6, -16.7, -17.9, -16.2, -16.0); the centralised critic's effect is the
    # cross-play test below.
    learnt, control = (json.loads((maddpg_runs[name] / "metrics.json").read_text()) for name in ("maddpg", "untrained"))
    record_property("adversary_return", learnt["adversary_return_mean"])
    record_property("control_adversary_return", control["adversary_return_mean"])
    assert learnt["adversary_return_mean"] >= -20.0
    assert learnt["adversary_return_mean"] >= control["adversary_return_mean"] + 2.5


@pytest.mark.slow
@pytest.mark.xdist_group("maddpg-runs")  # one worker trains the shared runs once
@pytest.mark.heavy  # the shared MADDPG runs take two CPU-minutes
def test_maddpg_good_agents_learn_to_cover_the_goal_against_its_adversary(
    maddpg_runs: dict[str, Path], learning_seed: int, record_property
) -> None:
    # Good agents' mean return against MADDPG's adversary, 100 episodes. Seeds 0-4: +5.93, +5.73,
    # +5.85, +6.94, +6.27; the control, the seed's untrained good agents against the same
    # adversary: -9.29, -11.72, -9.34, -6.93, -18.86.
    learnt = _play(maddpg_runs, "maddpg", "maddpg", learning_seed)["good_return_mean"]
    control = _play(maddpg_runs, "untrained", "maddpg", learning_seed)["good_return_mean"]
    record_property("good_return", learnt)
    record_property("control_good_return", control)
    assert learnt >= 2.0
    assert control < 2.0


@pytest.mark.slow
@pytest.mark.xdist_group("maddpg-runs")  # one worker trains the shared runs once
@pytest.mark.heavy  # the shared MADDPG runs take two CPU-minutes
def test_maddpg_beats_independent_ddpg_in_cross_play(maddpg_runs: dict[str, Path], learning_seed: int, record_property) -> None:
    # The paper's cross-play against the control, independent DDPG (the same seed, budget and
    # settings with centralised=False), 100 episodes each way: MADDPG's good agents against DDPG's
    # adversary, and DDPG's good agents against MADDPG's adversary (good agents' mean return).
    # MADDPG's lead, the first minus the second, is the gain of its good agents over DDPG's (both
    # against DDPG's adversary) plus that of its adversary over DDPG's (both against DDPG's good
    # agents); each part alone misses on some seed (good agents' gain -0.29, -0.28, +0.75, +5.36,
    # +0.95; adversary's +1.71, +2.38, +2.06, -0.25, +1.85). Seeds 0-4: leads +1.42, +2.10, +2.81,
    # +5.11, +2.80 (+7.90 - 6.49, +7.71 - 5.61, +8.81 - 6.00, +7.36 - 2.25, +8.55 - 5.76).
    # The comparison is paired with the control on the other side of every episode: a team no
    # better than DDPG's leads by about 0.
    ahead = _play(maddpg_runs, "maddpg", "ddpg", learning_seed)["good_return_mean"]
    behind = _play(maddpg_runs, "ddpg", "maddpg", learning_seed)["good_return_mean"]
    record_property("maddpg_good_vs_ddpg_adversary", ahead)
    record_property("ddpg_good_vs_maddpg_adversary", behind)
    assert ahead - behind >= 1.0
