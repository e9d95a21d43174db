"""Image observations through the data layer: collection, inspection, validation, Minari
round trips, polars and the memory-mapped sampler, for uint8 frames (TinyFrames-v0) and
MinAtar's bool frames (bit-packed in the Arrow shards)."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import polars as pl
import pytest
import torch

import tests.image_env  # noqa: F401  (registers TinyFrames-v0)
from rlpipe.datasets.loader import load_dataset
from rlpipe.datasets.mapped import MappedTransitions
from rlpipe.datasets.store import open_dataset
from rlpipe.datasets.validate import validate_dataset
from rlpipe.datasets.writer import write_rows
from rlpipe.training.sampler import MappedSampler, TransitionSampler

COLUMNS = ("obs", "action", "reward", "next_obs", "terminated", "truncated", "episode_id", "step")


def image_env(env_id: str) -> str:
    """`env_id`, registered: MinAtar's ids need the minatar package (skipped without it)."""
    if env_id.startswith("MinAtar/") and env_id not in gym.registry:
        pytest.importorskip("minatar.gym").register_envs()
    return env_id


@pytest.mark.parametrize(
    "env_id,arrow_type", [("TinyFrames-v0", "Array(UInt8, shape=(192,))"), ("MinAtar/Breakout-v1", "Array(Boolean, shape=(400,))")]
)
def test_an_image_dataset_goes_through_every_command(
    store: Path, tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch, env_id: str, arrow_type: str
) -> None:
    """A random collection stores the frames as the env gives them; inspect, validate, the
    Minari export and import (the same space and bytes back), polars and both samplers read them."""
    space = gym.make(image_env(env_id)).observation_space
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    args = ("--store", store)
    assert (
        cli(
            "collect", "--env", env_id, "--episodes", "12", "--num-envs", "3", "--name", "frames", "--format", "both", "--quiet", *args
        ).code
        == 0
    )
    info = open_dataset("frames", store)
    assert info.observation_space == space
    data = load_dataset("frames", store)
    assert data.obs.shape == (len(data), *space.shape) and data.obs.dtype == space.dtype
    assert str(space.shape) in cli("datasets", "inspect", "frames", *args).out
    assert cli("datasets", "validate", "frames", *args).code == 0
    assert cli("datasets", "export", "frames", "--id", "test/frames-v0", *args).code == 0
    minari = pytest.importorskip("minari")
    assert minari.load_dataset("test/frames-v0").observation_space == space
    assert cli("datasets", "import", "test/frames-v0", "--name", "back", *args).code == 0
    back = load_dataset("back", store)
    assert open_dataset("back", store).observation_space == space
    for column in COLUMNS:
        np.testing.assert_array_equal(getattr(back, column), getattr(data, column), err_msg=column)
    steps = pl.scan_ipc(info.shard_paths).collect()
    assert str(steps.schema["obs"]) == arrow_type and len(steps) == len(data)
    np.testing.assert_array_equal(steps["obs"].to_numpy().reshape(data.obs.shape), data.obs)
    every_row = torch.arange(len(data))
    for k in (1, 4):
        in_ram = TransitionSampler(data, frame_stack=k).take(every_row)
        for resident_bytes in (0, 1 << 30):
            mapped = MappedSampler(MappedTransitions(info, resident_bytes=resident_bytes), frame_stack=k).take(every_row)
            assert torch.equal(mapped.obs, in_ram.obs) and torch.equal(mapped.next_obs, in_ram.next_obs)


def test_validate_finds_a_frame_that_breaks_the_chain(store: Path) -> None:
    """An image dataset whose next_obs is not the next row's obs is reported like any other."""
    env = gym.make("TinyFrames-v0")
    frames = np.random.default_rng(0).integers(0, 256, (6, 8, 8, 3), dtype=np.uint8)
    next_obs = frames[1:].copy()
    next_obs[2, 4, 4, 1] ^= 1  # one bit of one frame
    rows = {
        "obs": frames[:5],
        "action": np.zeros(5, np.int64),
        "reward": np.zeros(5, np.float32),
        "next_obs": next_obs,
        "terminated": np.r_[np.zeros(4, bool), True],
        "truncated": np.zeros(5, bool),
        "episode_id": np.zeros(5, np.int64),
        "step": np.arange(5),
    }
    producer = {"algorithm": "random", "seed": 0, "params": {}, "num_envs": 1, "checkpoint_sha256": None}
    write_rows(
        "broken", [rows], env.observation_space, env.action_space, env_id="TinyFrames-v0", producer=producer, store=store, fmt="arrow"
    )
    problems = validate_dataset(open_dataset("broken", store))
    assert any("next_obs at row 2 differs from obs at row 3" in problem for problem in problems), problems
