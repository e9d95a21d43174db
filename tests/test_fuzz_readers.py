"""Fuzzing the readers of stored files: random mutations of a real dataset's metadata.json,
truncated and bit-flipped shards, mutated checkpoint.json. Every outcome must be a clean
RlpipeError (one line, exit 2 through the CLI) or a correct result: never another exception,
never different numbers. Derandomized, so failures reproduce; about 20 s."""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlpipe.datasets.loader import TransitionArrays, load_shards
from rlpipe.datasets.store import open_dataset, store_entries
from rlpipe.datasets.summary import summary_tables
from rlpipe.datasets.validate import validate_dataset
from rlpipe.datasets.writer import write_rows
from rlpipe.errors import RlpipeError
from rlpipe.storage.files import sha256_file
from tests.test_dataset_store import synthetic_rows

FUZZ = settings(
    max_examples=60,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACT = gym.spaces.Discrete(2)
SHARD = "steps/shard-00000.arrow"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, TransitionArrays]:
    """A small real dataset (Arrow and Minari HDF5) and its arrays."""
    store = tmp_path_factory.mktemp("fuzz") / "store"
    write_rows(
        "data",
        [synthetic_rows([7, 5, 9, 4], OBS, ACT)],
        OBS,
        ACT,
        env_id="CartPole-v1",
        producer={"algorithm": "test"},
        store=store,
        fmt="both",
    )
    return store / "data", load_shards(open_dataset("data", store))


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rlpipe.algos import get_algo

    out = tmp_path_factory.mktemp("fuzz-run") / "run"
    ppo = get_algo("ppo")
    ppo.train(ppo.make_config("CartPole-v1", env_steps=512), out, progress=False)
    return out


def mutate(data: st.DataObject, value: Any) -> Any:
    """Drop or replace one randomly chosen entry somewhere inside a JSON value."""
    if not isinstance(value, (dict, list)) or not value or data.draw(st.integers(0, 3)) == 0:
        return data.draw(json_values)
    keys = list(value) if isinstance(value, dict) else list(range(len(value)))
    key = data.draw(st.sampled_from(keys))
    copy = dict(value) if isinstance(value, dict) else list(value)
    if isinstance(copy, dict) and data.draw(st.booleans()):
        del copy[key]
    else:
        copy[key] = mutate(data, copy[key])
    return copy


def read_everything(store: Path, original: TransitionArrays) -> None:
    """Open, load, inspect, validate and list: RlpipeError, or the original numbers."""
    assert all(isinstance(entry, (RlpipeError, object)) for _, entry in store_entries(store))
    try:
        info = open_dataset("data", store)
        data = load_shards(info)
        summary_tables(info)
        validate_dataset(info)
    except RlpipeError as exc:
        assert "\n" not in str(exc)
        return
    for name in ("obs", "action", "reward", "next_obs", "terminated", "truncated", "episode_id", "step"):
        np.testing.assert_array_equal(np.ravel(getattr(data, name)), np.ravel(getattr(original, name)))


@FUZZ
@given(data=st.data())
def test_mutated_metadata_is_refused_or_read_correctly(source, data: st.DataObject) -> None:
    path, original = source
    meta = json.loads((path / "metadata.json").read_text())
    for _ in range(data.draw(st.integers(1, 3))):
        meta = mutate(data, meta)
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp)
        shutil.copytree(path, store / "data")
        (store / "data" / "metadata.json").write_text(json.dumps(meta))  # may hold NaN, as a buggy writer would
        read_everything(store, original)


@FUZZ
@given(cut=st.integers(0, 10**6), flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), max_size=3), rehash=st.booleans())
def test_damaged_shard_is_refused_or_read_correctly(source, cut: int, flips: list[tuple[int, int]], rehash: bool) -> None:
    path, original = source
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp)
        shutil.copytree(path, store / "data")
        shard = store / "data" / SHARD
        raw = bytearray(shard.read_bytes())
        raw = raw[: cut % (len(raw) + 1)] if cut % 3 == 0 else raw
        for position, mask in flips:
            if raw:
                raw[position % len(raw)] ^= mask
        shard.write_bytes(bytes(raw))
        if rehash:  # a consistent but damaged dataset: only the Arrow reader's checks remain
            meta = json.loads((store / "data" / "metadata.json").read_text())
            meta["files"][SHARD] = {"sha256": sha256_file(shard), "bytes": shard.stat().st_size}
            (store / "data" / "metadata.json").write_text(json.dumps(meta))
            with contextlib.suppress(RlpipeError):
                load_shards(open_dataset("data", store))
        else:
            read_everything(store, original)


@FUZZ
@given(data=st.data())
def test_mutated_checkpoint_is_refused_or_loads_the_same_policy(trained_run: Path, data: st.DataObject) -> None:
    from rlpipe.algos import load_policy

    meta = json.loads((trained_run / "checkpoint.json").read_text())
    reference = load_policy(trained_run)
    obs = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    for _ in range(data.draw(st.integers(1, 3))):
        meta = mutate(data, meta)
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        shutil.copytree(trained_run, run)
        (run / "checkpoint.json").write_text(json.dumps(meta))
        try:
            policy = load_policy(run)
        except RlpipeError as exc:
            assert "\n" not in str(exc)
            return
        np.testing.assert_array_equal(policy(obs), reference(obs))
        assert policy.env_id == reference.env_id
