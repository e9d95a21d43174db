"""GoalWorld-v0 and the HER relabelling transform."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from rlpipe.datasets.her import goal_rows, relabel_dataset
from rlpipe.datasets.loader import load_dataset
from rlpipe.datasets.store import open_dataset
from rlpipe.errors import RlpipeError
from tests.test_collector import assert_episodes_well_formed, collect_dataset


def test_goalworld_dynamics_and_goal_api() -> None:
    env = gym.make("GoalWorld-v0")
    obs, info = env.reset(seed=1)
    np.testing.assert_array_equal(obs["observation"], [0, 0])
    assert np.all((obs["desired_goal"] >= 3.5) & (obs["desired_goal"] <= 4.5)) and info["is_success"] is False
    obs, reward, terminated, truncated, info = env.step(np.array([2.0, -3.0]))  # clipped to [-1,1], then to the plane
    np.testing.assert_array_equal(obs["observation"], [1, 0])
    assert (reward, terminated, truncated) == (-1.0, False, False)
    # walk straight to the goal
    goal = obs["desired_goal"]
    for _ in range(10):
        obs, reward, terminated, truncated, info = env.step(np.clip(goal - obs["observation"], -1, 1))
        if terminated:
            break
    assert terminated and reward == 0.0 and info["is_success"]
    # batched compute_reward over leading axes
    achieved = np.array([[[0, 0], [4, 4]], [[4.1, 4.0], [4.2, 4.2]]], np.float32)
    desired = np.full_like(achieved, 4.0)
    np.testing.assert_array_equal(env.unwrapped.compute_reward(achieved, desired, None), [[-1, 0], [0, -1]])


def test_goalworld_time_limit_and_exact_seeding() -> None:
    env = gym.make("GoalWorld-v0")
    first, _ = env.reset(seed=7)
    steps = 0
    while True:
        steps += 1
        _, _, terminated, truncated, _ = env.step(np.zeros(2, np.float32))
        if terminated or truncated:
            break
    assert (steps, truncated, terminated) == (50, True, False)
    again, _ = gym.make("GoalWorld-v0").reset(seed=7)
    np.testing.assert_array_equal(first["desired_goal"], again["desired_goal"])


def test_goal_rows_strategies() -> None:
    rng = np.random.default_rng(0)
    rows = np.repeat(np.arange(10, 20), 200)
    start, end = np.full_like(rows, 10), np.full_like(rows, 19)
    future = goal_rows("future", rows, start, end, rng, 100)
    assert np.all((future >= rows) & (future <= end))
    assert set(future[rows == 10]) == set(range(10, 20))  # every later step is reachable
    np.testing.assert_array_equal(goal_rows("final", rows, start, end, rng, 100), end)
    episode = goal_rows("episode", rows, start, end, rng, 100)
    assert set(episode) == set(range(10, 20))
    assert goal_rows("random", rows, start, end, rng, 100).max() > 19
    with pytest.raises(RlpipeError, match="unknown HER strategy"):
        goal_rows("past", rows, start, end, rng, 100)


@pytest.mark.parametrize("strategy", ["future", "final", "episode", "random"])
def test_relabel_dataset(store: Path, strategy: str) -> None:
    collect_dataset(store, "GoalWorld-v0", "goals", fmt="both", episodes=20, num_envs=4)
    source = load_dataset("goals", store)
    relabel_dataset(open_dataset("goals", store), "goals-her", strategy=strategy, k=3, seed=0, store=store)
    out = load_dataset("goals-her", store)
    k = 1 if strategy == "final" else 3
    assert len(out) == len(source) * (1 + k)
    # the originals come first, unchanged
    np.testing.assert_array_equal(out.reward[: len(source)], source.reward)
    new = slice(len(source), None)
    obs, next_obs = out.obs, out.next_obs
    # rewards and terminations recomputed from the new goal
    distance = np.linalg.norm(next_obs["achieved_goal"][new] - next_obs["desired_goal"][new], axis=-1)
    np.testing.assert_array_equal(out.reward[new], np.where(distance <= 0.15, 0.0, -1.0))
    np.testing.assert_array_equal(out.terminated[new], distance <= 0.15)
    np.testing.assert_array_equal(obs["desired_goal"][new], next_obs["desired_goal"][new])
    # positions and actions are copies of source transitions
    np.testing.assert_array_equal(np.sort(obs["observation"][new], axis=0), np.sort(np.tile(source.obs["observation"], (k, 1)), axis=0))
    if strategy in ("future", "final", "episode"):
        assert (out.reward[new] == 0).mean() > (source.reward == 0).mean()  # hindsight makes successes
    assert np.all(np.diff(out.episode_id) >= 0)
    meta = open_dataset("goals-her", store).metadata
    assert meta["provenance"]["strategy"] == strategy and meta["provenance"]["k"] == k
    assert meta["provenance"]["source_content_hash"] == open_dataset("goals", store).metadata["content_hash"]


def test_relabel_is_seeded(store: Path) -> None:
    collect_dataset(store, "GoalWorld-v0", "goals", fmt="arrow", episodes=10, num_envs=2)
    for name in ("a", "b"):
        relabel_dataset(open_dataset("goals", store), name, seed=3, store=store)
    assert open_dataset("a", store).metadata["content_hash"] == open_dataset("b", store).metadata["content_hash"]


@pytest.mark.parametrize("strategy", ["future", "final", "episode", "random"])
def test_relabelling_in_row_chunks_bounds_memory_and_writes_the_same_rows(
    store: Path, strategy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of at most `rows_per_chunk` rows (an episode longer than that: one copy of it)
    whatever k, and the same dataset as one chunk: memory no longer grows with k."""
    from rlpipe.datasets.writer import DatasetWriter

    collect_dataset(store, "GoalWorld-v0", "goals", fmt="arrow", episodes=6, num_envs=2)
    info = open_dataset("goals", store)
    longest = int(np.diff(np.r_[load_dataset("goals", store).episode_starts(), info.metadata["total_steps"]]).max())
    whole = relabel_dataset(info, "whole", strategy=strategy, k=40, seed=1, store=store)
    batches: list[int] = []
    write = DatasetWriter.write
    monkeypatch.setattr(DatasetWriter, "write", lambda self, rows: (batches.append(len(rows["reward"])), write(self, rows))[1])
    for rows_per_chunk in (7, 200):
        batches.clear()
        chunked = relabel_dataset(
            info, f"chunked-{rows_per_chunk}", strategy=strategy, k=40, seed=1, store=store, rows_per_chunk=rows_per_chunk
        )
        assert max(batches) <= max(rows_per_chunk, longest) and len(batches) > 2
        assert open_dataset(chunked.name, store).metadata["content_hash"] == open_dataset(whole.name, store).metadata["content_hash"]


def test_relabel_cli_and_bad_input(store: Path, cli) -> None:
    collect_dataset(store, "GoalWorld-v0", "goals", fmt="arrow", episodes=5, num_envs=1)
    collect_dataset(store, "CartPole-v1", "flat", fmt="arrow", episodes=2, num_envs=1)
    ok = cli("relabel", "her", "--dataset", "goals", "--strategy", "future", "--k", "4", "--name", "goals-her", "--store", store)
    assert ok.code == 0, ok.err
    for args, message in [
        (["--dataset", "flat"], "no goal-conditioned observations"),
        (["--dataset", "goals", "--strategy", "past"], "unknown HER strategy 'past'"),
        (["--dataset", "goals", "--k", "0"], "--k must be at least 1"),
        (["--dataset", "goals", "--k", "100000000"], "at most 4294967296 (2**32) are written, so k <= "),
        (["--dataset", "missing"], "dataset 'missing' not found"),
    ]:
        result = cli("relabel", "her", *args, "--name", "out", "--store", store)
        assert result.code == 2 and message in result.err, result.err
        assert not (store / "out").exists()


def test_vector_goalworld_matches_the_rules(store: Path) -> None:
    """The numpy-batched GoalWorld (used by make_vec) obeys the same rules as the single env."""
    envs = gym.make_vec("GoalWorld-v0", num_envs=4)
    assert type(envs.unwrapped).__name__ == "GoalWorldVectorEnv"
    envs.close()
    collect_dataset(store, "GoalWorld-v0", "goals", fmt="both", episodes=40, num_envs=4)
    data = load_dataset("goals", store)
    assert_episodes_well_formed(data)
    moved = np.clip(data.obs["observation"] + np.clip(data.action, -1, 1), 0, 5)
    np.testing.assert_allclose(data.next_obs["observation"], moved, atol=1e-6)
    np.testing.assert_array_equal(data.next_obs["achieved_goal"], data.next_obs["observation"])
    distance = np.linalg.norm(data.next_obs["achieved_goal"] - data.next_obs["desired_goal"], axis=-1)
    np.testing.assert_array_equal(data.reward, np.where(distance <= 0.15, 0.0, -1.0))
    np.testing.assert_array_equal(data.terminated, distance <= 0.15)
    np.testing.assert_array_equal(data.truncated, (data.step == 49) & ~data.terminated)
    starts = data.episode_starts()
    np.testing.assert_array_equal(data.obs["observation"][starts], 0.0)
    goals = data.obs["desired_goal"][starts]
    assert np.all((goals >= 3.5) & (goals <= 4.5)) and len(np.unique(goals[:, 0])) == len(starts)
