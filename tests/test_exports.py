"""`rlpipe datasets export NAME --to parquet|d4rl|npz|ogbench --out FILE`: an export imported back
(`rlpipe datasets import`) gives the same arrays, each format carries what its docs say, and
every refusal is one line, exit 2, with no file (or temporary file) left behind."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import gymnasium as gym
import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tests.image_env  # noqa: F401  (registers TinyFrames-v0)
from rlpipe.datasets import exports
from rlpipe.datasets.loader import TransitionArrays, load_dataset
from rlpipe.datasets.store import open_dataset
from rlpipe.datasets.writer import write_rows
from tests.test_collector import collect_dataset
from tests.test_dataset_store import synthetic_rows
from tests.test_imports import FIELDS

SUFFIX = {"parquet": "parquet", "d4rl": "hdf5", "npz": "npz", "ogbench": "npz"}
D4RL_KEYS = {"observations", "actions", "rewards", "next_observations", "terminals", "timeouts"}

if "ShortCartPole-v0" not in gym.registry:  # CartPole cut at 20 steps: episodes that terminate and episodes truncated
    gym.register("ShortCartPole-v0", entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv", max_episode_steps=20)


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store of random-policy datasets: pendulum (Box actions, truncations), cartpole
    (Discrete actions, terminations), mixed (12 episodes, both), frames (uint8 images) and
    goals (Dict observations)."""
    store = tmp_path_factory.mktemp("sources")
    for env_id, name, episodes in [
        ("Pendulum-v1", "pendulum", 3),
        ("CartPole-v1", "cartpole", 6),
        ("ShortCartPole-v0", "mixed", 12),
        ("TinyFrames-v0", "frames", 6),
        ("GoalWorld-v0", "goals", 2),
    ]:
        collect_dataset(store, env_id, name, fmt="arrow", episodes=episodes)
    mixed = load_dataset("mixed", store)
    assert mixed.terminated.any() and mixed.truncated.any() and not (mixed.terminated & mixed.truncated).any()
    return store


def export_ok(cli, store: Path, name: str, target: str, out: Path, *args: str) -> Path:
    result = cli("datasets", "export", name, "--to", target, "--out", out, "--store", store, *args)
    assert result.code == 0, result.err
    assert f"exported {name} -> {out} ({len(load_dataset(name, store))} transitions, {target})" in result.out
    return out


def fails(result, expected: str) -> None:
    assert result.code == 2, (result.out, result.err)
    assert len(result.err.strip().splitlines()) == 1 and expected in result.err, result.err


def digests(data: TransitionArrays) -> dict[str, str]:
    return {field: hashlib.sha256(np.ascontiguousarray(getattr(data, field)).tobytes()).hexdigest() for field in FIELDS}


@pytest.mark.parametrize("target", ["parquet", "d4rl", "npz", "ogbench"])
@pytest.mark.parametrize("name", ["pendulum", "cartpole", "mixed"])
def test_an_export_imports_back_to_the_same_arrays(cli, sources: Path, store: Path, tmp_path: Path, name: str, target: str) -> None:
    out = export_ok(cli, sources, name, target, tmp_path / f"{name}.{SUFFIX[target]}")
    imported = cli("datasets", "import", out, "--from", target, "--name", "back", "--format", "arrow", "--store", store)
    assert imported.code == 0, imported.err
    data, back = load_dataset(name, sources), load_dataset("back", store)
    for field in FIELDS:
        ours, theirs = np.asarray(getattr(data, field)), np.asarray(getattr(back, field))
        assert (ours.dtype, ours.shape) == (theirs.dtype, theirs.shape) and np.array_equal(ours, theirs), field
    assert digests(data) == digests(back)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([out.name, store.name])  # no temporary file is left beside it
    if target == "parquet":  # the recorded metadata gives the spaces and the env back (D4RL's arrays hold neither)
        ours, theirs = open_dataset(name, sources), open_dataset("back", store)
        assert (theirs.observation_space, theirs.action_space, theirs.env_id) == (ours.observation_space, ours.action_space, ours.env_id)


def test_parquet_holds_the_metadata_shapes_and_row_groups(cli, sources: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(exports, "ROW_GROUP_BYTES", 4096)  # several row groups per shard: streamed
    out = export_ok(cli, sources, "pendulum", "parquet", tmp_path / "p.parquet")
    parquet = pq.ParquetFile(out)
    schema = parquet.schema_arrow
    assert parquet.metadata.num_row_groups > 3
    assert schema.names == ["episode_id", "step", "obs", "action", "reward", "next_obs", "terminated", "truncated"]
    assert schema.field("obs").type == pa.list_(pa.float32(), 3) and schema.field("action").type == pa.list_(pa.float32(), 1)
    assert schema.field("obs").metadata == {b"shape": b"[3]"} and schema.field("action").metadata == {b"shape": b"[1]"}
    assert json.loads(schema.metadata[b"rlpipe.metadata"]) == json.loads((sources / "pendulum" / "metadata.json").read_text())
    cartpole = pq.read_schema(export_ok(cli, sources, "cartpole", "parquet", tmp_path / "c.parquet"))
    assert cartpole.field("action").type == pa.int64() and cartpole.field("action").metadata is None


def test_images_are_flat_lists_in_parquet_and_keep_their_shape_in_d4rl(cli, sources: Path, store: Path, tmp_path: Path) -> None:
    data = load_dataset("frames", sources)
    table = pq.read_table(export_ok(cli, sources, "frames", "parquet", tmp_path / "f.parquet"))
    assert table.schema.field("obs").type == pa.list_(pa.uint8(), 192)
    shape = json.loads(table.schema.field("obs").metadata[b"shape"])
    assert shape == [8, 8, 3]
    for column in ("obs", "next_obs"):
        values = table.column(column).combine_chunks().flatten().to_numpy().reshape(-1, *shape)
        assert np.array_equal(values, np.asarray(getattr(data, column))), column
    assert cli("datasets", "import", tmp_path / "f.parquet", "--from", "parquet", "--name", "flat", "--store", store).code == 0
    assert digests(load_dataset("flat", store)) == digests(data), "the recorded shape makes them images again"
    with h5py.File(export_ok(cli, sources, "frames", "d4rl", tmp_path / "f.hdf5")) as f:
        assert f["observations"].dtype == np.uint8 and f["observations"].shape == (len(data), 8, 8, 3)
    assert cli("datasets", "import", tmp_path / "f.hdf5", "--from", "d4rl", "--name", "back", "--store", store).code == 0
    assert digests(load_dataset("back", store)) == digests(data)


def test_d4rl_and_npz_hold_d4rl_arrays_floats_as_float32(cli, sources: Path, tmp_path: Path) -> None:
    for name in ("pendulum", "cartpole"):
        with h5py.File(export_ok(cli, sources, name, "d4rl", tmp_path / f"{name}.hdf5")) as f:
            hdf5 = {key: f[key][()] for key in f}
        with np.load(export_ok(cli, sources, name, "npz", tmp_path / f"{name}.npz")) as npz:
            arrays = {key: npz[key] for key in npz.files}
        assert set(hdf5) == set(arrays) == D4RL_KEYS
        for key in D4RL_KEYS:
            assert hdf5[key].dtype == arrays[key].dtype and np.array_equal(hdf5[key], arrays[key]), (name, key)
        assert {key: str(arrays[key].dtype) for key in ("observations", "rewards", "next_observations", "terminals", "timeouts")} == {
            "observations": "float32",
            "rewards": "float32",
            "next_observations": "float32",
            "terminals": "bool",
            "timeouts": "bool",
        }
        assert arrays["actions"].dtype == (np.float32 if name == "pendulum" else np.int64)  # Discrete actions stay integers


def test_a_step_both_terminated_and_truncated_comes_back_terminated_only_from_d4rl(cli, sources: Path, store: Path, tmp_path: Path) -> None:
    data = load_dataset("cartpole", sources)
    end = int(data.episode_starts()[1]) - 1  # the first episode's last row, terminated
    table = pq.read_table(export_ok(cli, sources, "cartpole", "parquet", tmp_path / "c.parquet"))
    flags = np.asarray(data.truncated).copy()
    flags[end] = True
    pq.write_table(table.set_column(table.schema.get_field_index("truncated"), "truncated", pa.array(flags)), tmp_path / "both.parquet")
    assert cli("datasets", "import", tmp_path / "both.parquet", "--from", "parquet", "--name", "both", "--store", store).code == 0
    export_ok(cli, store, "both", "d4rl", tmp_path / "both.hdf5")
    assert cli("datasets", "import", tmp_path / "both.hdf5", "--from", "d4rl", "--name", "back", "--store", store).code == 0
    both, back = load_dataset("both", store), load_dataset("back", store)
    assert both.truncated[end] and both.terminated[end] and not back.truncated[end] and back.terminated[end]
    assert digests(back) == digests(data)


@pytest.mark.parametrize("name", ["cartpole", "frames"])
def test_ogbench_holds_each_episode_then_its_final_state(cli, sources: Path, store: Path, tmp_path: Path, name: str) -> None:
    """OGBench's layout: an episode's observations, then its last next_obs as a row of its own
    (terminals 1.0 there, the last action repeated); rewards and terminations for rlpipe's import."""
    data = load_dataset(name, sources)
    with np.load(export_ok(cli, sources, name, "ogbench", tmp_path / f"{name}.npz")) as npz:
        arrays = {key: npz[key] for key in npz.files}
    assert set(arrays) == {"observations", "actions", "terminals", "rewards", "terminations"}
    starts = data.episode_starts()
    lasts = np.r_[starts[1:], len(data)] - 1
    finals = lasts + np.arange(1, len(lasts) + 1)  # each episode's final-state row in the file
    rows = np.setdiff1d(np.arange(len(data) + len(lasts)), finals)
    obs, action = np.asarray(data.obs), np.asarray(data.action)
    assert np.array_equal(arrays["observations"][rows], obs)
    assert np.array_equal(arrays["observations"][finals], np.asarray(data.next_obs)[lasts])
    assert np.array_equal(arrays["actions"][rows], action) and np.array_equal(arrays["actions"][finals], action[lasts])
    assert arrays["terminals"].dtype == np.float32 and np.flatnonzero(arrays["terminals"]).tolist() == finals.tolist()
    assert np.array_equal(arrays["terminations"][rows], data.terminated) and not arrays["terminations"][finals].any()
    assert np.array_equal(arrays["rewards"][rows], data.reward) and not arrays["rewards"][finals].any()
    assert arrays["observations"].dtype == obs.dtype and arrays["actions"].dtype == action.dtype  # uint8 images, int64 Discrete actions
    assert cli("datasets", "import", tmp_path / f"{name}.npz", "--from", "ogbench", "--name", "back", "--store", store).code == 0
    assert digests(load_dataset("back", store)) == digests(data)


def test_ogbench_streams_shards_and_refuses_what_its_layout_cannot_hold(cli, sources: Path, store: Path, tmp_path: Path) -> None:
    """Episodes over many small shards come back whole; Dict or Discrete observations and a
    transitions dataset (rows that need not chain) are one line each, and nothing is written."""
    data, info = load_dataset("mixed", sources), open_dataset("mixed", sources)
    columns = {field: np.asarray(getattr(data, field)) for field in FIELDS}
    episodes = [{field: values[data.episode_id == i] for field, values in columns.items()} for i in np.unique(data.episode_id)]
    spaces = (info.observation_space, info.action_space)
    write_rows("sharded", episodes, *spaces, env_id=info.env_id, producer={}, store=store, fmt="arrow", shard_bytes=500)
    assert len(open_dataset("sharded", store).shard_paths) > 3
    out = export_ok(cli, store, "sharded", "ogbench", tmp_path / "sharded.npz")
    assert cli("datasets", "import", out, "--from", "ogbench", "--name", "back", "--store", store).code == 0
    assert digests(load_dataset("back", store)) == digests(data)
    write_rows("relabelled", episodes, *spaces, env_id=info.env_id, producer={}, store=store, fmt="arrow", kind="transitions")
    bad = tmp_path / "bad"
    bad.mkdir()
    result = cli("datasets", "export", "relabelled", "--to", "ogbench", "--out", bad / "r.npz", "--store", store)
    fails(result, "dataset 'relabelled' holds transitions, not whole episodes: OGBench's layout stores episodes")
    result = cli("datasets", "export", "goals", "--to", "ogbench", "--out", bad / "g.npz", "--store", sources)
    fails(result, "has Dict observations: OGBench's layout holds arrays (export it --to parquet)")
    states, actions = gym.spaces.Discrete(5), gym.spaces.Discrete(2)
    write_rows("cells", [synthetic_rows([3, 4], states, actions)], states, actions, env_id=None, producer={}, store=store, fmt="arrow")
    result = cli("datasets", "export", "cells", "--to", "ogbench", "--out", bad / "c.npz", "--store", store)
    fails(result, "has observations Discrete(5): OGBench's layout holds Box observations (states or images)")
    assert list(bad.iterdir()) == []


def test_dict_observations_export_to_parquet_only(cli, sources: Path, tmp_path: Path) -> None:
    data = load_dataset("goals", sources)
    table = pq.read_table(export_ok(cli, sources, "goals", "parquet", tmp_path / "g.parquet"))
    assert pa.types.is_struct(table.schema.field("obs").type)
    assert json.loads(table.schema.field("obs").metadata[b"shape"]) == {key: list(value.shape[1:]) for key, value in data.obs.items()}
    for key, values in data.obs.items():
        column = table.column("obs").combine_chunks().field(key)
        assert np.array_equal(column.flatten().to_numpy().reshape(values.shape), values), key
    result = cli("datasets", "export", "goals", "--to", "d4rl", "--out", tmp_path / "g.hdf5", "--store", sources)
    fails(result, "has Dict observations: D4RL's layout holds arrays (export it --to parquet)")
    assert not (tmp_path / "g.hdf5").exists()


def test_refusals_are_one_line_and_write_nothing(cli, sources: Path, store: Path, tmp_path: Path) -> None:
    def export(*args: object, where: Path = sources):
        return cli("datasets", "export", *args, "--store", where)

    out = tmp_path / "out"
    out.mkdir()
    fails(
        export("cartpole", "--to", "xlsx", "--out", out / "c.xlsx"),
        "unknown export target 'xlsx': choose one of minari, parquet, d4rl, npz",
    )
    fails(export("cartpole", "--to", "parquet"), "--to parquet writes a file: give --out FILE")
    fails(export("cartpole", "--to", "minari", "--out", out / "c"), "--out is for the file targets")
    fails(export("cartpole", "--to", "npz", "--out", out / "c.npz", "--id", "a/b-v0"), "--id names a Minari dataset")
    fails(export("nothing", "--to", "npz", "--out", out / "c.npz"), "nothing")
    fails(export("cartpole", "--to", "npz", "--out", out / "missing" / "c.npz"), "does not exist")
    assert list(out.iterdir()) == []
    (out / "c.npz").write_text("keep")
    fails(export("cartpole", "--to", "npz", "--out", out / "c.npz"), "exists (use --force to replace it)")
    assert (out / "c.npz").read_text() == "keep"
    assert export("cartpole", "--to", "npz", "--out", out / "c.npz", "--force").code == 0
    assert np.load(out / "c.npz")["observations"].shape == (len(load_dataset("cartpole", sources)), 4)
    # A shard damaged after the dataset was written: found while exporting, the file is never published
    collect_dataset(store, "CartPole-v1", "damaged", fmt="arrow", episodes=1)
    shard = open_dataset("damaged", store).shard_paths[0]
    damaged = bytearray(shard.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    shard.write_bytes(bytes(damaged))
    for target in ("parquet", "d4rl", "npz"):
        fails(export("damaged", "--to", target, "--out", out / f"d.{target}", where=store), "corrupted shard")
    assert sorted(p.name for p in out.iterdir()) == ["c.npz"]


def test_hugging_face_datasets_reads_the_parquet(cli, sources: Path, tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    if not hasattr(datasets, "Dataset"):  # the pipeline's datasets/ folder, found as a namespace package
        pytest.skip("Hugging Face datasets is not installed (bench/format_readers.py checks it in its own virtualenv)")
    data = load_dataset("pendulum", sources)
    out = export_ok(cli, sources, "pendulum", "parquet", tmp_path / "p.parquet")
    loaded = datasets.Dataset.from_parquet(str(out), cache_dir=str(tmp_path / "cache")).with_format("numpy")
    assert loaded.num_rows == len(data)
    for field in FIELDS:
        assert np.array_equal(np.asarray(loaded[field]), np.asarray(getattr(data, field))), field


def test_a_damaged_recorded_layout_is_one_line(cli, sources: Path, store: Path, tmp_path: Path) -> None:
    """The metadata and shapes an export recorded are read as carefully as the rows: JSON that
    is not an object, a space that is not one, a shape that does not hold the row's values."""
    table = pq.read_table(export_ok(cli, sources, "pendulum", "parquet", tmp_path / "p.parquet"))
    recorded = json.loads(table.schema.metadata[b"rlpipe.metadata"])
    cases = {
        "not JSON": (b"{", None),
        "not a JSON object": (b"[1]", None),
        "malformed space description": (json.dumps({**recorded, "observation_space": 7}).encode(), None),
        "recorded shape": (table.schema.metadata[b"rlpipe.metadata"], b"[2, 2]"),
    }
    for expected, (metadata, shape) in cases.items():
        schema = table.schema.with_metadata({b"rlpipe.metadata": metadata})
        if shape is not None:
            index = schema.get_field_index("obs")
            schema = schema.set(index, schema.field(index).with_metadata({b"shape": shape}))
        pq.write_table(table.cast(schema), tmp_path / "bad.parquet")
        result = cli("datasets", "import", tmp_path / "bad.parquet", "--from", "parquet", "--name", "bad", "--store", store)
        fails(result, expected)
        assert not (store / "bad").exists()
