"""`rlpipe datasets import PATH --from FORMAT`: each format round-trips a dataset's arrays
exactly, next observations missing from the file follow the documented convention, and every
inconsistency is one line, exit 2, with nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from rlpipe.datasets import imports
from rlpipe.datasets.d4rl import d4rl_arrays
from rlpipe.datasets.loader import TransitionArrays, load_dataset
from tests.conftest import store_contents
from tests.test_collector import collect_dataset

FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated", "episode_id", "step")


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TransitionArrays]:
    """Random-policy datasets: Pendulum (Box actions, episodes truncated at 200 steps) and
    CartPole (Discrete actions, episodes that terminate)."""
    store = tmp_path_factory.mktemp("sources")
    collect_dataset(store, "Pendulum-v1", "pendulum", fmt="arrow", episodes=3)
    collect_dataset(store, "CartPole-v1", "cartpole", fmt="arrow", episodes=6)
    return {name: load_dataset(name, store) for name in ("pendulum", "cartpole")}


def assert_same(data: TransitionArrays, back: TransitionArrays) -> None:
    for field in FIELDS:
        ours, theirs = np.asarray(getattr(data, field)), np.asarray(getattr(back, field))
        assert ours.shape == theirs.shape and np.array_equal(ours, theirs), field


def without_next_obs(data: TransitionArrays) -> dict[str, np.ndarray]:
    """What an import without next observations keeps: per episode, every row but a truncated
    last one (the row before it then ends the episode, truncated); a terminated last row keeps
    its own observation as next_obs."""
    out: dict[str, list] = {field: [] for field in FIELDS}
    number = 0
    for start, stop in zip(data.episode_starts(), [*data.episode_starts()[1:], len(data)]):
        rows = np.arange(start, stop)
        terminated = bool(data.terminated[stop - 1])
        kept = rows if terminated else rows[:-1]
        if len(kept) == 0:
            continue
        next_obs = np.asarray(data.obs)[np.minimum(kept + 1, stop - 1)]
        out["obs"].append(np.asarray(data.obs)[kept])
        out["action"].append(np.asarray(data.action)[kept])
        out["reward"].append(data.reward[kept])
        out["next_obs"].append(next_obs)
        done = np.zeros(len(kept), bool)
        done[-1] = True
        out["terminated"].append(done & terminated)
        out["truncated"].append(done & (not terminated))
        out["episode_id"].append(np.full(len(kept), number))
        out["step"].append(np.arange(len(kept)))
        number += 1
    return {field: np.concatenate(parts) for field, parts in out.items()}


def import_ok(cli, store: Path, path: Path, fmt: str, *args: str, name: str = "imported") -> TransitionArrays:
    result = cli("datasets", "import", path, "--from", fmt, "--name", name, "--store", store, *args)
    assert result.code == 0, result.err
    return load_dataset(name, store)


def import_fails(cli, store: Path, path: Path, fmt: str, *args: str) -> str:
    result = cli("datasets", "import", path, "--from", fmt, "--name", "imported", "--store", store, *args)
    assert result.code == 2, (result.out, result.err)
    assert len(result.err.strip().splitlines()) == 1, result.err
    assert store_contents(store) == [], "nothing is written"
    return result.err


def table(data: TransitionArrays, *, lists: bool = True, next_obs: bool = True) -> pa.Table:
    """A dataset as a table of transitions: list columns obs/next_obs, or scalar columns o0, o1, ..."""
    obs, next_o = np.asarray(data.obs), np.asarray(data.next_obs)
    columns: dict[str, pa.Array | np.ndarray] = {"episode_id": data.episode_id, "step": data.step}
    if lists:
        columns["obs"] = pa.FixedSizeListArray.from_arrays(pa.array(obs.reshape(-1)), obs.shape[1])
        if next_obs:
            columns["next_obs"] = pa.FixedSizeListArray.from_arrays(pa.array(next_o.reshape(-1)), obs.shape[1])
    else:
        columns.update({f"o{i}": obs[:, i] for i in range(obs.shape[1])})
        if next_obs:
            columns.update({f"n{i}": next_o[:, i] for i in range(obs.shape[1])})
    action = np.asarray(data.action)
    if action.ndim == 1 or not lists:
        columns["action"] = action.reshape(len(action))  # Pendulum's one-element actions as a scalar column
    else:
        columns["action"] = pa.FixedSizeListArray.from_arrays(pa.array(action.reshape(-1)), action.shape[1])
    columns.update(reward=data.reward, terminated=data.terminated, truncated=data.truncated)
    return pa.table(columns)


def test_parquet_round_trips_with_list_columns_and_infers_discrete(cli, store: Path, tmp_path: Path, sources) -> None:
    data = sources["cartpole"]
    pq.write_table(table(data), tmp_path / "cartpole.parquet", row_group_size=100)
    back = import_ok(cli, store, tmp_path / "cartpole.parquet", "parquet")
    assert_same(data, back)
    meta = json.loads((store / "imported" / "metadata.json").read_text())
    assert json.loads(meta["action_space"]) == {"type": "Discrete", "dtype": "int64", "n": 2, "start": 0}
    assert meta["env_id"] is None and "data" in {p.name for p in (store / "imported").iterdir()}  # --format both by default
    source = meta["producer"]["source"]
    assert source["format"] == "parquet" and source["file"] == "cartpole.parquet" and source["rows"] == len(data)
    assert source["sha256"] == __import__("hashlib").sha256((tmp_path / "cartpole.parquet").read_bytes()).hexdigest()
    assert source["columns"]["obs"] == ["obs"] and source["columns"]["episode"] == ["episode_id"]
    assert cli("datasets", "validate", "imported", "--store", store).code == 0


def test_parquet_streams_batches_and_episodes_across_them(cli, store: Path, tmp_path: Path, sources, monkeypatch) -> None:
    monkeypatch.setattr(imports, "BATCH_ROWS", 37)  # episodes span several batches
    data = sources["pendulum"]
    pq.write_table(table(data), tmp_path / "p.parquet", row_group_size=50)
    assert_same(data, import_ok(cli, store, tmp_path / "p.parquet", "parquet"))


def test_csv_with_scalar_columns_derives_next_obs(cli, store: Path, tmp_path: Path, sources) -> None:
    for name in ("pendulum", "cartpole"):
        data = sources[name]
        path = tmp_path / f"{name}.csv"
        pacsv.write_csv(table(data, lists=False, next_obs=False).drop_columns(["episode_id", "step"]), path)
        obs = ",".join(f"o{i}" for i in range(np.asarray(data.obs).shape[1]))
        back = import_ok(cli, store, path, "csv", "--obs-columns", obs, "--format", "arrow", name=name)
        expected = without_next_obs(data)
        for field in FIELDS:
            assert np.array_equal(np.asarray(getattr(back, field)), expected[field]), (name, field)
    # Pendulum's episodes are truncated: each lost its last row; CartPole's terminate: none did
    assert len(load_dataset("pendulum", store)) == len(sources["pendulum"]) - 3
    assert len(load_dataset("cartpole", store)) == len(sources["cartpole"])


def test_csv_with_next_obs_columns_round_trips(cli, store: Path, tmp_path: Path, sources) -> None:
    data = sources["pendulum"]
    pacsv.write_csv(table(data, lists=False), tmp_path / "p.csv")
    args = ("--obs-columns", "o0,o1,o2", "--next-obs-columns", "n0,n1,n2", "--action-space", "box:-2,2")
    back = import_ok(cli, store, tmp_path / "p.csv", "csv", *args)
    assert_same(data, back)
    meta = json.loads((store / "imported" / "metadata.json").read_text())
    assert json.loads(meta["action_space"])["low"] == [-2.0]


def test_arrow_ipc_round_trips(cli, store: Path, tmp_path: Path, sources) -> None:
    data = sources["cartpole"]
    with pa.OSFile(str(tmp_path / "c.arrow"), "wb") as sink, pa.ipc.new_file(sink, table(data).schema) as writer:
        for batch in table(data).to_batches(max_chunksize=64):
            writer.write_batch(batch)
    assert_same(data, import_ok(cli, store, tmp_path / "c.arrow", "arrow"))


def test_npz_with_d4rl_names_round_trips(cli, store: Path, tmp_path: Path, sources) -> None:
    data = sources["pendulum"]
    np.savez(tmp_path / "p.npz", **d4rl_arrays(data))
    assert_same(data, import_ok(cli, store, tmp_path / "p.npz", "npz", "--env", "Pendulum-v1"))
    meta = json.loads((store / "imported" / "metadata.json").read_text())
    assert meta["env_id"] == "Pendulum-v1" and json.loads(meta["action_space"])["high"] == [2.0]  # the env's spaces


def test_d4rl_hdf5_round_trips_and_without_next_observations_drops_timeouts(cli, store: Path, tmp_path: Path, sources) -> None:
    for name in ("pendulum", "cartpole"):
        data = sources[name]
        arrays = d4rl_arrays(data)
        with h5py.File(tmp_path / f"{name}.hdf5", "w") as f:  # D4RL's layout, infos/ and metadata/ groups included
            for key, values in arrays.items():
                f.create_dataset(key, data=values)
            f.create_dataset("infos/qpos", data=np.zeros((len(data), 2)))
            f.create_group("metadata").attrs["algorithm"] = "random"
        assert_same(data, import_ok(cli, store, tmp_path / f"{name}.hdf5", "d4rl", name=name))
        del arrays["next_observations"]
        with h5py.File(tmp_path / f"{name}-short.hdf5", "w") as f:
            for key, values in arrays.items():
                f.create_dataset(key, data=values)
        back = import_ok(cli, store, tmp_path / f"{name}-short.hdf5", "d4rl", name=f"{name}-short")
        expected = without_next_obs(data)
        for field in FIELDS:
            assert np.array_equal(np.asarray(getattr(back, field)), expected[field]), (name, field)


def test_d4rl_file_ending_mid_episode_ends_truncated(cli, store: Path, tmp_path: Path, sources) -> None:
    data = sources["pendulum"]
    arrays = {key: values[:250] for key, values in d4rl_arrays(data).items()}  # the second episode cut after 50 steps
    np.savez(tmp_path / "cut.npz", **arrays)
    back = import_ok(cli, store, tmp_path / "cut.npz", "npz")
    assert len(back) == 250 and back.truncated[-1] and back.truncated.sum() == 2 and back.episode_id[-1] == 1


def ogbench_raw(data: TransitionArrays) -> dict[str, np.ndarray]:
    """OGBench's stored layout: each trajectory's states, its final one a row of its own (a dummy action), terminals 1 there."""
    parts: dict[str, list] = {"observations": [], "actions": [], "terminals": []}
    obs, next_obs, action = np.asarray(data.obs), np.asarray(data.next_obs), np.asarray(data.action)
    for start, stop in zip(data.episode_starts(), [*data.episode_starts()[1:], len(data)]):
        parts["observations"] += [obs[start:stop], next_obs[stop - 1 : stop]]
        parts["actions"] += [action[start:stop], np.zeros_like(action[:1])]
        parts["terminals"] += [np.zeros(stop - start, np.float32), np.ones(1, np.float32)]
    return {key: np.concatenate(values) for key, values in parts.items()}


def test_ogbench_layouts_import_as_truncated_trajectories(cli, store: Path, tmp_path: Path, sources) -> None:
    data = sources["pendulum"]
    raw = ogbench_raw(data)
    compact = {**raw, "valids": 1.0 - raw["terminals"], "qpos": np.zeros((len(raw["terminals"]), 2))}
    regular = {**d4rl_arrays(data), "terminals": np.asarray(data.truncated, np.float32)}
    del regular["timeouts"]
    for layout, arrays in {"raw": raw, "compact": compact, "regular": regular}.items():
        np.savez(tmp_path / f"{layout}.npz", **arrays)
        back = import_ok(cli, store, tmp_path / f"{layout}.npz", "ogbench", "--format", "arrow", name=layout)
        for field in ("obs", "action", "next_obs", "episode_id", "step", "truncated"):
            assert np.array_equal(np.asarray(getattr(back, field)), np.asarray(getattr(data, field))), (layout, field)
        assert not back.terminated.any()
        assert np.array_equal(back.reward, data.reward if layout == "regular" else np.zeros(len(data), np.float32)), layout


def test_minari_stays_the_default(cli, store: Path) -> None:
    result = cli("datasets", "import", "test/nothing-v0", "--store", store)
    assert result.code == 2 and "Minari dataset 'test/nothing-v0'" in result.err
    assert "for files" in cli("datasets", "import", "test/nothing-v0", "--obs-column", "x", "--store", store).err


def replaced(frame: pa.Table, column: str, values) -> pa.Table:
    return frame.set_column(frame.schema.get_field_index(column), column, pa.array(values, frame.schema.field(column).type))


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("missing", "no reward column"),
        ("extra", "column 'note' is not mapped"),
        ("overlap", "row 400, column 'episode_id': episode 0 continues after other episodes' rows"),
        ("steps", "row 7, column 'step': step 9 follows step 6"),
        ("nan", "row 5, column 'obs': holds nan"),
        ("early_flag", "row 3, column 'terminated': is set before the last row of its episode"),
        ("flag_value", "row 2, column 'truncated': holds 2, not 0 or 1"),
        ("ragged_list", "row 11, column 'obs': holds 2 values where row 0 holds 3"),
        ("null", "row 4, column 'reward': is empty (null)"),
    ],
)
def test_table_inconsistencies_are_one_line(cli, store: Path, tmp_path: Path, sources, case: str, expected: str) -> None:
    data = sources["pendulum"]
    frame = table(data)
    if case == "missing":
        frame = frame.drop_columns(["reward"])
    elif case == "extra":
        frame = frame.append_column("note", pa.array(["x"] * len(data)))
    elif case == "overlap":
        frame = replaced(frame, "episode_id", np.r_[data.episode_id[:400], np.zeros(200, np.int64)])
    elif case == "steps":
        frame = replaced(frame, "step", np.where(np.arange(len(data)) == 7, 9, data.step))
    elif case == "nan":
        obs = np.asarray(data.obs).copy()
        obs[5, 1] = np.nan
        frame = frame.set_column(
            frame.schema.get_field_index("obs"), "obs", pa.FixedSizeListArray.from_arrays(pa.array(obs.reshape(-1)), 3)
        )
    elif case == "early_flag":
        frame = replaced(frame, "terminated", np.arange(len(data)) == 3)
    elif case == "flag_value":
        frame = frame.set_column(
            frame.schema.get_field_index("truncated"), "truncated", pa.array(np.where(np.arange(len(data)) == 2, 2, 0))
        )
    elif case == "ragged_list":
        obs = np.asarray(data.obs).tolist()
        obs[11] = obs[11][:2]
        frame = frame.set_column(frame.schema.get_field_index("obs"), "obs", pa.array(obs, pa.list_(pa.float32())))
    elif case == "null":
        frame = frame.set_column(
            frame.schema.get_field_index("reward"), "reward", pa.array([None if i == 4 else 0.0 for i in range(len(data))])
        )
    pq.write_table(frame, tmp_path / "bad.parquet")
    err = import_fails(cli, store, tmp_path / "bad.parquet", "parquet")
    assert f"error: bad.parquet: {expected}" in err, err


def test_array_and_option_errors_are_one_line(cli, store: Path, tmp_path: Path, sources, monkeypatch) -> None:
    arrays = d4rl_arrays(sources["cartpole"])
    np.savez(tmp_path / "ragged.npz", **{**arrays, "actions": arrays["actions"][:-1]})
    assert "ragged arrays: 'actions' has" in import_fails(cli, store, tmp_path / "ragged.npz", "npz")
    np.savez(tmp_path / "c.npz", **arrays)
    first_one = int(np.flatnonzero(arrays["actions"] == 1)[0])
    err = import_fails(cli, store, tmp_path / "c.npz", "npz", "--action-space", "discrete:1")
    assert f"row {first_one}, column 'actions': action 1 is outside Discrete(1)" in err
    assert "--action-space takes" in import_fails(cli, store, tmp_path / "c.npz", "npz", "--action-space", "box:1")
    assert "no such file" in import_fails(cli, store, tmp_path / "nothing.npz", "npz")
    assert "cannot read it as HDF5" in import_fails(cli, store, tmp_path / "ragged.npz", "d4rl")
    assert "unknown source format" in import_fails(cli, store, tmp_path / "c.npz", "xlsx")
    assert "do not fit the env's" in import_fails(cli, store, tmp_path / "c.npz", "npz", "--env", "Pendulum-v1")
    # A dtype change between CSV blocks: integer actions, then a float one
    monkeypatch.setattr(imports, "CSV_BLOCK_BYTES", 1 << 10)
    frame = table(sources["cartpole"], lists=False).to_pandas()
    frame["action"] = frame["action"].astype(object)
    frame.loc[len(frame) - 5, "action"] = 0.5
    frame.to_csv(tmp_path / "c.csv", index=False)
    err = import_fails(cli, store, tmp_path / "c.csv", "csv", "--obs-columns", "o0,o1,o2,o3", "--next-obs-columns", "n0,n1,n2,n3")
    assert "column 'action'" in err and "0.5" in err and "after row" in err


def test_named_columns_string_episode_ids_and_ignored_columns(cli, store: Path, tmp_path: Path, sources) -> None:
    data = sources["cartpole"]
    frame = table(data, lists=False).rename_columns(
        {"episode_id": "run", "step": "t", "action": "push", "reward": "r", "terminated": "fell", "truncated": "cut"}
    )
    frame = frame.set_column(0, "run", pa.array([f"run-{i:03d}" for i in data.episode_id])).append_column(
        "note", pa.array(["x"] * len(data))
    )
    pacsv.write_csv(frame, tmp_path / "log.csv")
    args = [
        *("--obs-columns", "o0,o1,o2,o3", "--next-obs-columns", "n0,n1,n2,n3", "--action-column", "push", "--reward-column", "r"),
        *("--terminated-column", "fell", "--truncated-column", "cut", "--episode-column", "run", "--step-column", "t"),
    ]
    assert "column 'note' is not mapped" in import_fails(cli, store, tmp_path / "log.csv", "csv", *args)
    assert_same(data, import_ok(cli, store, tmp_path / "log.csv", "csv", *args, "--ignore-columns", "note"))
