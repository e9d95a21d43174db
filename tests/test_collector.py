"""Collection from vector envs: episode boundaries, autoreset handling, determinism."""

from __future__ import annotations

import hashlib
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from rlpipe.datasets.collector import EpisodeAssembler, RandomPolicy, collect
from rlpipe.datasets.loader import load_dataset
from rlpipe.datasets.store import open_dataset
from rlpipe.datasets.writer import DatasetWriter


def collect_dataset(store: Path, env_id: str, name: str, fmt: str = "both", **kwargs) -> Path:
    envs = gym.make_vec(env_id, num_envs=1)
    obs_space, act_space = envs.single_observation_space, envs.single_action_space
    envs.close()
    with DatasetWriter(name, obs_space, act_space, env_id=env_id, store=store, fmt=fmt) as writer:
        seed = kwargs.pop("seed", 0)
        collect(env_id, lambda e: RandomPolicy(e.single_action_space, e.num_envs, seed), writer.write, seed=seed, show_progress=False, **kwargs)
        return writer.finalize({"algorithm": "random"})


def leaf_pairs(a, b) -> list[tuple[np.ndarray, np.ndarray]]:
    """Matching leaf arrays of two columns (Dict observations are dicts of arrays)."""
    return [(a[key], b[key]) for key in a] if isinstance(a, dict) else [(a, b)]


def assert_episodes_well_formed(data) -> None:
    starts = data.episode_starts()
    assert np.array_equal(data.episode_id[starts], np.arange(len(starts)))  # ids 0..E-1, contiguous
    ends = np.r_[starts[1:], len(data)] - 1
    for begin, end in zip(starts, ends):
        np.testing.assert_array_equal(data.step[begin : end + 1], np.arange(end - begin + 1))
        # within an episode the next observation is the following row's observation
        for next_obs, obs in leaf_pairs(data.next_obs, data.obs):
            np.testing.assert_array_equal(next_obs[begin:end], obs[begin + 1 : end + 1])
        assert not (data.terminated[begin:end] | data.truncated[begin:end]).any()
        assert data.terminated[end] or data.truncated[end]  # both may be true (docs/dataset-format.md)


@pytest.mark.parametrize("env_id,num_envs", [("CartPole-v1", 7), ("Pendulum-v1", 3)])
def test_episode_boundaries(store: Path, env_id: str, num_envs: int) -> None:
    collect_dataset(store, env_id, "data", episodes=12, num_envs=num_envs)
    data = load_dataset("data", store)
    assert data.episode_id.max() == 11
    assert_episodes_well_formed(data)
    if env_id == "Pendulum-v1":
        assert data.truncated.sum() == 12 and not data.terminated.any()  # 200-step time limit


def test_truncated_next_obs_is_the_real_final_observation(store: Path) -> None:
    """Replay the stored actions in a fresh single env: every obs, including the final one, matches."""
    collect_dataset(store, "Pendulum-v1", "data", episodes=2, num_envs=1, seed=3)
    data = load_dataset("data", store)
    env = gym.make("Pendulum-v1")
    obs, _ = env.reset(seed=3)
    for row in range(200):  # the first episode
        np.testing.assert_allclose(data.obs[row], obs, rtol=1e-6)
        obs, reward, terminated, truncated, _ = env.step(data.action[row])
        np.testing.assert_allclose(data.next_obs[row], obs, rtol=1e-6)
        assert data.reward[row] == pytest.approx(reward, rel=1e-5)
        assert (data.terminated[row], data.truncated[row]) == (terminated, truncated)
    assert data.truncated[199] and data.step[200] == 0


def test_steps_budget_keeps_whole_episodes(store: Path) -> None:
    collect_dataset(store, "CartPole-v1", "data", steps=1000, num_envs=8)
    data = load_dataset("data", store)
    assert len(data) >= 1000
    assert_episodes_well_formed(data)


def test_same_seed_gives_identical_bytes(tmp_path: Path) -> None:
    digests = []
    for run in ("a", "b"):
        path = collect_dataset(tmp_path / run, "CartPole-v1", "data", episodes=30, num_envs=4, seed=5)
        digests.append({p.relative_to(path).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.rglob("*")) if p.is_file()})
    assert digests[0] == digests[1]
    assert "data/main_data.hdf5" in digests[0] and "metadata.json" in digests[0]
    other = collect_dataset(tmp_path / "c", "CartPole-v1", "data", episodes=30, num_envs=4, seed=6)
    assert open_dataset("data", tmp_path / "c").metadata["content_hash"] != open_dataset("data", tmp_path / "a").metadata["content_hash"]
    assert other.exists()


def test_assembler_orders_interleaved_episodes_and_grows() -> None:
    """Two envs with different episode lengths and a tiny staging buffer."""
    out = []
    assembler = EpisodeAssembler(2, out.append, capacity=8)
    lengths = {0: [3, 5, 2], 1: [9, 1]}
    env_counters = {0: 0, 1: 0}
    env_episode = {0: 0, 1: 0}
    for t in range(11):
        done = np.zeros(2, bool)
        obs = np.array([[t], [100 + t]], np.float32)
        for env in (0, 1):
            env_counters[env] += 1
            if env_episode[env] < len(lengths[env]) and env_counters[env] == lengths[env][env_episode[env]]:
                done[env] = True
                env_episode[env] += 1
                env_counters[env] = 0
        assembler.add_step(obs, np.zeros(2, np.int64), np.ones(2, np.float32), obs + 1, done, np.zeros(2, bool))
    assembler.close()
    episode_id = np.concatenate([block["episode_id"] for block in out])
    steps = np.concatenate([block["step"] for block in out])
    assert np.array_equal(np.unique(episode_id), np.arange(5))
    assert np.all(np.diff(episode_id) >= 0)
    # completion order: env0 (t=2), env0 (t=7), env1 (t=8), then at t=9 env0 before env1 (ties by env index)
    assert np.bincount(episode_id).tolist() == [3, 5, 9, 2, 1]
    for eid in range(5):
        assert steps[episode_id == eid].tolist() == list(range(np.sum(episode_id == eid)))
    assert assembler.capacity > 8


def test_episode_cap_drops_the_extra_episodes(store: Path) -> None:
    collect_dataset(store, "CartPole-v1", "data", episodes=5, num_envs=16)
    data = load_dataset("data", store)
    assert len(data.episode_starts()) == 5
