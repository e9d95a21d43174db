"""Collection from vector envs: episode boundaries, autoreset handling, determinism."""

from __future__ import annotations

import hashlib
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from rlpipe.commands.collect import collect_dataset as pipeline_collect
from rlpipe.datasets.collector import EpisodeAssembler, RandomPolicy, collect
from rlpipe.datasets.loader import load_dataset
from rlpipe.datasets.schema import concat_columnar
from rlpipe.datasets.store import open_dataset
from rlpipe.envs.stepper import StepBatch, VecStepper


def collect_dataset(store: Path, env_id: str, name: str, fmt: str = "both", **kwargs) -> Path:
    """A random-policy dataset `name` in `store` (the library's `collect_dataset`, quiet)."""
    return pipeline_collect(env_id, name=name, fmt=fmt, store=store, progress=False, **kwargs).path


def train_tiny_ppo(out: Path) -> Path:
    """A CartPole PPO run of 256 env steps in `out` (a run for commands that read one)."""
    from rlpipe.algos import get_algo

    ppo = get_algo("ppo")
    config = ppo.make_config("CartPole-v1", env_steps=256, eval_every=256, eval_episodes=1, heldout_eval_episodes=0)
    ppo.train(config, out, progress=False)
    return out


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
        digests.append(
            {p.relative_to(path).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.rglob("*")) if p.is_file()}
        )
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
    env_counters = np.zeros(2, np.int64)  # steps so far in each env's current episode
    env_episode = {0: 0, 1: 0}
    for t in range(11):
        done = np.zeros(2, bool)
        obs = np.array([[t], [100 + t]], np.float32)
        env_counters += 1
        for env in (0, 1):
            if env_episode[env] < len(lengths[env]) and env_counters[env] == lengths[env][env_episode[env]]:
                done[env] = True
                env_episode[env] += 1
        actions, rewards = np.zeros(2, np.int64), np.ones(2, np.float32)
        assembler.add_step(
            StepBatch(
                obs,
                actions,
                actions,
                rewards,
                obs + 1,
                done,
                np.zeros(2, bool),
                np.ones(2, bool),
                env_counters.astype(np.float64),
                env_counters.copy(),
            )
        )
        env_counters[done] = 0
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


def episode_lengths(num_envs: int, seed: int, **budget) -> np.ndarray:
    """Lengths of the episodes `collect` keeps from random CartPole (no dataset written)."""
    ids = []
    collect(
        "CartPole-v1",
        lambda space, n: RandomPolicy(space, n, seed),
        lambda rows: ids.append(rows["episode_id"]),
        num_envs=num_envs,
        seed=seed,
        show_progress=False,
        **budget,
    )
    return np.bincount(np.concatenate(ids))


def first_to_finish_lengths(num_envs: int, seed: int, episodes: int) -> np.ndarray:
    """The control: the first `episodes` episodes to finish across the envs (the old rule)."""
    envs = gym.make_vec("CartPole-v1", num_envs=num_envs)
    ids = []
    assembler = EpisodeAssembler(num_envs, lambda rows: ids.append(rows["episode_id"]))  # no budget: keeps all, ids by completion
    policy = RandomPolicy(envs.single_action_space, num_envs, seed)
    stepper = VecStepper(envs, None, seed, assembler.add_step)
    while assembler.episodes_done < episodes:
        stepper.step(policy(stepper.obs))
    assembler.close()
    envs.close()
    return np.bincount(np.concatenate(ids))[:episodes]


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical CDFs."""
    values = np.concatenate([a, b])
    cdf_a = np.searchsorted(np.sort(a), values, side="right") / len(a)
    cdf_b = np.searchsorted(np.sort(b), values, side="right") / len(b)
    return float(np.abs(cdf_a - cdf_b).max())


def ks_critical(n: int, m: int, alpha: float = 1e-3) -> float:
    """The asymptotic critical value of the two-sample KS statistic (conservative for integer data)."""
    return float(np.sqrt(-np.log(alpha / 2) / 2) * np.sqrt((n + m) / (n * m)))


@pytest.mark.slow
def test_episode_lengths_with_64_envs_match_one_env() -> None:
    """Per-env budgets keep the episode-length distribution of 64 envs that of 1 env, in both
    modes, where the bias is largest: one episode (or ~22 steps) per env and run, pooled over
    16 runs. The control, the first 64 episodes to finish across 64 envs, must fail.
    Measured (this machine, KS statistic / critical value at alpha=0.001, seed groups 0-2):
    episodes 0.030 0.050 0.033 / 0.100, steps 0.050 0.022 0.035 / 0.093, control 0.201 0.189
    0.219 / 0.100 (mean length 17.4, 17.4, 16.9 against 22.8 with one env)."""
    reference = episode_lengths(1, 0, episodes=600)  # one env: episodes in sequence, nothing to race
    for group in range(3):
        by_episodes = np.concatenate([episode_lengths(64, 1000 * group + run + 1, episodes=64) for run in range(16)])
        by_steps = np.concatenate([episode_lengths(64, 1000 * group + run + 101, steps=64 * 22) for run in range(16)])
        control = np.concatenate([first_to_finish_lengths(64, 1000 * group + run + 201, 64) for run in range(16)])
        for sample in (by_episodes, by_steps):
            assert ks_statistic(reference, sample) < ks_critical(len(reference), len(sample))
        assert ks_statistic(reference, control) > ks_critical(len(reference), len(control))
        assert control.mean() < 0.9 * reference.mean()


def one_step(rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, lengths: np.ndarray) -> StepBatch:
    """A valid step of len(rewards) envs with zero observations and actions; `lengths`: each
    env's episode length so far, this step included."""
    n = len(rewards)
    obs, actions = np.zeros((n, 1)), np.zeros(n, np.int64)
    return StepBatch(obs, actions, actions, rewards, obs, terminated, truncated, np.ones(n, bool), rewards.astype(np.float64), lengths)


def test_budgets_are_split_evenly_over_the_envs() -> None:
    """Each env keeps its own share: 10 episodes over 4 envs are 3, 3, 2, 2 episodes, and a
    steps budget keeps every env's episodes until its share is reached, the crossing one too."""
    out = []
    assembler = EpisodeAssembler(4, out.append, episodes=10)
    done = np.ones(4, bool)
    for _ in range(5):  # every env finishes a 1-step episode each step
        assembler.add_step(one_step(np.arange(4, dtype=np.float32), done, ~done, np.ones(4, np.int64)))
    assembler.close()
    rewards = np.concatenate([block["reward"] for block in out])
    assert np.bincount(rewards.astype(int)).tolist() == [3, 3, 2, 2] and assembler.finished
    out.clear()
    assembler = EpisodeAssembler(2, out.append, steps=5)  # shares 3 and 2 steps
    for t in range(8):  # episodes of 2 steps in both envs
        ends = np.full(2, t % 2 == 1)
        assembler.add_step(one_step(np.arange(2, dtype=np.float32), ends, np.zeros(2, bool), np.full(2, t % 2 + 1)))
    assembler.close()
    rewards = np.concatenate([block["reward"] for block in out])
    assert np.bincount(rewards.astype(int)).tolist() == [4, 2]  # env 0: 2 + 2 >= 3 steps; env 1: 2 >= 2


def rows_of(blocks: list[dict]) -> dict:
    """Row blocks from a sink joined into one column each."""
    return {key: concat_columnar([block[key] for block in blocks]) for key in blocks[0]}


@pytest.mark.parametrize(
    "env_id,budget", [("CartPole-v1", {"steps": 700}), ("Pendulum-v1", {"episodes": 3}), ("GoalWorld-v0", {"episodes": 5})]
)
def test_one_env_path_equals_a_one_env_vector_env(env_id: str, budget: dict) -> None:
    """`collect` with one env steps a plain gym.make env (no vector env); its rows equal those
    of the vector path (VecStepper + EpisodeAssembler) over a 1-env SyncVectorEnv of the same env."""
    fast, reference = [], []
    collect(env_id, lambda space, n: RandomPolicy(space, n, 4), fast.append, num_envs=1, seed=4, show_progress=False, **budget)
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(env_id)], autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
    assembler = EpisodeAssembler(1, reference.append, **budget)
    policy = RandomPolicy(envs.single_action_space, 1, 4)
    stepper = VecStepper(envs, None, 4, assembler.add_step)
    while not assembler.finished:
        stepper.step(policy(stepper.obs))
    assembler.close()
    fast, reference = rows_of(fast), rows_of(reference)
    assert set(fast) == set(reference)
    for key in reference:
        for ours, theirs in leaf_pairs(fast[key], reference[key]):
            np.testing.assert_array_equal(ours, theirs, err_msg=key)


def test_auto_num_envs_batches_native_vector_envs_only() -> None:
    from rlpipe.commands.collect import AUTO_MAX_ENVS, auto_num_envs

    assert auto_num_envs("CartPole-v1", None, 1_000_000, batched_policy=False) == AUTO_MAX_ENVS
    assert auto_num_envs("CartPole-v1", None, 10_000, batched_policy=False) == 5  # 2,000 steps per env at least
    assert auto_num_envs("CartPole-v1", None, 500, batched_policy=False) == 1
    assert auto_num_envs("CartPole-v1", 40, None, batched_policy=False) == 10  # 4 episodes per env at least
    assert auto_num_envs("Pendulum-v1", None, 1_000_000, batched_policy=False) == 1  # stepped in Python: one env is fastest
    assert auto_num_envs("Pendulum-v1", None, 1_000_000, batched_policy=True) == 8  # an expert's forward pass is shared


def test_auto_num_envs_is_recorded_and_reproducible(tmp_path: Path) -> None:
    first = pipeline_collect("CartPole-v1", steps=20_000, seed=2, fmt="arrow", store=tmp_path / "a", progress=False)
    again = pipeline_collect("CartPole-v1", steps=20_000, seed=2, num_envs=10, fmt="arrow", store=tmp_path / "b", progress=False)
    assert first.metadata["producer"]["num_envs"] == 10
    assert first.metadata["content_hash"] == again.metadata["content_hash"]
