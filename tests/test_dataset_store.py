"""The dataset format: writer/loader round trips, schema, atomicity, hashing, validation."""

from __future__ import annotations

import json
import re
from pathlib import Path

import gymnasium as gym
import numpy as np
import polars as pl
import pytest
import torch

from rlpipe.datasets.loader import load_dataset
from rlpipe.datasets.schema import map_columnar
from rlpipe.datasets.store import check_name, list_datasets, open_dataset, remove_dataset
from rlpipe.datasets.validate import validate_dataset
from rlpipe.datasets.writer import DatasetWriter, write_rows
from rlpipe.errors import RlpipeError
from rlpipe.training.sampler import TransitionSampler
from tests.conftest import store_contents

BOX = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
GOAL_SPACE = gym.spaces.Dict(
    {
        "observation": gym.spaces.Box(0.0, 5.0, (2,), np.float32),
        "achieved_goal": gym.spaces.Box(0.0, 5.0, (2,), np.float32),
        "desired_goal": gym.spaces.Box(0.0, 5.0, (2,), np.float32),
    }
)


def synthetic_rows(lengths: list[int], obs_space: gym.Space, act_space: gym.Space, first_id: int = 0, seed: int = 0) -> dict:
    """Whole episodes of random data whose next_obs[t] is obs[t + 1] within an episode."""
    rng = np.random.default_rng(seed)
    total = sum(lengths)
    # one extra state per episode: its final next_obs
    state_index = np.arange(total) + np.repeat(np.arange(len(lengths)), lengths)

    def sample(space: gym.Space, n: int):
        if isinstance(space, gym.spaces.Dict):
            return {key: sample(sub, n) for key, sub in space.spaces.items()}
        if isinstance(space, gym.spaces.Discrete):
            return rng.integers(space.n, size=n)
        return rng.uniform(-1, 1, size=(n,) + space.shape).astype(space.dtype)

    states = sample(obs_space, total + len(lengths))
    return {
        "episode_id": np.repeat(np.arange(first_id, first_id + len(lengths)), lengths),
        "step": np.concatenate([np.arange(n) for n in lengths]).astype(np.int32),
        "obs": map_columnar(states, lambda a: a[state_index]),
        "action": sample(act_space, total),
        "reward": rng.normal(size=total).astype(np.float32),
        "next_obs": map_columnar(states, lambda a: a[state_index + 1]),
        "terminated": np.concatenate([np.r_[np.zeros(n - 1, bool), True] for n in lengths]),
        "truncated": np.zeros(total, bool),
    }


def assert_columnar_equal(a, b) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_columnar_equal(a[key], b[key])
    else:
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_box_round_trip_is_exact_and_zero_copy(store: Path) -> None:
    rows = synthetic_rows([5, 7, 3], BOX, gym.spaces.Discrete(4))
    write_rows("synthetic", [rows], BOX, gym.spaces.Discrete(4), env_id=None, producer={"algorithm": "test"}, store=store, fmt="arrow")
    data = load_dataset("synthetic", store)
    for name in ("obs", "action", "reward", "next_obs", "terminated", "truncated", "episode_id", "step"):
        assert_columnar_equal(getattr(data, name), rows[name])
    assert data.obs.flags["C_CONTIGUOUS"] and not data.obs.flags["OWNDATA"]  # a view of the memory map
    np.testing.assert_allclose(
        data.episode_returns(), [rows["reward"][:5].sum(), rows["reward"][5:12].sum(), rows["reward"][12:].sum()], rtol=1e-6
    )


def test_dict_observations_are_struct_columns_polars_can_read(store: Path) -> None:
    act = gym.spaces.Box(-1, 1, (2,), np.float32)
    rows = synthetic_rows([4, 6], GOAL_SPACE, act)
    write_rows("goals", [rows], GOAL_SPACE, act, env_id=None, producer={"algorithm": "test"}, store=store, fmt="both")
    data = load_dataset("goals", store)
    assert_columnar_equal(data.obs, rows["obs"])
    assert_columnar_equal(data.next_obs, rows["next_obs"])
    frame = pl.scan_ipc(str(store / "goals" / "steps" / "*.arrow")).select(pl.col("obs").struct.field("desired_goal")).collect()
    np.testing.assert_array_equal(frame["desired_goal"].to_numpy(), rows["obs"]["desired_goal"])


def test_multi_agent_column(store: Path) -> None:
    act = gym.spaces.Discrete(3)
    red, blue = synthetic_rows([2, 2], BOX, act, seed=0), synthetic_rows([2, 2], BOX, act, seed=1)
    # one row per agent per step: each agent's rows are whole episodes, interleaved
    rows = {key: np.stack([red[key], blue[key]], axis=1).reshape(-1, *red[key].shape[1:]) for key in red}
    rows["agent"] = np.array(["red_0", "blue_0"] * 4)
    write_rows("marl", [rows], BOX, act, env_id=None, producer={"algorithm": "test"}, store=store, fmt="arrow", multi_agent=True)
    data = load_dataset("marl", store)
    assert data.agent.tolist() == rows["agent"].tolist()
    frame = pl.read_ipc(str(store / "marl" / "steps" / "shard-00000.arrow"))
    assert frame.group_by("agent").len().sort("agent")["len"].to_list() == [4, 4]
    with pytest.raises(RlpipeError, match="Arrow-only"):
        DatasetWriter("marl2", BOX, act, env_id=None, store=store, fmt="both", multi_agent=True)


def test_several_shards_load_like_one(store: Path) -> None:
    act = gym.spaces.Discrete(2)
    batches = [synthetic_rows([10] * 20, BOX, act, first_id=20 * i, seed=i) for i in range(5)]
    write_rows("sharded", batches, BOX, act, env_id=None, producer={}, store=store, fmt="both", shard_bytes=4096)
    write_rows("single", batches, BOX, act, env_id=None, producer={}, store=store, fmt="arrow")
    info = open_dataset("sharded", store)
    assert len(info.shard_paths) > 1
    sharded, single = load_dataset("sharded", store), load_dataset("single", store)
    for name in ("obs", "action", "reward", "next_obs", "terminated", "episode_id", "step"):
        assert_columnar_equal(getattr(sharded, name), getattr(single, name))
    assert validate_dataset(info) == []


def test_failed_write_leaves_nothing(store: Path) -> None:
    act = gym.spaces.Discrete(2)
    with pytest.raises(RuntimeError), DatasetWriter("broken", BOX, act, env_id=None, store=store, shard_bytes=1024) as writer:
        writer.write(synthetic_rows([50] * 4, BOX, act))
        raise RuntimeError("collection died")
    assert store_contents(store) == []
    assert list_datasets(store) == []


def test_existing_name_needs_force_and_force_replaces(store: Path) -> None:
    act = gym.spaces.Discrete(2)
    write_rows("data", [synthetic_rows([3], BOX, act)], BOX, act, env_id=None, producer={}, store=store)
    with pytest.raises(RlpipeError, match="already exists"):
        DatasetWriter("data", BOX, act, env_id=None, store=store)
    write_rows("data", [synthetic_rows([4, 4], BOX, act)], BOX, act, env_id=None, producer={}, store=store, force=True)
    assert open_dataset("data", store).metadata["total_steps"] == 8
    assert store_contents(store) == ["data"]


@pytest.mark.parametrize("name", ["../up", "a/b", "..", ".hidden", "", "x" * 200, "bad name"])
def test_bad_names_rejected(name: str) -> None:
    with pytest.raises(RlpipeError, match="invalid dataset name"):
        check_name(name)


def test_newer_format_version_is_refused(store: Path) -> None:
    act = gym.spaces.Discrete(2)
    path = write_rows("data", [synthetic_rows([3], BOX, act)], BOX, act, env_id=None, producer={}, store=store)
    meta = json.loads((path / "metadata.json").read_text())
    meta["format_version"] = 99
    (path / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(RlpipeError, match="format version 99"):
        open_dataset("data", store)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"format_version": -1}, "'format_version' is -1, not a version number"),
        ({"format_version": 0}, "'format_version' is 0, not a version number"),
        ({"format_version": "2"}, "'format_version' is \"2\", not a version number"),
        ({"formats": []}, "formats []: expected 'arrow'"),
        ({"formats": ["hdf5"]}, "formats ['hdf5']: expected 'arrow'"),
        ({"formats": ["arrow", "arrow"]}, "each once"),
        (
            {"episode_length": {"mean": 3, "std": 0, "min": 3, "max": 2**70}},
            "'episode_length.max' holds an integer beyond the 64-bit range",
        ),
        ({"producer": {"algorithm": 7}}, "'producer.algorithm' is not str"),
        ({"producer": {"seed": "0"}}, "'producer.seed' is not int or null"),
        ({"producer": {"num_envs": True}}, "'producer.num_envs' is not int"),
        ({"producer": {"params": []}}, "'producer.params' is not dict"),
        ({"ref_min_score": "x", "ref_max_score": 500.0}, "'ref_min_score' is not a finite number or null"),  # was eval's traceback
        ({"ref_max_score": [1]}, "'ref_max_score' is not a finite number or null"),
        ({"ref_max_score": True}, "'ref_max_score' is not a finite number or null"),
    ],
)
def test_metadata_the_format_forbids_is_refused(store: Path, change: dict, message: str) -> None:
    """Versions below 1, formats without the Arrow shards or repeated, integers past int64
    (outside `episode_seeds`) and producer fields of the wrong type: one line each."""
    act = gym.spaces.Discrete(2)
    path = write_rows("data", [synthetic_rows([3], BOX, act)], BOX, act, env_id=None, producer={}, store=store)
    meta = json.loads((path / "metadata.json").read_text())
    meta.update(change)
    (path / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(RlpipeError, match=re.escape(message)):
        open_dataset("data", store)


def test_truncated_shard_is_detected(store: Path) -> None:
    act = gym.spaces.Discrete(2)
    path = write_rows("data", [synthetic_rows([30] * 10, BOX, act)], BOX, act, env_id=None, producer={}, store=store, fmt="arrow")
    shard = path / "steps" / "shard-00000.arrow"
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(RlpipeError, match="is corrupted: steps/shard-00000.arrow is .* bytes"):
        load_dataset("data", store)
    assert any("does not match" in problem for problem in validate_dataset(open_dataset("data", store, check_files=False)))


def test_hdf5_refuses_rows_that_are_not_trajectories(store: Path) -> None:
    act = gym.spaces.Discrete(2)
    rows = synthetic_rows([5, 5], BOX, act)
    rows["next_obs"] = rows["next_obs"][::-1].copy()
    with pytest.raises(RlpipeError, match="use --format arrow"):
        write_rows("data", [rows], BOX, act, env_id=None, producer={}, store=store, fmt="both")
    assert store_contents(store) == []


def test_flipped_byte_fails_validation_only_by_hash(store: Path) -> None:
    act = gym.spaces.Discrete(2)
    path = write_rows("data", [synthetic_rows([30] * 10, BOX, act)], BOX, act, env_id=None, producer={}, store=store, fmt="arrow")
    shard = path / "steps" / "shard-00000.arrow"
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    shard.write_bytes(bytes(raw))
    assert validate_dataset(open_dataset("data", store))


def test_remove(store: Path) -> None:
    act = gym.spaces.Discrete(2)
    write_rows("data", [synthetic_rows([3], BOX, act)], BOX, act, env_id=None, producer={}, store=store)
    remove_dataset("data", store)
    assert store_contents(store) == []
    with pytest.raises(RlpipeError, match="not found"):
        open_dataset("data", store)


def test_sampler_yields_tensors_from_the_data(store: Path) -> None:
    act = gym.spaces.Box(-1, 1, (2,), np.float32)
    rows = synthetic_rows([50, 50], BOX, act)
    write_rows("data", [rows], BOX, act, env_id=None, producer={}, store=store, fmt="arrow")
    sampler = TransitionSampler(load_dataset("data", store), seed=0)
    batch = sampler.sample(64)
    assert batch.obs.shape == (64, 3) and batch.obs.dtype == torch.float32
    assert batch.terminated.dtype == torch.float32 and batch.rewards.shape == (64,)
    # every sampled row is a real row: its obs and action match the stored row with the same reward
    index = {float(r): i for i, r in enumerate(rows["reward"])}
    for obs, action, reward in zip(batch.obs.numpy(), batch.actions.numpy(), batch.rewards.numpy()):
        np.testing.assert_array_equal(obs, rows["obs"][index[float(reward)]])
        np.testing.assert_array_equal(action, rows["action"][index[float(reward)]])
    again = TransitionSampler(load_dataset("data", store), seed=0).sample(64)
    assert torch.equal(batch.obs, again.obs)
