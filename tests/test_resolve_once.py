"""Resolve once, at the edge: a collection builds its env once before the first row, and an
offline run opens and checks its dataset once (issue 61, item 4)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import gymnasium as gym
import numpy as np
import pytest

import rlpipe.datasets.store as store_module
from rlpipe.commands.collect import collect_dataset
from rlpipe.datasets.collector import RandomPolicy, collect, resolve_env
from rlpipe.datasets.store import open_dataset, reusing_opened
from rlpipe.datasets.writer import DatasetWriter
from rlpipe.errors import RlpipeError


@contextmanager
def counting(target: Any, name: str, counts: Counter) -> Iterator[None]:
    """Count the calls of ``target.name`` (still calling it) under ``counts[name]``."""
    original = getattr(target, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        counts[name] += 1
        return original(*args, **kwargs)

    with mock.patch.object(target, name, counted):
        yield


@pytest.mark.parametrize(
    ("env_id", "num_envs"),
    [("Pendulum-v1", "auto"), ("Pendulum-v1", "2"), ("CartPole-v1", "4"), ("GoalWorld-v0", "1")],
)
def test_collect_builds_its_env_once_before_the_first_row(cli, tmp_path: Path, env_id: str, num_envs: str) -> None:
    """`rlpipe collect` builds one env, or one vector env, before it writes its first row:
    the env it reads the spaces and info keys from (`resolve_env`) is the one it collects in.

    "Builds" counts what rlpipe asks gymnasium for, ``gymnasium.make`` (one env: Pendulum's
    auto is 1, and GoalWorld's ``is_success`` info is probed) and ``gymnasium.make_vec`` (a vector
    env; the sub-envs a SyncVectorEnv makes for itself are part of that one build). Before
    this change it was 3: one for the spaces, one to probe the info keys, one to collect in.
    """
    counts: Counter = Counter()
    at_first_row: list[int] = []
    write = DatasetWriter.write

    def first_row(writer: DatasetWriter, rows: Any) -> None:
        if not at_first_row:
            at_first_row.append(counts["make"] + counts["make_vec"])
        write(writer, rows)

    with counting(gym, "make", counts), counting(gym, "make_vec", counts), mock.patch.object(DatasetWriter, "write", first_row):
        result = cli("collect", "--env", env_id, "--steps", "300", "--num-envs", num_envs, "--store", tmp_path, "--quiet")
    assert result.code == 0, result.err
    assert at_first_row == [1], counts


def test_an_offline_run_opens_and_checks_its_dataset_once(cli, tmp_path: Path) -> None:
    """`rlpipe train bc --dataset` reads and checks the dataset's metadata and file layout once:
    `prepare_run`'s open is reused by the run's own (`load_offline`), not repeated (it was twice)."""
    collect_dataset("Pendulum-v1", steps=400, name="pendulum", store=tmp_path / "store", progress=False)
    counts: Counter = Counter()
    with counting(store_module, "read_metadata", counts), counting(store_module, "layout_problems", counts):
        result = cli(
            "train", "bc", "--dataset", "pendulum", "--store", tmp_path / "store", "--out", tmp_path / "run", "--updates", "20",
            "--set", "eval_every=20", "--set", "eval_episodes=1", "--set", "heldout_eval_episodes=0", "--device", "cpu", "--no-progress",
        )  # fmt: skip
    assert result.code == 0, result.err
    assert counts == {"read_metadata": 1, "layout_problems": 1}


def test_a_dataset_is_reused_only_within_the_run(tmp_path: Path) -> None:
    """`reusing_opened` hands back the info opened at the run's edge, however the store is
    spelled, and only inside its block."""
    collect_dataset("CartPole-v1", episodes=2, num_envs=1, name="data", store=tmp_path, progress=False)
    info = open_dataset("data", tmp_path)
    with reusing_opened(info):
        assert open_dataset("data", tmp_path) is info
        assert open_dataset("data", str(tmp_path)) is info
    again = open_dataset("data", tmp_path)
    assert again is not info and again == info


@pytest.mark.parametrize(
    ("change", "refused"), [("resize a shard", "truncated or modified"), ("add a stray file", "stray file"), ("touch the metadata", None)]
)
def test_a_dataset_changed_within_the_run_is_opened_and_checked_again(tmp_path: Path, change: str, refused: str | None) -> None:
    """The reuse holds only while the files the checks read are as they were: a changed one
    is read and checked afresh (a resized shard or a stray file: refused)."""
    collect_dataset("CartPole-v1", episodes=2, num_envs=1, name="data", store=tmp_path, progress=False)
    info = open_dataset("data", tmp_path)
    with reusing_opened(info):
        if change == "resize a shard":
            with open(info.shard_paths[0], "ab") as shard:
                shard.write(b"\0")
        elif change == "add a stray file":
            (info.path / "steps" / "shard-99999.arrow").write_bytes(b"")
        else:
            path = info.path / "metadata.json"
            os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))
        if refused is not None:
            with pytest.raises(RlpipeError, match=refused):
                open_dataset("data", tmp_path)
        else:
            again = open_dataset("data", tmp_path)
            assert again is not info and again == info


def rows_of(env_id: str, num_envs: int, probe: bool) -> list[dict[str, Any]]:
    """The rows `collect` sends for a random policy: in envs it builds, or in `resolve_env`'s probe."""
    blocks: list[dict[str, Any]] = []
    make_policy: Callable[[gym.Space, int], RandomPolicy] = lambda space, n: RandomPolicy(space, n, seed=5)  # noqa: E731
    env, envs = resolve_env(env_id, ("is_success",), num_envs if probe else None)
    try:
        collect(
            env_id,
            make_policy,
            blocks.append,
            episodes=4,
            num_envs=num_envs,
            seed=5,
            show_progress=False,
            info_space=env.info_space,
            envs=envs,
        )
    finally:
        if envs is not None:
            envs.close()
    return blocks


@pytest.mark.parametrize(("env_id", "num_envs"), [("GoalWorld-v0", 1), ("GoalWorld-v0", 3), ("Pendulum-v1", 2)])
def test_the_probed_envs_collect_the_rows_of_fresh_ones(env_id: str, num_envs: int) -> None:
    """The probe's reset and random step leave nothing behind: the collection's seeded reset
    starts it afresh, so its rows are those of envs built for the collection alone."""
    fresh, probed = rows_of(env_id, num_envs, probe=False), rows_of(env_id, num_envs, probe=True)
    assert len(fresh) == len(probed)
    for a, b in zip(fresh, probed, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            for x, y in zip(leaves(a[key]), leaves(b[key]), strict=True):
                np.testing.assert_array_equal(x, y)


def leaves(column: Any) -> list[np.ndarray]:
    """A column's arrays (a Dict observation's, key by key)."""
    return [array for key in sorted(column) for array in leaves(column[key])] if isinstance(column, dict) else [np.asarray(column)]
