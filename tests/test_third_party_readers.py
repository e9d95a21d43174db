"""Reading a stored dataset with other tools, exactly as docs/dataset-format.md says."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow.dataset as pads
import pytest

import rlpipe.envs  # noqa: F401  (registers GoalWorld-v0)
from tests.test_collector import collect_dataset


def test_pyarrow_dataset_reads_the_steps_directory(store: Path) -> None:
    collect_dataset(store, "GoalWorld-v0", "goal", episodes=2, num_envs=1)
    with pytest.raises(Exception, match="main_data.hdf5"):
        pads.dataset(str(store / "goal"), format="ipc")  # the HDF5 copy beside the shards is not Arrow
    assert pads.dataset(str(store / "goal" / "steps"), format="ipc").count_rows() == 100


def test_polars_unnests_dict_columns_with_a_separator(store: Path) -> None:
    collect_dataset(store, "GoalWorld-v0", "goal", episodes=1, num_envs=1)
    steps = pl.scan_ipc(str(store / "goal" / "steps" / "*.arrow"))
    with pytest.raises(pl.exceptions.DuplicateError):
        steps.unnest("obs", "next_obs").collect()  # obs and next_obs share child names
    columns = steps.unnest("obs", "next_obs", separator=".").collect().columns
    assert {"obs.achieved_goal", "next_obs.achieved_goal", "obs.desired_goal", "next_obs.observation"} <= set(columns)
