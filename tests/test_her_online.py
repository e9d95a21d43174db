"""Online HER (ddpg-her, td3-her, sac-her), goal-observation flattening, the success-rate
metric, and offline training on a relabelled vs the raw goal dataset."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlpipe.algos import get_algo, load_policy
from rlpipe.algos.her import HerReplayBuffer
from rlpipe.datasets.her import goal_functions, relabel_dataset
from rlpipe.datasets.store import open_dataset
from rlpipe.envs.goals import flat_observation_space, flatten_obs
from rlpipe.nets.networks import DeterministicActor
from rlpipe.training import ActionScaler, StepBatch, evaluate, policy_fn
from rlpipe.training.offline import load_offline
from tests.test_collector import collect_dataset

MISSING = -7.0  # the stored desired goal: far from every achieved goal below


def synthetic_step(episodes: list[int], steps: list[int], done: list[bool], valid: list[bool]) -> StepBatch:
    """One vector step (one entry per env) whose transition (episode e, step t) has next
    achieved goal (e, t): goals of different transitions are >= 1 apart, far beyond the
    0.15 success radius."""
    e, t = np.array(episodes, np.float32), np.array(steps, np.float32)
    goal = np.full((len(e), 2), MISSING, np.float32)
    obs = {"observation": np.stack([e, t], 1), "achieved_goal": np.stack([e, t - 1], 1), "desired_goal": goal}
    next_obs = {"observation": np.stack([e, t], 1), "achieved_goal": np.stack([e, t], 1), "desired_goal": goal}
    actions = np.stack([e, t], 1) / 100
    rewards = np.full(len(e), -1.0, np.float32)
    return StepBatch(
        obs,
        actions,
        actions,
        rewards,
        next_obs,
        np.zeros(len(e), bool),
        np.array(done),
        np.array(valid),
        (t + 1) * rewards,
        t.astype(np.int64) + 1,
    )


def filled_buffer(strategy: str = "future", k: int = 4, capacity: int = 1000) -> HerReplayBuffer:
    """Two envs, interleaved: env 0 runs episodes 0 (3 steps) and 2 (2 steps); env 1 runs
    episode 1 (5 steps) and an open episode 3. A reset step (valid False) sits in between."""
    space = gym.make("GoalWorld-v0").observation_space
    buffer = HerReplayBuffer(capacity, space, 2, 2, *goal_functions("GoalWorld-v0"), strategy=strategy, k=k, rng=np.random.default_rng(0))
    script = [  # (episode of env 0, step, done, valid), (episode of env 1, step, done, valid)
        ((0, 0, False, True), (1, 0, False, True)),
        ((0, 1, False, True), (1, 1, False, True)),
        ((0, 2, True, True), (1, 2, False, True)),
        ((0, 2, False, False), (1, 3, False, True)),  # env 0's autoreset step
        ((2, 0, False, True), (1, 4, True, True)),
        ((2, 1, True, True), (1, 4, False, False)),
        ((2, 1, False, False), (3, 0, False, True)),
    ]
    for row in script:
        episodes, steps, done, valid = zip(*row)
        buffer.store(synthetic_step(list(episodes), list(steps), list(done), list(valid)))
    return buffer


def test_her_buffer_stores_completed_episodes_contiguously() -> None:
    buffer = filled_buffer()
    assert len(buffer) == 3 + 5 + 2  # episode 3 is still open: not sampled
    observation = buffer.data["observation"][: len(buffer)]
    np.testing.assert_array_equal(observation[:, 0], [0, 0, 0, 1, 1, 1, 1, 1, 2, 2])  # in order of completion
    np.testing.assert_array_equal(observation[:, 1], [0, 1, 2, 0, 1, 2, 3, 4, 0, 1])
    np.testing.assert_array_equal(buffer.episode_start[:10], [0] * 3 + [3] * 5 + [8] * 2)
    np.testing.assert_array_equal(buffer.episode_end[:10], [2] * 3 + [7] * 5 + [9] * 2)


@pytest.mark.parametrize("strategy", ["future", "final", "episode"])
def test_sample_time_relabelling(strategy: str) -> None:
    buffer = filled_buffer(strategy)
    batch = buffer.sample(20_000)
    obs, next_obs = batch.obs.numpy(), batch.next_obs.numpy()
    episode, step, goal = obs[:, 0], obs[:, 1], obs[:, 2:]
    np.testing.assert_array_equal(next_obs[:, 2:], goal)  # one goal per transition
    np.testing.assert_array_equal(batch.actions.numpy(), obs[:, :2] / 100)  # actions stay with their rows
    relabelled = goal[:, 0] != MISSING
    assert abs(relabelled.mean() - 0.8) < 0.02  # k = 4: 80% relabelled
    # Goals are achieved goals (e, t') of the same episode; where the strategy says, t' >= t.
    np.testing.assert_array_equal(goal[relabelled, 0], episode[relabelled])
    last_step = np.array([2, 4, 1])[episode.astype(int)]
    if strategy == "future":
        assert np.all((goal[relabelled, 1] >= step[relabelled]) & (goal[relabelled, 1] <= last_step[relabelled]))
        assert (goal[relabelled, 1] > step[relabelled]).any()
    elif strategy == "final":
        np.testing.assert_array_equal(goal[relabelled, 1], last_step[relabelled])
    else:
        assert (goal[relabelled, 1] < step[relabelled]).any()
    # Rewards and terminations recomputed: success only where the goal is this step's own.
    reached = relabelled & (goal[:, 1] == step)
    np.testing.assert_array_equal(batch.rewards.numpy(), np.where(reached, 0.0, -1.0))
    np.testing.assert_array_equal(batch.terminated.numpy(), reached.astype(np.float32))
    assert reached.any() and (relabelled & ~reached).any()


def test_no_relabelling_without_her_and_old_episodes_dropped_whole() -> None:
    batch = filled_buffer(k=0).sample(2000)
    np.testing.assert_array_equal(batch.obs.numpy()[:, 2:], MISSING)
    assert np.all(batch.rewards.numpy() == -1.0)
    small = filled_buffer(capacity=9)  # 3 + 5 + 2 rows: episode 0 is dropped when episode 2 arrives
    assert len(small) == 7
    np.testing.assert_array_equal(small.data["observation"][:7, 0], [1] * 5 + [2] * 2)
    np.testing.assert_array_equal(small.episode_start[:7], [0] * 5 + [5] * 2)
    np.testing.assert_array_equal(small.episode_end[:7], [4] * 5 + [6] * 2)


def test_goal_observations_are_flattened_for_the_networks() -> None:
    space = gym.make("GoalWorld-v0").observation_space
    obs = {"observation": np.array([[1, 2]]), "achieved_goal": np.array([[9, 9]]), "desired_goal": np.array([[3, 4]])}
    np.testing.assert_array_equal(flatten_obs(obs), [[1, 2, 3, 4]])
    np.testing.assert_array_equal(flatten_obs(np.ones((2, 3))), np.ones((2, 3)))  # flat obs pass through
    flat = flat_observation_space(space)
    assert flat.shape == (4,) and np.all(flat.low == 0) and np.all(flat.high == 5)
    actor = DeterministicActor(4, 2, (8,))
    act = policy_fn(actor, ActionScaler(gym.make("GoalWorld-v0").action_space))  # actions already in [-1, 1]
    np.testing.assert_allclose(act(obs), actor(torch.tensor([[1.0, 2.0, 3.0, 4.0]])).detach().numpy(), rtol=1e-6)


def test_success_rate_is_measured_in_goal_envs_only() -> None:
    go_to_goal = lambda obs: np.clip(obs["desired_goal"] - obs["observation"], -1, 1)  # noqa: E731
    reached = evaluate(go_to_goal, "GoalWorld-v0", episodes=20, seed=0)
    assert reached.success_rate == 1.0 and all(length <= 6 for length in reached.lengths)
    assert reached.mean == pytest.approx(1 - np.mean(reached.lengths))  # -1 per step, 0 on the last
    stay = evaluate(lambda obs: np.zeros((len(obs["observation"]), 2)), "GoalWorld-v0", episodes=5, seed=0)
    assert stay.success_rate == 0.0 and stay.mean == -50
    assert evaluate(lambda obs: np.zeros(len(obs), np.int64), "CartPole-v1", episodes=2).success_rate is None


def test_cli_trains_and_evaluates_a_her_run(tmp_path: Path, cli) -> None:
    out = tmp_path / "td3-her"
    ok = cli(
        "train",
        "td3-her",
        "--env",
        "GoalWorld-v0",
        "--env-steps",
        "300",
        "--set",
        "learning_starts=200",
        "--set",
        "eval_episodes=4",
        "--set",
        "strategy=final",
        "--out",
        out,
        "--no-progress",
    )
    assert ok.code == 0, ok.err
    assert "success rate" in ok.out
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["algo"] == "td3-her" and metrics["gradient_updates"] > 0 and 0.0 <= metrics["eval_success_rate"] <= 1.0
    assert (out / "dvclive" / "plots" / "metrics" / "eval" / "success_rate.tsv").exists()
    policy = load_policy(out)
    assert policy.algo == "td3-her" and policy.config["strategy"] == "final" and policy.actor.spec["obs_dim"] == 4
    evaluated = cli("eval", out, "--episodes", "3", "--json")
    assert evaluated.code == 0 and 0.0 <= json.loads(evaluated.out)["success_rate"] <= 1.0
    for args, message in [
        (["ddpg-her", "--env", "Pendulum-v1"], "ddpg-her needs a goal-conditioned Dict"),
        (["sac", "--env", "GoalWorld-v0"], "sac needs a flat Box observation space"),
        (["sac-her", "--env", "GoalWorld-v0", "--set", "strategy=past"], "unknown HER strategy 'past'"),
        (["ddpg-her", "--env", "GoalWorld-v0", "--set", "k=0"], "k must be at least 1"),
        (["ddpg-her", "--env", "GoalWorld-v0", "--set", "alpha_lr=1e-3"], "unknown setting 'alpha_lr'"),
    ]:
        result = cli("train", *args, "--out", tmp_path / "bad", "--no-progress")
        assert result.code == 2 and message in result.err, (args, result.err)
        assert len(result.err.strip().splitlines()) == 1
    assert not (tmp_path / "bad").exists()


def test_each_name_gets_its_base_algorithm() -> None:
    for name, own, foreign in [
        ("ddpg-her", "noise_sigma", "policy_delay"),
        ("td3-her", "policy_delay", "alpha_lr"),
        ("sac-her", "alpha_lr", "noise_sigma"),
    ]:
        config = get_algo(name).make_config("GoalWorld-v0")
        assert type(config).base == name.removesuffix("-her") and config.her and config.k == 4
        assert hasattr(config, own) and not hasattr(config, foreign)


@pytest.mark.slow
def test_ddpg_her_learns_goalworld_and_plain_replay_does_not(learning_seed: int, record_property) -> None:
    """The reference text: DDPG+HER about -4, without HER -50. 1000 random steps (20
    episodes), then one update per step until a 100-episode evaluation (every 250 steps)
    reaches -10, which needs >= 80% successes (a failure scores -50); the cap is 2000 steps."""
    module = get_algo("ddpg-her")
    results = {}
    for her in (True, False):
        config = module.make_config(
            "GoalWorld-v0", env_steps=2000, eval_every=250, stop_at_return=-10.0, heldout_eval_episodes=0, seed=learning_seed, her=her
        )
        results[her] = module.train(config, progress=False)
        reached = results[her].first_reaching(-10.0)
        record_property(
            f"her={her}",
            (
                None if reached is None else reached.done,
                results[her].metrics["eval_success_rate"],
                results[her].metrics["eval_return_mean"],
            ),
        )
    # Reached at (env steps, seeds 0-4): 1500, 1250, 1250, 1500, 1500 (5-9: by 1500), success 1.0 each.
    reached = results[True].first_reaching(-10.0)
    assert reached is not None and reached.success_rate >= 0.8, results[True].history
    # At the cap without HER, seeds 0-4: success 0.0, return -50.0 each (5-9: at most 0.1, -45.3);
    # seeds 0-4's first successes come later, at 2250-3000 steps (seeds 2 and 4: none by 4000).
    plain = results[False].metrics
    assert plain["eval_success_rate"] <= 0.2 and plain["eval_return_mean"] <= -40, plain


@pytest.mark.slow
def test_offline_training_on_the_relabelled_dataset_beats_the_raw_one(store: Path, learning_seed: int, record_property) -> None:
    collect_dataset(store, "GoalWorld-v0", "goalworld-random", fmt="arrow", episodes=300, num_envs=16)
    relabel_dataset(open_dataset("goalworld-random", store), "goalworld-random-her", strategy="future", k=4, seed=0, store=store)
    module = get_algo("td3bc")
    results = {}
    for name in ("goalworld-random", "goalworld-random-her"):  # until -10 over 50 episodes (>= 80% successes), cap 5000 updates
        config = module.make_config(
            "GoalWorld-v0",
            dataset=name,
            store=str(store),
            updates=5000,
            eval_every=500,
            eval_episodes=50,
            stop_at_return=-10.0,
            heldout_eval_episodes=0,
            hidden=(64, 64),
            actor_lr=1e-3,
            critic_lr=1e-3,
            seed=learning_seed,
        )
        data = load_offline("td3bc", config, module.action_kinds)
        assert data.obs_dim == 4 and data.arrays.obs.shape == (len(data.arrays), 4)  # flattened goal observations
        results[name] = module.train(config, progress=False)
        reached = results[name].first_reaching(-10.0)
        record_property(name, (None if reached is None else reached.done, results[name].metrics["eval_success_rate"]))
    # Reached at (updates, seeds 0-4): 2000, 2000, 2500, 2000, 2500, success 1.0 each.
    reached = results["goalworld-random-her"].first_reaching(-10.0)
    assert reached is not None and reached.success_rate >= 0.8, results["goalworld-random-her"].history
    # The raw dataset at the cap, seeds 0-4: success 0.02, 0.02, 0.0, 0.0, 0.0 (at most 0.02 up to 6000).
    assert results["goalworld-random"].metrics["eval_success_rate"] <= 0.2, results["goalworld-random"].history
