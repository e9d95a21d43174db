"""Corrupt data is refused by every reader with the same one-line problem: the in-memory
loader, mapped reading, `datasets inspect` and `datasets validate` run one set of checks
(`rlpipe.datasets.checks`): nulls, row and episode counts, NaN/inf, actions inside the space,
chained next_obs for episodes datasets. Each case is a consistent dataset (sizes and hashes
re-recorded), so only these checks can catch it. Also: the HDF5 copy against the Arrow data,
and metadata JSON with NaN or Infinity."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import numpy as np
import pyarrow as pa
import pytest

from rlpipe.datasets.checks import RowChecks
from rlpipe.datasets.loader import load_dataset, read_shard
from rlpipe.datasets.mapped import MappedTransitions
from rlpipe.datasets.store import hash_files, open_dataset
from rlpipe.datasets.summary import summary_tables
from rlpipe.datasets.validate import validate_dataset
from rlpipe.datasets.writer import write_rows
from rlpipe.errors import RlpipeError
from rlpipe.storage.files import loads_json
from tests.test_dataset_store import BOX, synthetic_rows
from tests.test_store_safety import one_line_exit_2

ACT = gym.spaces.Discrete(2)
SHARD = "steps/shard-00000.arrow"


def write(store: Path, rows: dict | None = None, act: gym.Space = ACT, **options) -> Path:
    """Ten 30-step episodes (300 rows) named `data`."""
    rows = synthetic_rows([30] * 10, BOX, act) if rows is None else rows
    return write_rows("data", [rows], BOX, act, env_id=None, producer={}, store=store, fmt=options.pop("fmt", "arrow"), **options)


def rerecord(path: Path, table: pa.Table | None = None, **changes) -> None:
    """Replace the shard with `table` and update metadata with `changes`, re-recording every
    file's size and sha256 and the content hash: a consistent but wrong dataset."""
    if table is not None:
        with pa.OSFile(str(path / SHARD), "wb") as sink, pa.ipc.new_file(sink, table.schema) as ipc:
            ipc.write_table(table.combine_chunks())
    meta = json.loads((path / "metadata.json").read_text())
    meta.update(changes)
    meta["files"], meta["content_hash"] = hash_files(path, list(meta["files"]))
    (path / "metadata.json").write_text(json.dumps(meta))


def shard_table(path: Path) -> pa.Table:
    return pa.ipc.open_file(str(path / SHARD)).read_all()


def with_column(table: pa.Table, name: str, values: pa.Array) -> pa.Table:
    index = table.schema.get_field_index(name)
    return table.set_column(index, table.schema.field(name), values)


def nan_reward(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = synthetic_rows([30] * 10, BOX, ACT)
    rows["reward"][4] = np.nan
    monkeypatch.setenv("RLPIPE_ALLOW_NONFINITE", "1")  # written with the opt-in, read without it
    write(store, rows)
    monkeypatch.delenv("RLPIPE_ALLOW_NONFINITE")


def infinite_obs(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(store)
    table = shard_table(path)
    obs = table.column("obs").combine_chunks().flatten().to_numpy().copy()
    obs[7 * 3 + 1] = np.inf
    rerecord(path, with_column(table, "obs", pa.FixedSizeListArray.from_arrays(pa.array(obs), 3)))


def null_inside_obs(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(store)
    table = shard_table(path)
    values = table.column("obs").combine_chunks().flatten().to_pylist()
    values[10] = None  # a null list element: the schema allows it, the column must not hold it
    rerecord(path, with_column(table, "obs", pa.FixedSizeListArray.from_arrays(pa.array(values, pa.float32()), 3)))


def dropped_rows(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(store)
    rerecord(path, shard_table(path).slice(0, 270))  # the last episode removed


def total_steps_off_by_one(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rerecord(write(store), total_steps=301)


def total_episodes_off_by_one(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rerecord(write(store), total_episodes=11)


def action_outside_discrete(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = synthetic_rows([30] * 10, BOX, ACT)
    rows["action"][12] = 7
    write(store, rows)


def action_outside_multi_discrete(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    space = gym.spaces.MultiDiscrete([3, 2])
    rows = synthetic_rows([30] * 10, BOX, space)
    rows["action"][40] = [1, 2]
    write(store, rows, space)


def next_obs_not_chained(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = synthetic_rows([30] * 10, BOX, ACT)
    rows["next_obs"][5] = rows["next_obs"][5] + 0.5
    write(store, rows)


CASES: dict[str, tuple[Callable, str]] = {
    "nan reward": (nan_reward, "column 'reward' holds NaN or infinite values at row 4 (set RLPIPE_ALLOW_NONFINITE=1"),
    "infinite obs": (infinite_obs, "column 'obs' holds NaN or infinite values at row 7"),
    "null inside obs": (null_inside_obs, f"{SHARD} holds nulls in obs"),
    "dropped rows": (dropped_rows, "shards hold 270 rows, metadata says 300"),
    "total_steps off by one": (total_steps_off_by_one, "shards hold 300 rows, metadata says 301"),
    "total_episodes off by one": (total_episodes_off_by_one, "shards hold 10 episodes, metadata says 11"),
    "total_steps 10**400": (
        lambda store, _: rerecord(write(store), total_steps=10**400),
        "'total_steps' is missing or not a non-negative integer below 2**63",
    ),
    "action outside Discrete": (action_outside_discrete, "action 7 outside Discrete(2) at row 12"),
    "action outside MultiDiscrete": (action_outside_multi_discrete, "action [1, 2] outside MultiDiscrete([3 2]) at row 40"),
    "next_obs not chained": (next_obs_not_chained, "next_obs at row 5 differs from obs at row 6 in episode 0"),
}


def mapped(store: Path) -> None:
    MappedTransitions(open_dataset("data", store)).close()


READERS: dict[str, Callable[[Path], object]] = {
    "load": lambda store: load_dataset("data", store),
    "mapped": mapped,
    "inspect": lambda store: summary_tables(open_dataset("data", store)),
    "validate": lambda store: validate_dataset(open_dataset("data", store, check_files=False)) or None,
}


@pytest.mark.parametrize("case", CASES)
def test_every_reader_refuses_corrupt_rows_with_one_line(store: Path, cli, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    make, message = CASES[case]
    make(store, monkeypatch)
    for name, read in READERS.items():
        try:
            problems = read(store)
        except RlpipeError as exc:
            assert message in str(exc) and "\n" not in str(exc), (name, str(exc))
            continue
        assert problems and any(message in problem for problem in problems), (name, problems)
    one_line_exit_2(cli("datasets", "validate", "data", "--store", store), message)
    one_line_exit_2(cli("datasets", "inspect", "data", "--store", store), message)


def test_the_same_rows_are_accepted_where_they_are_legal(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Controls: NaN with the opt-in; unchained rows as a transitions dataset; Box actions
    outside their bounds (legal data: policies the env clips, exploration noise)."""
    nan_reward(store, monkeypatch)
    monkeypatch.setenv("RLPIPE_ALLOW_NONFINITE", "1")
    assert np.isnan(load_dataset("data", store).reward[4]) and validate_dataset(open_dataset("data", store)) == []
    monkeypatch.delenv("RLPIPE_ALLOW_NONFINITE")
    rows = synthetic_rows([30] * 10, BOX, ACT)
    rows["next_obs"][5] += 0.5
    write(store, rows, force=True, kind="transitions")
    assert validate_dataset(open_dataset("data", store)) == [] and len(load_dataset("data", store)) == 300
    rows = synthetic_rows([30] * 10, BOX, BOX)
    rows["action"][3] = [5.0, -9.0, 0.0]
    write(store, rows, BOX, force=True)
    assert validate_dataset(open_dataset("data", store)) == [] and load_dataset("data", store).action[3, 1] == -9.0


def test_shards_and_chunks_number_rows_through_the_dataset(store: Path) -> None:
    """The checks stream: shard by shard, and within a shard in chunks of whole episodes; the
    problems found (and their row numbers) do not depend on where the rows are cut."""
    rows = synthetic_rows([7, 1, 12] * 20, BOX, ACT)
    rows["action"][250] = -1
    rows["next_obs"][301] = 0.0
    rows["terminated"][350] = True  # inside episode 53 (rows 348-359)
    batches = [{key: value[first : first + 40] for key, value in rows.items()} for first in range(0, 400, 40)]  # 40 rows: 6 whole episodes
    write_rows("sharded", batches, BOX, ACT, env_id=None, producer={}, store=store, fmt="arrow", shard_bytes=4096)
    info = open_dataset("sharded", store)
    assert len(info.shard_rels) > 3
    problems = validate_dataset(info)
    assert "action -1 outside Discrete(2) at row 250" in problems
    assert any(p.startswith("next_obs at row 301 differs from obs at row 302") for p in problems)
    assert "episode 53 is terminated or truncated before its last row (step 2)" in problems
    with pytest.raises(RlpipeError, match="episode 53 is terminated or truncated before its last row") as in_ram:
        load_dataset("sharded", store)
    with pytest.raises(RlpipeError) as mapped_reading:
        MappedTransitions(info)
    assert str(mapped_reading.value) == str(in_ram.value)
    path = write_rows("single", [rows], BOX, ACT, env_id=None, producer={}, store=store, fmt="arrow")
    columns = read_shard(path / SHARD, BOX, ACT)
    whole, chunked = RowChecks(open_dataset("single", store)), RowChecks(open_dataset("single", store), chunk_rows=5)
    assert sorted(chunked.shard(columns)) == sorted(whole.shard(columns)) == sorted(problems)  # found in another order
    assert (chunked.rows, chunked.episodes, chunked.last_episode) == (whole.rows, whole.episodes, whole.last_episode) == (400, 60, 59)


def test_a_shard_checked_before_is_checked_again_when_metadata_changes(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading remembers a shard that passed the checks (beside its hash), so a repeated load
    does not repeat them; a metadata change they depend on (here the action space, which
    the content hash does not cover) makes them run again."""
    path = write(store, synthetic_rows([30] * 10, BOX, gym.spaces.Discrete(4)), gym.spaces.Discrete(4))
    load_dataset("data", store)
    cache = json.loads((store / ".verified" / "data.json").read_text())["entries"]
    assert cache[SHARD]["checked"]
    with monkeypatch.context() as patched:
        patched.setattr(RowChecks, "_chunk", lambda *args: pytest.fail("a remembered shard was checked again"))
        assert len(load_dataset("data", store)) == 300
        with pytest.raises(pytest.fail.Exception):  # the control: validate ignores the cache
            validate_dataset(open_dataset("data", store))
    meta = json.loads((path / "metadata.json").read_text())
    meta["action_space"] = meta["action_space"].replace('"n": 4', '"n": 2')
    (path / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(RlpipeError, match="outside Discrete\\(2\\)"):
        load_dataset("data", store)


def test_training_on_an_action_outside_the_space_is_one_line(store: Path, cli) -> None:
    cartpole = gym.make("CartPole-v1").observation_space
    rows = synthetic_rows([30] * 10, cartpole, ACT)
    rows["action"][12] = 7
    write_rows("data", [rows], cartpole, ACT, env_id="CartPole-v1", producer={}, store=store, fmt="arrow")
    result = cli("train", "bc", "--dataset", "data", "--store", store, "--out", store.parent / "run", "--no-progress")
    one_line_exit_2(result, "action 7 outside Discrete(2) at row 12")
    assert not (store.parent / "run").exists()


# --- the HDF5 copy ---------------------------------------------------------------------


def rewrite_hdf5(path: Path, edit: Callable) -> None:
    import h5py

    with h5py.File(path / "data" / "main_data.hdf5", "r+") as file:
        edit(file)
    rerecord(path)


def shorter_observations(file) -> None:
    observations = file["episode_1/observations"][()]
    del file["episode_1/observations"]
    file["episode_1/observations"] = observations[:-1]


HDF5_CASES = {
    "garbage": (
        lambda path: ((path / "data" / "main_data.hdf5").write_bytes(b"not hdf5" * 1000), rerecord(path)),
        "data/main_data.hdf5 is not a readable HDF5 file",
    ),
    "wrong shape": (
        lambda path: rewrite_hdf5(path, shorter_observations),
        "data/main_data.hdf5: episode_1/observations is float32[30, 3], the Arrow data gives float32[31, 3]",
    ),
    "other values": (
        lambda path: rewrite_hdf5(path, lambda file: file["episode_2/rewards"].__setitem__(3, 99.0)),
        "data/main_data.hdf5: episode_2/rewards differs from the Arrow data",
    ),
    "missing episode": (
        lambda path: rewrite_hdf5(path, lambda file: file.__delitem__("episode_9")),
        "data/main_data.hdf5: holds 9 objects, the dataset has 10 episodes",
    ),
    "broken metadata.json": (
        lambda path: ((path / "data" / "metadata.json").write_text("{"), rerecord(path)),
        "data/metadata.json: unreadable",
    ),
    "metadata.json with NaN": (
        lambda path: ((path / "data" / "metadata.json").write_text('{"total_steps": NaN}'), rerecord(path)),
        "data/metadata.json: unreadable (NaN is not standard JSON)",
    ),
    "broken metadata.json, not re-hashed": (
        lambda path: (path / "data" / "metadata.json").write_text("[" + (path / "data" / "metadata.json").read_text()[1:]),
        "data/metadata.json does not match its recorded size/sha256",
    ),
}


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("case", HDF5_CASES)
def test_hdf5_copy_that_differs_from_the_arrow_data_fails_validate_and_export(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli, case: str
) -> None:
    import minari

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    path = write(store, fmt="both")
    assert validate_dataset(open_dataset("data", store)) == []  # the control: the copy as written
    assert cli("datasets", "export", "data", "--id", "test/good-v0", "--store", store).code == 0
    assert minari.load_dataset("test/good-v0").total_steps == 300
    corrupt, message = HDF5_CASES[case]
    corrupt(path)
    one_line_exit_2(cli("datasets", "validate", "data", "--store", store), message)
    one_line_exit_2(cli("datasets", "export", "data", "--id", "test/bad-v0", "--store", store), message)
    assert not (tmp_path / "minari" / "test" / "bad-v0").exists()
    assert len(load_dataset("data", store)) == 300  # training reads the Arrow shards, which are intact


# --- JSON -----------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ['{"a": NaN}', '{"a": Infinity}', '{"a": -Infinity}', '{"a": 1e400}'])
def test_json_with_non_finite_numbers_is_refused_where_metadata_and_checkpoints_are_read(store: Path, tmp_path: Path, text: str) -> None:
    from rlpipe.nets.checkpoint import FORMAT_VERSION, read_meta

    with pytest.raises(ValueError):
        loads_json(text)
    assert loads_json('{"a": 1.5e300, "b": [1, null]}') == {"a": 1.5e300, "b": [1, None]}
    path = write(store)
    meta = (path / "metadata.json").read_text()
    (path / "metadata.json").write_text(meta.replace('"producer": {}', f'"producer": {text}'))
    with pytest.raises(RlpipeError, match="corrupted .*metadata.json"):
        open_dataset("data", store)
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint.json").write_text(f'{{"format": {FORMAT_VERSION}, "algo": "bc", "extra": {text}}}')
    with pytest.raises(RlpipeError, match="corrupted checkpoint metadata"):
        read_meta(run)
