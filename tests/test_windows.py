"""Windows of consecutive steps for sequence models (`rlpipe.training.windows`): every window
is the rows of one episode ending at the drawn row, padded on the left, as a plain loop over
the rollout builds it; in RAM and from the memory maps alike; draws uniform over steps, or
over episodes."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch

import tests.image_env  # noqa: F401  (registers TinyFrames-v0)
from rlpipe.commands.collect import collect_dataset
from rlpipe.datasets import frames
from rlpipe.datasets.loader import load_shards
from rlpipe.datasets.mapped import MappedTransitions
from rlpipe.datasets.store import open_dataset
from rlpipe.datasets.writer import write_rows
from rlpipe.envs.spaces import ActionScaler
from rlpipe.errors import RlpipeError
from rlpipe.training.env import BOX
from rlpipe.training.offline import load_offline
from rlpipe.training.windows import WindowBatch, WindowSampler, shuffled_within_steps
from tests.test_frame_stacks import PRODUCER, wrapped_rollout

FIELDS = ("obs", "actions", "rewards", "returns_to_go", "timesteps", "terminated", "mask")


def samplers(info, **options) -> dict[str, WindowSampler]:
    """The same windows from the loaded dataset and from its maps (columns in RAM, or read per row)."""
    return {
        "in RAM": WindowSampler(load_shards(info), **options),
        "mapped": WindowSampler(MappedTransitions(info), **options),
        "mapped, pread": WindowSampler(MappedTransitions(info, resident_bytes=0), **options),
    }


def assert_same(ours: WindowBatch, theirs: WindowBatch) -> None:
    for field in FIELDS:
        assert torch.equal(getattr(ours, field), getattr(theirs, field)), field


def gapped_rollout(episodes: int, drop: set[tuple[int, int]]) -> list[dict[str, np.ndarray]]:
    """TinyFrames-v0 episodes of random actions without the rows ``drop`` names ((episode,
    step), as a subset leaves them out)."""
    blocks = []
    for block in wrapped_rollout("TinyFrames-v0", 1, episodes, seed=3)[0]:
        keep = np.array([(int(e), int(s)) not in drop for e, s in zip(block["episode_id"], block["step"])])
        blocks.append({name: values[keep] for name, values in block.items()})
    return blocks


def expected_windows(blocks: list[dict[str, np.ndarray]], k: int) -> dict[str, np.ndarray]:
    """Every row's window, written out by walking each episode's runs of consecutive steps."""
    rows = {name: np.concatenate([block[name] for block in blocks]) for name in blocks[0]}
    runs: list[list[int]] = []
    for row in range(len(rows["step"])):
        follows = row > 0 and rows["episode_id"][row] == rows["episode_id"][row - 1] and rows["step"][row] == rows["step"][row - 1] + 1
        if follows:
            runs[-1].append(row)
        else:
            runs.append([row])
    window_rows, mask, returns = [], [], np.zeros(len(rows["step"]))
    for run in runs:
        for position, row in enumerate(run):
            returns[row] = sum(float(rows["reward"][later]) for later in run[position:])
            real = run[max(0, position - k + 1) : position + 1]
            window_rows.append([run[0]] * (k - len(real)) + real)
            mask.append([False] * (k - len(real)) + [True] * len(real))
    at = np.array(window_rows)
    return {
        "obs": rows["obs"][at],
        "actions": rows["action"][at],
        "rewards": rows["reward"][at],
        "returns_to_go": returns[at],
        "timesteps": rows["step"][at],
        "terminated": rows["terminated"][at],
        "mask": np.array(mask),
    }


@pytest.mark.parametrize("k,block_rows", [(1, frames.BLOCK_ROWS), (4, frames.BLOCK_ROWS), (13, frames.BLOCK_ROWS), (4, 5)])
def test_windows_are_an_episodes_consecutive_rows_padded_on_the_left(store: Path, monkeypatch, k: int, block_rows: int) -> None:
    """Every row's window, in RAM and from the maps of several shards (episodes shorter than
    k, a subset's gaps, k longer than any episode; depths and returns-to-go computed over
    blocks of 5 rows, so chains cross blocks), is the loop's: the rows of its run of
    consecutive steps ending at it, the run's first row repeated on the left with mask False;
    returns-to-go and timesteps as summed and counted."""
    monkeypatch.setattr(frames, "BLOCK_ROWS", block_rows)
    blocks = gapped_rollout(30, drop={(4, 2), (9, 1), (9, 5)})
    env = gym.make("TinyFrames-v0")
    write_rows(
        "gaps",
        blocks,
        env.observation_space,
        env.action_space,
        env_id=None,
        producer=PRODUCER,
        store=store,
        fmt="arrow",
        kind="transitions",
        shard_bytes=4_000,
    )
    info = open_dataset("gaps", store)
    assert len(info.shard_paths) >= 3
    episode_id = np.concatenate([block["episode_id"] for block in blocks])
    expected = expected_windows(blocks, k)
    assert k == 1 or ((expected["mask"].sum(1) < k) & expected["terminated"][:, -1]).any()  # an episode shorter than k
    for label, sampler in samplers(info, window=k).items():
        batch = sampler.take(torch.arange(len(episode_id)))
        assert batch.obs.shape == (len(episode_id), k, 8, 8, 3) and batch.obs.dtype == torch.uint8, label
        assert batch.timesteps.dtype == torch.int64 and batch.mask.dtype == torch.bool, label
        for field, values in expected.items():
            np.testing.assert_allclose(getattr(batch, field).numpy(), values, rtol=1e-6, err_msg=f"{label}: {field}")
        np.testing.assert_array_equal(
            batch.starts.numpy(), expected["mask"] & ~np.c_[np.zeros(len(episode_id), bool), expected["mask"][:, :-1]]
        )


@pytest.mark.parametrize("per_episode", [False, True])
def test_mapped_windows_equal_in_ram_ones_for_image_observations(store: Path, per_episode: bool) -> None:
    """Same seed, same batches in RAM and from the maps: uint8 frames, and MinAtar's bool ones
    (bit-packed in the shards)."""
    minatar_gym = pytest.importorskip("minatar.gym")
    if "MinAtar/Breakout-v1" not in gym.registry:
        minatar_gym.register_envs()
    for env_id, episodes, shard_bytes in (("TinyFrames-v0", 30, 4_000), ("MinAtar/Breakout-v1", 6, 8_000)):
        blocks = wrapped_rollout(env_id, 1, episodes, seed=3)[0]
        env = gym.make(env_id)
        name = env_id.split("/")[-1].lower()
        write_rows(
            name,
            blocks,
            env.observation_space,
            env.action_space,
            env_id=None,
            producer=PRODUCER,
            store=store,
            fmt="arrow",
            shard_bytes=shard_bytes,
        )
        info = open_dataset(name, store)
        assert len(info.shard_paths) >= 3
        built = samplers(info, window=8, seed=5, per_episode=per_episode)
        assert built["in RAM"]._columns["obs"].dtype == (torch.bool if "MinAtar" in env_id else torch.uint8)
        for _ in range(5):
            theirs = built["in RAM"].sample(32)
            for label in ("mapped", "mapped, pread"):
                assert_same(built[label].sample(32), theirs)


def test_mapped_windows_equal_in_ram_ones_with_mapped_actions(store: Path) -> None:
    """Continuous actions mapped to [-1, 1] (once in RAM, per batch from the maps) agree too."""
    collect_dataset("Pendulum-v1", episodes=6, num_envs=2, fmt="arrow", store=store, name="pendulum", progress=False)
    info = open_dataset("pendulum", store)
    action_map = ActionScaler(info.action_space).from_env
    built = samplers(info, window=20, seed=2, action_map=action_map)
    for _ in range(3):
        theirs = built["in RAM"].sample(64)
        assert theirs.actions.abs().max() <= 1.0 and theirs.actions.dtype == torch.float32
        for label in ("mapped", "mapped, pread"):
            assert_same(built[label].sample(64), theirs)


def test_a_sequence_model_loads_no_transition_sampler(store: Path) -> None:
    """`load_offline(windows=True)` leaves the transition sampler (a device copy of every
    column) unbuilt until read; without it the sampler is built while loading."""
    collect_dataset("Pendulum-v1", episodes=2, num_envs=2, fmt="arrow", store=store, name="pendulum", progress=False)
    config = SimpleNamespace(dataset="pendulum", store=store, seed=0, device="cpu", torch_threads=1, max_samples=None)
    for windows in (True, False):
        data = load_offline("test", config, (BOX,), windows=windows)
        assert ("sampler" in vars(data)) is not windows
        assert data.sampler.sample(8).obs.shape == (8, 3)
        assert "sampler" in vars(data)


def chi_square(counts: np.ndarray, expected: np.ndarray) -> float:
    return float(((counts - expected) ** 2 / expected).sum())


def assert_uniform(counts: np.ndarray, expected: np.ndarray) -> None:
    """Pearson's chi-square within 5 standard deviations of its mean (df = bins - 1)."""
    df = len(counts) - 1
    assert abs(chi_square(counts, expected) - df) < 5 * np.sqrt(2 * df), (chi_square(counts, expected), df)


def test_draws_are_uniform_over_steps_or_over_episodes(store: Path) -> None:
    """Episodes of 1 to 600 steps: plain draws hit every row equally often (so long episodes
    more often); per_episode draws hit every episode equally often, then its rows equally."""
    lengths = [1, 600, 2, 3, 250, 1, 40, 5, 120, 1]
    blocks = [
        {
            "obs": np.full((n, 1), e, np.float32),
            "action": np.zeros(n, np.int64),
            "reward": np.ones(n, np.float32),
            "next_obs": np.full((n, 1), e, np.float32),
            "terminated": np.arange(n) == n - 1,
            "truncated": np.zeros(n, bool),
            "episode_id": np.full(n, e),
            "step": np.arange(n),
        }
        for e, n in enumerate(lengths)
    ]
    space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    write_rows("unequal", blocks, space, gym.spaces.Discrete(2), env_id=None, producer=PRODUCER, store=store, fmt="arrow")
    info = open_dataset("unequal", store)
    draws, rows = 400_000, sum(lengths)
    first = np.cumsum([0, *lengths[:-1]])
    for data in (load_shards(info), MappedTransitions(info)):
        steps = WindowSampler(data, window=4, seed=0).draw(draws).numpy()
        assert_uniform(np.bincount(steps, minlength=rows), np.full(rows, draws / rows))
        episodes = WindowSampler(data, window=4, seed=0, per_episode=True).draw(draws).numpy()
        episode = np.searchsorted(first, episodes, side="right") - 1
        assert_uniform(np.bincount(episode, minlength=len(lengths)), np.full(len(lengths), draws / len(lengths)))
        longest = episodes[episode == 1] - first[1]
        assert_uniform(np.bincount(longest, minlength=600), np.full(600, len(longest) / 600))
        # the control: per-episode draws are far from uniform over steps
        assert chi_square(np.bincount(episodes, minlength=rows), np.full(rows, draws / rows)) > 100 * rows


@pytest.mark.parametrize("window", [0, -3, 256])
def test_bad_window_sizes_are_refused_in_one_line(store: Path, window: int) -> None:
    blocks = wrapped_rollout("TinyFrames-v0", 1, 2, seed=3)[0]
    env = gym.make("TinyFrames-v0")
    write_rows("frames", blocks, env.observation_space, env.action_space, env_id=None, producer=PRODUCER, store=store, fmt="arrow")
    info = open_dataset("frames", store)
    for data in (load_shards(info), MappedTransitions(info)):
        with pytest.raises(RlpipeError, match=f"window must be from 1 to 255 steps, got {window}$") as error:
            WindowSampler(data, window)
        assert "\n" not in str(error.value)


def test_multi_agent_datasets_are_refused_in_ram_and_mapped(store: Path) -> None:
    """Agents' rows interleave within a step, so rows of one agent are not consecutive rows:
    both paths refuse (the maps used to chain one agent's step into another's)."""
    obs = np.array([0, 100, 1, 101, 2, 102], np.float32)[:, None]
    rows = {
        "obs": obs,
        "next_obs": obs + 1,
        "action": np.zeros(6, np.int64),
        "reward": np.ones(6, np.float32),
        "terminated": np.arange(6) >= 4,
        "truncated": np.zeros(6, bool),
        "episode_id": np.zeros(6, np.int64),
        "step": np.array([0, 0, 1, 1, 2, 2]),
        "agent": np.array(["a", "b"] * 3),
    }
    space = gym.spaces.Box(-1000, 1000, (1,), np.float32)
    write_rows("agents", [rows], space, gym.spaces.Discrete(2), env_id=None, producer=PRODUCER, store=store, fmt="arrow", multi_agent=True)
    info = open_dataset("agents", store)
    for data in (load_shards(info), MappedTransitions(info)):
        with pytest.raises(RlpipeError, match="single-agent datasets of array observations only"):
            WindowSampler(data, 3)


def test_returns_to_go_shuffled_within_steps_keep_each_steps_values() -> None:
    """The control's shuffle: every row's value comes from a row of the same timestep, each
    value used once, and with several episodes some rows get another episode's value."""
    steps = np.array([0, 1, 2, 0, 1, 0, 1, 2, 3])
    values = np.arange(len(steps), dtype=np.float64) * 10
    shuffled = shuffled_within_steps(values, steps, seed=3)
    for step in np.unique(steps):
        assert sorted(shuffled[steps == step]) == sorted(values[steps == step])
    assert not np.array_equal(shuffled, values)
    np.testing.assert_array_equal(shuffled, shuffled_within_steps(values, steps, seed=3))
