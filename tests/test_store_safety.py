"""Crashes, races and bad input around the store: verified loading, locks, atomic replace
with recovery, stale work files, signals, bad paths and bad metadata."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pyarrow as pa
import pytest

from rlpipe.datasets.loader import load_dataset
from rlpipe.datasets.store import list_datasets, open_dataset, store_entries
from rlpipe.datasets.validate import validate_dataset
from rlpipe.datasets.writer import DatasetWriter, write_rows
from rlpipe.errors import RlpipeError
from rlpipe.storage.atomic import FAULT_ENV, FAULT_EXIT_CODE, _journal_text, delete_directory, json_text, tree_digest
from rlpipe.storage.files import sha256_file, user_key
from tests.conftest import store_contents
from tests.test_dataset_store import BOX, synthetic_rows

ACT = gym.spaces.Discrete(2)
RLPIPE = str(Path(sys.executable).with_name("rlpipe"))


def write(store: Path, name: str = "data", lengths: tuple[int, ...] = (30,) * 10, **options) -> Path:
    rows = synthetic_rows(list(lengths), BOX, ACT)
    return write_rows(name, [rows], BOX, ACT, env_id=None, producer={}, store=store, fmt="arrow", **options)


def one_line_exit_2(result, message: str) -> None:
    assert result.code == 2, (result.out, result.err)
    assert message in result.err, result.err
    assert len(result.err.strip().splitlines()) == 1, result.err


def rewrite_shard(path: Path, table: pa.Table) -> None:
    """Replace a shard and re-record its size and hash, as a consistent but wrong dataset would."""
    shard = path / "steps" / "shard-00000.arrow"
    with pa.OSFile(str(shard), "wb") as sink, pa.ipc.new_file(sink, table.schema) as ipc:
        ipc.write_table(table)
    meta = json.loads((path / "metadata.json").read_text())
    meta["files"]["steps/shard-00000.arrow"] = {"sha256": sha256_file(shard), "bytes": shard.stat().st_size}
    (path / "metadata.json").write_text(json.dumps(meta))


def read_table(path: Path) -> pa.Table:
    return pa.ipc.open_file(str(path / "steps" / "shard-00000.arrow")).read_all()


# --- 1. loading verifies what it reads -------------------------------------------------


def test_same_size_bit_flip_is_refused_even_after_a_cached_check(store: Path) -> None:
    path = write(store)
    load_dataset("data", store)  # verified and cached
    shard = path / "steps" / "shard-00000.arrow"
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    stat = shard.stat()
    shard.write_bytes(bytes(raw))
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size, same mtime: only ctime/hash tell
    with pytest.raises(RlpipeError, match="sha256 differs"):
        load_dataset("data", store)


def test_bit_flip_fails_train_with_one_line(store: Path, cli) -> None:
    assert cli("collect", "--env", "CartPole-v1", "--episodes", "20", "--store", store, "--quiet").code == 0
    shard = store / "cartpole-random" / "steps" / "shard-00000.arrow"
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    shard.write_bytes(bytes(raw))
    result = cli("train", "bc", "--dataset", "cartpole-random", "--store", store, "--out", store.parent / "run", "--no-progress")
    one_line_exit_2(result, "sha256 differs")
    one_line_exit_2(cli("datasets", "inspect", "cartpole-random", "--store", store), "sha256 differs")
    assert not (store.parent / "run").exists()


def test_stray_shard_is_refused_everywhere(store: Path, cli) -> None:
    path = write(store)
    (path / "steps" / "shard-00001.arrow").write_bytes((path / "steps" / "shard-00000.arrow").read_bytes())
    with pytest.raises(RlpipeError, match="stray file steps/shard-00001.arrow"):
        load_dataset("data", store)
    one_line_exit_2(cli("datasets", "inspect", "data", "--store", store), "stray file")
    one_line_exit_2(cli("datasets", "validate", "data", "--store", store), "stray file")
    listed = cli("datasets", "list", "--store", store)
    assert listed.code == 0 and "broken" in listed.out and "stray" in listed.out
    assert list_datasets(store) == []


def test_float64_observations_are_refused_at_load(store: Path) -> None:
    path = write(store)
    table = read_table(path)
    obs = table.column("obs").combine_chunks()
    wide = pa.FixedSizeListArray.from_arrays(obs.flatten().cast(pa.float64()), 3)
    fields = [pa.field("obs", wide.type, nullable=False) if f.name == "obs" else f for f in table.schema]
    rewrite_shard(
        path, pa.Table.from_arrays([wide if n == "obs" else table.column(n) for n in table.column_names], schema=pa.schema(fields))
    )
    with pytest.raises(RlpipeError, match="column 'obs' is fixed_size_list<item: double>"):
        load_dataset("data", store)


def test_null_rewards_are_refused_at_load(store: Path) -> None:
    path = write(store)
    table = read_table(path)
    rewards = table.column("reward").to_pylist()
    rewards[3] = None
    index = table.column_names.index("reward")
    table = table.set_column(index, pa.field("reward", pa.float32()), pa.array(rewards, pa.float32()))
    rewrite_shard(path, table)
    with pytest.raises(RlpipeError, match="'reward' is float.*nullable"):
        load_dataset("data", store)


def test_shard_of_another_dataset_is_refused_at_train(store: Path, cli) -> None:
    path = write(store)
    write_rows(
        "goal",
        [synthetic_rows([5, 5], gym.spaces.Dict({"a": BOX}), ACT)],
        gym.spaces.Dict({"a": BOX}),
        ACT,
        env_id=None,
        producer={},
        store=store,
        fmt="arrow",
    )
    rewrite_shard(path, read_table(store / "goal"))
    with pytest.raises(RlpipeError, match="does not match the dataset's schema"):
        load_dataset("data", store)


def test_non_finite_values_are_refused_unless_opted_in(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = synthetic_rows([5, 5], BOX, ACT)
    rows["reward"][2] = np.nan
    with pytest.raises(RlpipeError, match="'reward' holds NaN"):
        write_rows("nan", [rows], BOX, ACT, env_id=None, producer={}, store=store, fmt="arrow")
    assert store_contents(store) == []
    monkeypatch.setenv("RLPIPE_ALLOW_NONFINITE", "1")
    path = write_rows("nan", [rows], BOX, ACT, env_id=None, producer={}, store=store, fmt="arrow")
    meta = json.loads((path / "metadata.json").read_text())  # standard JSON: NaN statistics are null
    assert meta["episode_return"]["mean"] is None and meta["episode_length"]["mean"] == 5.0
    assert np.isnan(load_dataset("nan", store).reward[2])
    monkeypatch.delenv("RLPIPE_ALLOW_NONFINITE")
    with pytest.raises(RlpipeError, match="'reward' holds NaN or infinite values .*RLPIPE_ALLOW_NONFINITE"):
        load_dataset("nan", store)


def test_json_is_never_written_with_nan() -> None:
    with pytest.raises(RlpipeError, match="NaN or infinity in eval_return_mean"):
        json_text({"eval_return_mean": float("nan"), "seed": 0})
    assert json.loads(json_text({"a": [1.5, None]})) == {"a": [1.5, None]}


def test_wrong_row_count_is_refused(store: Path) -> None:
    path = write(store)
    meta = json.loads((path / "metadata.json").read_text())
    meta["total_steps"] += 1
    (path / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(RlpipeError, match="shards hold 300 rows, metadata says 301"):
        load_dataset("data", store)


# --- 2. a lock per dataset name ----------------------------------------------------------

HOLD_WRITER = """
import sys, time, gymnasium as gym, numpy as np
from rlpipe.datasets.writer import DatasetWriter
box = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
with DatasetWriter(sys.argv[1], box, gym.spaces.Discrete(2), env_id=None, store=sys.argv[2], force=True) as writer:
    print("ready", flush=True)
    time.sleep(60)
"""


def hold_writer(store: Path, name: str) -> subprocess.Popen:
    """A second process with a live writer for `name` (killed by the caller)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD_WRITER, name, str(store)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_second_writer_of_a_name_gets_exit_2(store: Path) -> None:
    holder = hold_writer(store, "same")
    try:
        second = subprocess.run(
            [RLPIPE, "collect", "--env", "CartPole-v1", "--episodes", "2", "--name", "same", "--store", str(store), "--quiet", "--force"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 2, second.stderr
        assert "is being written by another process (pid" in second.stderr and len(second.stderr.strip().splitlines()) == 1
        # names differing only in case share the lock, and another name is free
        with pytest.raises(RlpipeError, match="being written by another process"):
            DatasetWriter("SAME", BOX, ACT, env_id=None, store=store)
        write(store, "other")
        assert any(p.name.startswith(".tmp-") and p.name.endswith("-same") for p in store.iterdir())  # a live writer's work is kept
    finally:
        holder.kill()
        holder.wait()
    write(store, "third")  # the dead holder's work directory is cleaned now
    assert store_contents(store) == ["other", "third"]


# --- 3. --force replace survives a crash at every step -------------------------------------

REPLACE = """
import sys, gymnasium as gym, numpy as np
from rlpipe.datasets.writer import write_rows
box, n = gym.spaces.Box(-1.0, 1.0, (3,), np.float32), 20
rows = {"episode_id": np.repeat(np.arange(5), 4), "step": np.tile(np.arange(4, dtype=np.int32), 5),
        "obs": np.zeros((n, 3), np.float32), "action": np.zeros(n, np.int64), "reward": np.ones(n, np.float32),
        "next_obs": np.zeros((n, 3), np.float32), "terminated": np.tile([False, False, False, True], 5),
        "truncated": np.zeros(n, bool)}
write_rows("data", [rows], box, gym.spaces.Discrete(2), env_id=None, producer={}, store=sys.argv[1], fmt="arrow", force=True)
"""


@pytest.mark.parametrize(("step", "survivor"), [("synced", 300), ("old-moved", 300), ("new-moved", 20), ("trash-deleted", 20)])
def test_replace_killed_at_each_step_leaves_old_or_new(store: Path, step: str, survivor: int) -> None:
    write(store)  # the old dataset: 300 steps; the new one has 20
    env = {**os.environ, FAULT_ENV: step}
    proc = subprocess.run([sys.executable, "-c", REPLACE, str(store)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == FAULT_EXIT_CODE, proc.stderr
    info = open_dataset("data", store)  # recovers: finishes or rolls back
    assert info.metadata["total_steps"] == survivor
    assert validate_dataset(info) == [] and len(load_dataset("data", store)) == survivor
    assert store_contents(store) == ["data"]


SPLIT_STEPS = ["group-synced", "group-committed", "group-first-moved", "group-moved", "group-trash-deleted"]


def split_sides(store: Path, first: str) -> dict[str, int | None]:
    """What a reader of each side sees after a killed split (opening `first` first): its
    step count, None when it is absent."""
    seen: dict[str, int | None] = {}
    for name in ("data-train", "data-val") if first == "train" else ("data-val", "data-train"):
        try:
            seen[name] = open_dataset(name, store).metadata["total_steps"]  # recovers first
        except RlpipeError as exc:
            assert "not found" in str(exc)
            seen[name] = None
    return seen


@pytest.mark.parametrize("first", ["train", "val"])
@pytest.mark.parametrize("force", [False, True])
@pytest.mark.parametrize("step", SPLIT_STEPS)
def test_split_killed_at_each_step_leaves_both_sides_or_neither(store: Path, step: str, force: bool, first: str) -> None:
    write(store)  # 10 episodes of 30 steps: the new sides hold 240 and 60 steps
    old = {"data-train": None, "data-val": None}
    if force:  # old sides of 20 steps each, replaced
        for name in old:
            old[name] = write(store, name, lengths=(5,) * 4) and 20
    args = [RLPIPE, "datasets", "split", "data", "--val", "0.25", "--store", str(store), *(["--force"] if force else [])]
    proc = subprocess.run(args, env={**os.environ, FAULT_ENV: step}, capture_output=True, text=True, timeout=120)
    assert proc.returncode == FAULT_EXIT_CODE, proc.stderr
    new = {"data-train": 240, "data-val": 60}
    assert split_sides(store, first) == (old if step == "group-synced" else new)
    store_entries(store)  # a listing recovers what is left of every name
    assert store_contents(store) == ["data", "data-train", "data-val"] if force or step != "group-synced" else ["data"]
    for name in ("data-train", "data-val"):
        if (store / name).exists():
            assert validate_dataset(open_dataset(name, store)) == []


SIGKILL_SPLIT = """
import os, signal, sys
from rlpipe.storage import atomic
from rlpipe.cli.main import main
real, at = atomic.fault_point, sys.argv[2]
def kill(step):
    if step == at:
        os.kill(os.getpid(), signal.SIGKILL)
    real(step)
atomic.fault_point = kill
sys.argv = ["rlpipe", "datasets", "split", "data", "--val", "0.25", "--store", sys.argv[1]]
main()
"""


@pytest.mark.parametrize("step", ["group-synced", "group-first-moved"])
def test_split_sigkilled_between_the_sides_leaves_both_or_neither(store: Path, cli, step: str) -> None:
    write(store)
    proc = subprocess.run([sys.executable, "-c", SIGKILL_SPLIT, str(store), step], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    if step == "group-first-moved":  # killed with only the training side renamed into place
        assert (store / "data-train").is_dir() and not (store / "data-val").exists()
    listed = cli("datasets", "list", "--store", store)  # the first reader finishes or rolls back the whole split
    assert listed.code == 0, listed.err
    assert store_contents(store) == (["data", "data-train", "data-val"] if step == "group-first-moved" else ["data"])
    assert ("data-val" in listed.out) == ("data-train" in listed.out) == (step == "group-first-moved")


@pytest.mark.parametrize("signature", ["none", "another key"])
def test_a_planted_journal_never_replaces_a_dataset(store: Path, cli, signature: str) -> None:
    """A `.group-*` journal and a `.tmp-*-cp` directory holding other data, planted beside
    dataset `cp` by anyone who can write the store: a read command leaves `cp` as it was and
    deletes the planted leftovers (a journal the user's key did not sign is not rlpipe's)."""
    write(store, "cp")
    write(store, "other", lengths=(7,) * 3)
    before = open_dataset("cp", store).metadata["total_steps"]
    planted = store / ".tmp-0badc0de-cp"
    shutil.copytree(store / "other", planted)
    members = [{"name": "cp", "temp": planted.name, "digest": tree_digest(planted)}]
    mac = None
    if signature == "another key":
        message = f"{os.path.realpath(store)}\n{json.dumps(members, sort_keys=True)}".encode()
        mac = hmac.new(b"\x01" * 32, message, hashlib.sha256).hexdigest()
    (store / ".group-0badc0de").write_text(json.dumps({"members": members, "mac": mac}))
    inspected = cli("datasets", "inspect", "cp", "--store", store)
    assert inspected.code == 0, inspected.err
    assert open_dataset("cp", store).metadata["total_steps"] == before == 300
    store_entries(store)
    assert store_contents(store) == ["cp", "other"]


def test_a_journal_whose_data_changed_after_the_commit_is_not_rolled_forward(store: Path) -> None:
    """A split killed just after its commit, then one file of a staged side changed: the
    journal's digest no longer matches, so the sides are not published (the control, the same
    kill untouched, publishes both: test_split_killed_at_each_step_leaves_both_sides_or_neither)."""
    write(store)
    args = [RLPIPE, "datasets", "split", "data", "--val", "0.25", "--store", str(store)]
    proc = subprocess.run(args, env={**os.environ, FAULT_ENV: "group-committed"}, capture_output=True, text=True, timeout=120)
    assert proc.returncode == FAULT_EXIT_CODE, proc.stderr
    staged = next(store.glob(".tmp-*-data-val"))
    with open(staged / "metadata.json", "a") as f:
        f.write(" ")
    store_entries(store)
    assert store_contents(store) == ["data"]


def test_a_kept_journal_planted_again_never_rolls_a_dataset_back(store: Path, tmp_path: Path, cli) -> None:
    """A journal rlpipe signed, and its staged side, kept by someone who can write the store
    and planted again after the name was published anew: the journal records the entry it
    replaces, finds another one there, and a read leaves the newer dataset as it is (the
    control: planted while that entry is still there, the same journal is rolled forward)."""
    write(store, "cp")
    write(tmp_path / "elsewhere", "cp", lengths=(7,) * 3)
    staged, journal = store / ".tmp-0000abcd-cp", store / ".group-0000abcd"
    shutil.copytree(tmp_path / "elsewhere" / "cp", staged)
    journal.write_text(_journal_text(store, [("cp", staged.name)], user_key()))
    kept = tmp_path / "kept"
    shutil.copytree(staged, kept / staged.name)
    shutil.copy(journal, kept / journal.name)
    assert cli("datasets", "inspect", "cp", "--store", store).code == 0  # the control: rolled forward
    assert open_dataset("cp", store).metadata["total_steps"] == 21
    write(store, "cp", lengths=(5,) * 4, force=True)  # the user's newer version
    shutil.copytree(kept / staged.name, staged)
    shutil.copy(kept / journal.name, journal)
    assert cli("datasets", "inspect", "cp", "--store", store).code == 0
    assert open_dataset("cp", store).metadata["total_steps"] == 20
    store_entries(store)
    assert store_contents(store) == ["cp"]


def test_remove_is_locked_and_leaves_nothing(store: Path, cli) -> None:
    write(store)
    holder = hold_writer(store, "data")
    try:
        one_line_exit_2(cli("datasets", "rm", "data", "--store", store), "being written by another process")
    finally:
        holder.kill()
        holder.wait()
    assert cli("datasets", "rm", "data", "--store", store).code == 0
    assert store_contents(store) == []


# --- 4. stale work files, signals --------------------------------------------------------


def test_killed_writer_leftovers_are_cleaned_by_the_next_writer(store: Path) -> None:
    holder = hold_writer(store, "a")
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert [p for p in store_contents(store) if p.startswith(".tmp-")]
    write(store, "b")
    assert store_contents(store) == ["b"]


def test_a_trash_killed_while_being_deleted_is_cleaned(store: Path, cli) -> None:
    """`filter --force` killed while deleting the old version leaves `.rm-<id>-.trash-<id>-flt`
    (as earlier rlpipe named it): its name is parsed down to `flt`, and the next listing
    deletes it; deleting a trash now names it for its dataset (`.rm-<id>-flt`)."""
    write(store, "flt")
    leaked = store / ".rm-0000abcd-.trash-1234abcd-flt"
    shutil.copytree(store / "flt", leaked)
    assert cli("datasets", "list", "--store", store).code == 0
    assert store_contents(store) == ["flt"]
    trash = store / ".trash-1234abcd-flt"
    shutil.copytree(store / "flt", trash)
    renamed: list[str] = []
    real_rename = os.rename
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(os, "rename", lambda source, target: renamed.append(Path(target).name) or real_rename(source, target))
        delete_directory(trash)
    assert len(renamed) == 1 and renamed[0].startswith(".rm-") and renamed[0].endswith("-flt") and ".trash-" not in renamed[0]


SWALLOWED_SIGINT = """
import os, signal, sys, time
from rlpipe.datasets import hdf5
from rlpipe.cli.main import main
original = hdf5.write_minari_layout
def interrupted(*args, **kwargs):
    try:  # a C extension that swallows the KeyboardInterrupt, as h5py did
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    return original(*args, **kwargs)
hdf5.write_minari_layout = interrupted
sys.argv = ["rlpipe", "collect", "--env", "CartPole-v1", "--episodes", "3", "--format", "both", "--store", sys.argv[1], "--quiet"]
main()
"""


def test_sigint_swallowed_during_hdf5_write_still_exits_130_and_leaves_nothing(store: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", SWALLOWED_SIGINT, str(store)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 130, proc.stderr
    assert "interrupted" in proc.stderr
    assert store_contents(store) == []


# --- 7. bad input: one line, exit 2, nothing written ---------------------------------------


def test_store_that_is_a_file(tmp_path: Path, cli) -> None:
    (tmp_path / "file").write_text("x")
    for args in (["collect", "--env", "CartPole-v1", "--episodes", "1"], ["datasets", "list"], ["datasets", "show", "x"]):
        one_line_exit_2(cli(*args, "--store", tmp_path / "file"), "is not a directory")


def test_dangling_symlink_as_the_name(store: Path, cli) -> None:
    (store / "cartpole-random").symlink_to(store / "nowhere")
    args = ["collect", "--env", "CartPole-v1", "--episodes", "1", "--store", store, "--quiet"]
    one_line_exit_2(cli(*args), "is a symbolic link")
    one_line_exit_2(cli(*args, "--force"), "is a symbolic link")
    one_line_exit_2(cli("datasets", "show", "cartpole-random", "--store", store), "is a symbolic link")
    assert not (store / "nowhere").exists()


def test_bad_metrics_path_is_refused_before_the_dataset_is_written(store: Path, tmp_path: Path, cli) -> None:
    (tmp_path / "metrics.json").mkdir()
    (tmp_path / "blocker").write_text("a file where a folder should be")
    for bad in (tmp_path / "metrics.json", tmp_path / "blocker" / "m.json"):
        result = cli("collect", "--env", "CartPole-v1", "--episodes", "1", "--store", store, "--quiet", "--metrics", bad)
        one_line_exit_2(result, f"cannot write {bad}")
        assert store_contents(store) == []


@pytest.mark.parametrize("command", [["collect", "--env", "CartPole-v1", "--episodes", "1"], ["relabel", "her", "--dataset", "x"]])
def test_negative_seed_is_a_usage_error(store: Path, cli, command: list[str]) -> None:
    one_line_exit_2(cli(*command, "--seed", "-1", "--store", store), "--seed")


FULL_DISK = """
import resource, signal, sys
from rlpipe.cli.main import main
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG, as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))
sys.argv = ["rlpipe", "collect", "--env", "CartPole-v1", "--episodes", "60", "--store", sys.argv[1], "--quiet"]
main()
"""


def test_full_disk_is_one_line_and_leaves_nothing(store: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", FULL_DISK, str(store)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "writing dataset 'cartpole-random' failed:" in proc.stderr
    assert "File too large" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert store_contents(store) == []


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m.pop("files"), "'files' is missing"),
        (lambda m: m.update(total_steps="300"), "'total_steps' is missing or not a non-negative integer"),
        (lambda m: m.update(producer=[]), "'producer' is missing or not a dict"),
        (lambda m: m.update(observation_space="{}"), "unreadable space"),
        (lambda m: m.update(name="other"), "it names dataset 'other', but its directory is 'data'"),
        (lambda m: m["files"].update({"steps/../../x": m["files"]["steps/shard-00000.arrow"]}), "is not a plain file in steps/"),
        (lambda m: m["episode_return"].update(mean="high"), "'episode_return' needs numbers"),
    ],
)
def test_bad_metadata_is_one_line_and_listed_as_broken(store: Path, cli, edit, message: str) -> None:
    path = write(store)
    write(store, "good")
    meta = json.loads((path / "metadata.json").read_text())
    edit(meta)
    (path / "metadata.json").write_text(json.dumps(meta))
    one_line_exit_2(cli("datasets", "show", "data", "--store", store), message)
    one_line_exit_2(cli("train", "bc", "--dataset", "data", "--store", store), message)
    listed = cli("datasets", "list", "--store", store)
    assert listed.code == 0 and "good" in listed.out and "broken" in listed.out
    assert [name for name, entry in store_entries(store) if isinstance(entry, RlpipeError)] == ["data"]
    assert cli("datasets", "rm", "data", "--store", store).code == 0  # a broken dataset can still be removed


def test_newer_format_is_listed_as_broken_not_hidden(store: Path, cli) -> None:
    path = write(store)
    meta = json.loads((path / "metadata.json").read_text())
    meta["format_version"] = 99
    (path / "metadata.json").write_text(json.dumps(meta))
    listed = cli("datasets", "list", "--store", store)
    assert "data" in listed.out and "format version 99" in listed.out


# --- 8. names and paths ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["CON", "nul", "Aux.txt", "COM1", "lpt9"])
def test_reserved_device_names_are_refused(store: Path, name: str) -> None:
    with pytest.raises(RlpipeError, match="reserved device name"):
        write(store, name)


def test_names_differing_only_in_case_are_refused(store: Path) -> None:
    write(store, "Data")
    with pytest.raises(RlpipeError, match="differs only in case from the existing 'Data'"):
        write(store, "data")
    assert store_contents(store) == ["Data"]


# --- 3 and 9. Minari exports: validated, copied, replaced atomically, only at the exact id ---


def exported_store(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    write_rows("data", [synthetic_rows([6] * 4, BOX, ACT)], BOX, ACT, env_id=None, producer={}, store=store, fmt="both")
    return tmp_path / "minari"


def test_export_copies_and_never_touches_another_dataset(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    import h5py

    root = exported_store(store, tmp_path, monkeypatch)
    assert cli("datasets", "export", "data", "--id", "team-v1/keep-v0", "--store", store).code == 0
    one_line_exit_2(cli("datasets", "export", "data", "--id", "team-v1", "--force", "--store", store), "is not a Minari dataset")
    assert (root / "team-v1" / "keep-v0" / "data" / "main_data.hdf5").is_file()
    assert cli("datasets", "export", "data", "--id", "cp-v0", "--store", store).code == 0
    with h5py.File(root / "cp-v0" / "data" / "main_data.hdf5", "r+") as file:  # a tool writing to the export
        file["episode_0"]["rewards"][0] = 1e6
    assert validate_dataset(open_dataset("data", store)) == []  # ... does not reach the store
    assert cli("datasets", "export", "data", "--id", "cp-v0", "--force", "--store", store).code == 0


def test_export_validates_first(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    exported_store(store, tmp_path, monkeypatch)
    hdf5 = store / "data" / "data" / "main_data.hdf5"
    raw = bytearray(hdf5.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    hdf5.write_bytes(bytes(raw))
    one_line_exit_2(cli("datasets", "export", "data", "--id", "cp-v0", "--store", store), "is corrupted")
    assert not (tmp_path / "minari" / "cp-v0").exists()


def test_export_replace_killed_midway_is_rolled_back(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    root = exported_store(store, tmp_path, monkeypatch)
    assert cli("datasets", "export", "data", "--id", "cp-v0", "--store", store).code == 0
    env = {**os.environ, FAULT_ENV: "old-moved"}
    proc = subprocess.run(
        [RLPIPE, "datasets", "export", "data", "--id", "cp-v0", "--force", "--store", str(store)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == FAULT_EXIT_CODE and not (root / "cp-v0").exists()
    again = cli("datasets", "export", "data", "--id", "cp-v0", "--store", store)  # the next start rolls back
    one_line_exit_2(again, "already exists")
    assert (root / "cp-v0" / "data" / "main_data.hdf5").is_file()
    assert sorted(p.name for p in root.iterdir()) == [".locks", ".rlpipe-root", "cp-v0"]


def test_import_stays_inside_the_minari_root(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    exported_store(store, tmp_path, monkeypatch)
    assert cli("datasets", "export", "data", "--id", "cp-v0", "--store", store).code == 0
    (tmp_path / "minari" / "inner").mkdir()
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari" / "inner"))
    one_line_exit_2(cli("datasets", "import", "../cp-v0", "--name", "escaped", "--store", store), "invalid Minari dataset id")
    assert not (store / "escaped").exists()
