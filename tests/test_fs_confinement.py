"""Locks, clean-up and names stay inside what rlpipe owns: lock and cache files are
never followed through links, recovery runs only in roots rlpipe created, and every name that
becomes a path stays under its root."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
from pathlib import Path

import gymnasium as gym
import numpy as np
import pyarrow as pa
import pytest

import rlpipe.datasets.loader as loader
from rlpipe.commands.sweep import sweep_dir
from rlpipe.datasets.loader import VERIFIED_DIR, load_dataset
from rlpipe.datasets.store import is_dataset_dir
from rlpipe.datasets.writer import write_rows
from rlpipe.errors import RlpipeError
from rlpipe.storage.atomic import LOCK_DIR, LOOSE_LOCK_PREFIX, ROOT_MARKER, StagedDirectory, confined_path, is_root
from rlpipe.storage.files import user_cache_dir, user_key
from tests.test_dataset_store import BOX, synthetic_rows

ACT = gym.spaces.Discrete(2)
QUICK = ["train", "ppo", "--env", "CartPole-v1", "--env-steps", "256", "--no-progress"]
PRECIOUS = "precious\n"


def write(store: Path, name: str = "data") -> Path:
    return write_rows(name, [synthetic_rows([20] * 3, BOX, ACT)], BOX, ACT, env_id=None, producer={}, store=store, fmt="arrow")


def one_line_exit_2(result, message: str) -> None:
    assert result.code == 2, (result.out, result.err)
    assert message in result.err, result.err
    assert len(result.err.strip().splitlines()) == 1, result.err


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file of the user's that no lock or clean-up may change."""
    path = tmp_path / "victim.txt"
    path.write_text(PRECIOUS)
    return path


def foreign_entries(folder: Path) -> dict[str, str]:
    """What another program keeps in a shared folder such as /tmp: entries named like ours."""
    folder.mkdir(exist_ok=True)
    entries = {".tmp-deadbeef-other": "a", ".trash-0123abcd-run2": "b", ".rm-89abcdef-x": "c", "notes.txt": "d"}
    for name, text in entries.items():
        (folder / name).write_text(text)
    return entries


def assert_untouched(folder: Path, entries: dict[str, str]) -> None:
    assert {name: (folder / name).read_text() for name in entries} == entries


# --- lock files are never followed or truncated ------------------------------------------


def test_a_symlinked_lock_is_refused_and_its_target_untouched(store: Path, victim: Path, cli) -> None:
    write(store)  # the store is rlpipe's now (marked) and the writer's lock worked
    assert is_root(store) and (store / LOCK_DIR / "data.lock").is_file()
    (store / LOCK_DIR / "cartpole-random.lock").symlink_to(victim)
    result = cli("collect", "--env", "CartPole-v1", "--episodes", "2", "--store", store, "--quiet")
    one_line_exit_2(result, "is not an rlpipe lock file")
    assert victim.read_text() == PRECIOUS and not (store / "cartpole-random").exists()
    (store / LOCK_DIR / "cartpole-random.lock").unlink()  # control: the same command with a real lock works
    assert cli("collect", "--env", "CartPole-v1", "--episodes", "2", "--store", store, "--quiet").code == 0


def test_a_hard_linked_or_oversized_lock_is_refused(store: Path, victim: Path) -> None:
    write(store)
    os.link(victim, store / LOCK_DIR / "linked.lock")
    with pytest.raises(RlpipeError, match="is not an rlpipe lock file"):
        write(store, "linked")
    (store / LOCK_DIR / "big.lock").write_text("x" * 1000)
    with pytest.raises(RlpipeError, match="is not an rlpipe lock file"):
        write(store, "big")
    assert victim.read_text() == PRECIOUS and (store / LOCK_DIR / "big.lock").read_text() == "x" * 1000


def test_a_symlinked_lock_folder_is_refused(store: Path, tmp_path: Path) -> None:
    write(store)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (store / LOCK_DIR).rename(tmp_path / "old-locks")
    (store / LOCK_DIR).symlink_to(elsewhere)
    with pytest.raises(RlpipeError, match="is a symbolic link or not a directory"):
        write(store, "other")
    assert list(elsewhere.iterdir()) == []


def test_listing_through_a_stale_entry_never_writes_a_linked_lock(store: Path, victim: Path, cli) -> None:
    write(store)
    (store / ".tmp-deadbeef-other").mkdir()  # a stale work directory of a writer of "other"
    (store / LOCK_DIR / "other.lock").symlink_to(victim)
    result = cli("datasets", "list", "--store", store)
    assert result.code == 0 and "data" in result.out, result.err
    assert victim.read_text() == PRECIOUS
    assert (store / ".tmp-deadbeef-other").is_dir()  # its lock is unusable: left alone


def test_readers_never_create_lock_files(store: Path, cli) -> None:
    write(store)
    (store / ".tmp-deadbeef-never").mkdir()  # no rlpipe writer of "never" ever held a lock here
    assert cli("datasets", "list", "--store", store).code == 0
    assert cli("datasets", "inspect", "data", "--store", store).code == 0
    assert sorted(p.name for p in (store / LOCK_DIR).iterdir()) == ["data.lock"]
    assert (store / ".tmp-deadbeef-never").is_dir()


# --- recovery only inside roots rlpipe created -----------------------------------------


def test_recovery_cleans_a_root_but_only_names_rlpipe_locked(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    StagedDirectory(root / "a", "run a", is_dataset_dir).abort()  # rlpipe creates and marks the folder
    assert (root / ROOT_MARKER).is_file()
    (root / ".tmp-deadbeef-a").mkdir()  # a dead writer of "a" (its lock exists)
    (root / ".tmp-deadbeef-b").mkdir()  # no lock: not ours
    StagedDirectory(root / "c", "run c", is_dataset_dir).abort()
    assert not (root / ".tmp-deadbeef-a").exists()  # control: recovery still works in a root
    assert (root / ".tmp-deadbeef-b").is_dir()


def test_a_folder_with_foreign_entries_is_never_cleaned_or_given_locks(tmp_path: Path) -> None:
    shared = tmp_path / "shared"  # like /tmp: rlpipe did not create it and it is not empty
    entries = foreign_entries(shared)
    (shared / f"{LOOSE_LOCK_PREFIX}other").write_text("")  # even a lock beside does not make "other" ours to clean
    staging = StagedDirectory(shared / "run", "run", is_dataset_dir)
    (staging.path / "checkpoint").write_text("x")
    staging.commit()
    assert_untouched(shared, entries)
    assert not (shared / LOCK_DIR).exists() and not (shared / ROOT_MARKER).exists()
    assert (shared / f"{LOOSE_LOCK_PREFIX}run").is_file()  # the one lock, beside the entry it guards
    (shared / ".tmp-0badc0de-run").mkdir()  # a dead writer of "run" itself is cleaned by the next one
    StagedDirectory(shared / "run", "run", is_dataset_dir).abort()
    assert not (shared / ".tmp-0badc0de-run").exists() and (shared / "run" / "checkpoint").is_file()


def test_train_out_in_a_foreign_folder_keeps_its_entries(tmp_path: Path, cli) -> None:
    shared = tmp_path / "shared"
    entries = foreign_entries(shared)
    result = cli(*QUICK, "--out", shared / "run")
    assert result.code == 0, result.err
    assert cli("eval", shared / "run", "--episodes", "1").code == 0
    assert_untouched(shared, entries)
    assert sorted(p.name for p in shared.iterdir()) == sorted([*entries, "run", f"{LOOSE_LOCK_PREFIX}run"])


def test_out_naming_no_entry_is_refused_before_anything_is_written(tmp_path: Path, cli, monkeypatch) -> None:
    shared = tmp_path / "shared"  # `train --out /` names the root itself: here the same with `.`
    entries = foreign_entries(shared)
    monkeypatch.chdir(shared)
    one_line_exit_2(cli(*QUICK, "--out", "."), "names no entry of a directory")
    one_line_exit_2(cli(*QUICK, "--out", "sub/.."), "names no entry of a directory")
    assert sorted(p.name for p in shared.iterdir()) == sorted(entries)
    assert_untouched(shared, entries)


def test_an_empty_folder_is_claimed_and_an_old_store_recognised(tmp_path: Path) -> None:
    empty, old, tampered = tmp_path / "empty", tmp_path / "old", tmp_path / "tampered"
    for folder in (empty, old, tampered):
        folder.mkdir()
    assert not is_root(empty)
    StagedDirectory(empty / "x", "x", is_dataset_dir).abort()
    assert is_root(empty)
    (old / LOCK_DIR).mkdir()  # a store written before the marker: .locks of lock files only
    (old / LOCK_DIR / "data.lock").write_text("123\n")
    (tampered / LOCK_DIR).mkdir()
    (tampered / LOCK_DIR / "data.lock").symlink_to(tmp_path / "victim")
    assert is_root(old) and not is_root(tampered)


# --- names stay under their roots --------------------------------------------------------


def test_sweep_name_that_leaves_the_root_is_refused(tmp_path: Path, cli) -> None:
    root = tmp_path / "a" / "b" / "sweeps"
    for name in ("../../x", "/tmp/x", "ok/../../x"):
        one_line_exit_2(cli("sweep", "ppo", "--env", "CartPole-v1", "--name", name, "--root", root, "--seeds", "0"), "invalid sweep name")
    assert list(tmp_path.rglob("*")) == []
    assert sweep_dir(root, "group/exp", "ppo", None) == root / "group" / "exp"  # control: nesting inside is fine
    assert sweep_dir(root, None, "ppo", "CartPole-v1") == root / "ppo-CartPole-v1"


def test_confined_path_refuses_every_escape(tmp_path: Path) -> None:
    for relative in ("..", "../x", "a/../../x", "/abs", "a//b", "a/./b", "", "a\0b"):
        with pytest.raises(RlpipeError, match="invalid run name"):
            confined_path(tmp_path, relative, "run name")
    assert confined_path(tmp_path, "ppo-ns/Env-v0", "run name") == tmp_path / "ppo-ns" / "Env-v0"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["collect", "--env", "CartPole-v1", "--episodes", "1", "--name", "../escaped"], "invalid dataset name"),
        (["relabel", "her", "--dataset", "data", "--name", "../escaped"], "invalid dataset name"),
        (["datasets", "import", "cp-v0", "--name", "../escaped"], "invalid dataset name"),
        (["datasets", "export", "data", "--id", "../escaped-v0"], "invalid Minari dataset id"),
    ],
)
def test_dataset_names_and_ids_are_refused_before_any_work(store: Path, tmp_path: Path, cli, monkeypatch, args, message) -> None:
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    write(store)
    one_line_exit_2(cli(*args, "--store", store), message)
    assert not (tmp_path / "escaped").exists() and not (store.parent / "escaped").exists()


# --- one name pattern for datasets, runs and sweeps -----------------------------------------

NAMED = {  # every command that takes a dataset, run or sweep name -> (arguments, what the name is)
    "collect": (["collect", "--env", "CartPole-v1", "--episodes", "1", "--quiet", "--name", "{}"], "dataset name"),
    "merge": (["datasets", "merge", "data", "data", "--name", "{}"], "dataset name"),
    "merge-source": (["datasets", "merge", "data", "{}", "--name", "out"], "dataset name"),
    "filter": (["datasets", "filter", "data", "--max-length", "50", "--name", "{}"], "dataset name"),
    "sample": (["datasets", "sample", "data", "--episodes", "1", "--name", "{}"], "dataset name"),
    "split-train": (["datasets", "split", "data", "--val", "0.5", "--train-name", "{}"], "dataset name"),
    "split-val": (["datasets", "split", "data", "--val", "0.5", "--val-name", "{}"], "dataset name"),
    "import": (["datasets", "import", "cp-v0", "--name", "{}"], "dataset name"),
    "relabel": (["relabel", "her", "--dataset", "data", "--name", "{}"], "dataset name"),
    "show": (["datasets", "show", "{}"], "dataset name"),
    "train": (["train", "bc", "--dataset", "{}", "--out", "{run}"], "dataset name"),
    "sweep": (["sweep", "ppo", "--env", "CartPole-v1", "--seeds", "0", "--root", "{sweeps}", "--name", "{}"], "sweep name"),
}


@pytest.mark.parametrize("bad", ["x\n", "", "x\x1b[0m", "a" * 129])
@pytest.mark.parametrize("command", sorted(NAMED))
def test_names_with_control_characters_or_empty_are_refused_everywhere(
    store: Path, tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch, command: str, bad: str
) -> None:
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    write(store)
    template, what = NAMED[command]
    args = [arg.format(bad, run=tmp_path / "run", sweeps=tmp_path / "sweeps") for arg in template]
    result = cli(*args, "--store", store)
    one_line_exit_2(result, "empty" if bad == "" else f"invalid {what} {bad!r}")  # an empty argument is refused before any command
    assert "Traceback" not in result.err
    assert sorted(p.name for p in store.iterdir() if p.name not in (".locks", ".rlpipe-root", ".verified")) == ["data"]
    assert not (tmp_path / "run").exists() and not (tmp_path / "sweeps").exists() and not (tmp_path / "minari").exists()


def test_one_name_pattern_with_its_controls(store: Path, tmp_path: Path, cli) -> None:
    from rlpipe.storage.names import check_distinct, check_name, name_problem

    for good in ("a", "A9", "x" * 128, "cartpole-random.v1_2"):
        assert check_name(good, "dataset name") == good
    for bad in ("x\n", "\nx", "x\r", "x\t", "", ".x", "-x", "a..b", "a/b", "é", "x" * 129, "CON", "nul.txt"):
        assert name_problem(bad), bad
    with pytest.raises(RlpipeError, match="differ only in case"):
        check_distinct(["Data", "data"], "output name")
    check_distinct(["data", "data2"], "output name")
    assert confined_path(tmp_path, "group/exp", "sweep name") == tmp_path / "group" / "exp"
    with pytest.raises(RlpipeError, match=re.escape("invalid sweep name 'group/exp\\n'")):
        confined_path(tmp_path, "group/exp\n", "sweep name")
    with pytest.raises(RlpipeError, match="the default run name 'bc-mod:Env-v0' is not a valid name .*; give --out"):
        confined_path(tmp_path, "bc-mod:Env-v0", "run name", option="--out")
    assert cli("collect", "--env", "CartPole-v1", "--episodes", "1", "--quiet", "--name", "x", "--store", store).code == 0  # control
    assert (store / "x").is_dir() and not (store / "x\n").exists()


# --- the verification cache is read bounded and never through a link ---------------------


def count_hashes(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    hashed: list[Path] = []
    real = loader.sha256_file
    monkeypatch.setattr(loader, "sha256_file", lambda path: hashed.append(path) or real(path))
    return hashed


@pytest.mark.timeout(60)
@pytest.mark.parametrize("plant", ["dev-zero", "fifo", "oversized"])
def test_a_cache_that_is_a_link_a_fifo_or_huge_is_missing(store: Path, monkeypatch: pytest.MonkeyPatch, plant: str) -> None:
    write(store)
    first = load_dataset("data", store)
    hashed = count_hashes(monkeypatch)
    load_dataset("data", store)
    assert hashed == []  # control: a good cache spares the hash
    cache = store / VERIFIED_DIR / "data.json"
    if plant == "oversized":
        monkeypatch.setattr(loader, "MAX_JSON_BYTES", cache.stat().st_size - 1)
    elif plant == "dev-zero":
        cache.unlink()
        cache.symlink_to("/dev/zero")
    else:
        cache.unlink()
        os.mkfifo(cache)
    again = load_dataset("data", store)  # no hang, no unbounded read: the shards are hashed again
    assert hashed and np.array_equal(again.reward, first.reward)
    assert cache.is_file() and not cache.is_symlink()  # replaced by a fresh cache, not written through


@pytest.mark.timeout(60)
def test_huge_metadata_and_checkpoint_records_are_one_line(store: Path, tmp_path: Path, cli) -> None:
    write(store)
    os.truncate(store / "data" / "metadata.json", 1 << 40)  # sparse: a terabyte that is not on disk
    one_line_exit_2(cli("datasets", "inspect", "data", "--store", store), "larger than")
    assert cli(*QUICK, "--out", tmp_path / "run").code == 0
    os.truncate(tmp_path / "run" / "checkpoint.json", 1 << 40)
    one_line_exit_2(cli("eval", tmp_path / "run", "--episodes", "1"), "larger than")


def test_a_linked_cache_folder_is_neither_read_nor_written(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(store)
    load_dataset("data", store)
    elsewhere = tmp_path / "elsewhere"
    (store / VERIFIED_DIR).rename(elsewhere)  # a cache that says every shard was verified
    (store / VERIFIED_DIR).symlink_to(elsewhere)
    before = {p.name: p.read_bytes() for p in elsewhere.iterdir()}
    hashed = count_hashes(monkeypatch)
    load_dataset("data", store)
    assert hashed  # not trusted: hashed again
    assert {p.name: p.read_bytes() for p in elsewhere.iterdir()} == before


def forge_cache(store: Path, name: str = "data", key: bytes | None = None) -> None:
    """Rewrite the store's verification cache as anyone who can write the store can: each
    shard's entry made to match the file as it is now, its old signature kept (or, with the
    user's `key`, signed again: what only the user can do)."""
    cache_path = store / VERIFIED_DIR / f"{name}.json"
    signed = json.loads(cache_path.read_text())
    meta = json.loads((store / name / "metadata.json").read_text())
    for rel, entry in signed["entries"].items():
        facts = (store / name / rel).stat()
        entry["key"] = [facts.st_ino, facts.st_size, facts.st_mtime_ns, facts.st_ctime_ns, meta["files"][rel]["sha256"]]
    if key is not None:
        message = f"{os.path.realpath(store / name)}\n{json.dumps(signed['entries'], sort_keys=True)}".encode()
        signed["mac"] = hmac.new(key, message, hashlib.sha256).hexdigest()
    cache_path.write_text(json.dumps(signed))


def test_a_forged_verification_cache_vouches_for_nothing(store: Path, cli) -> None:
    """A shard edited in place (an action out of the space) after a load cached its hash and
    checks, and its cache entry rewritten to match the edited file: the signature no longer
    matches, so the shard is hashed again and refused. The control signs the same forged
    entries with the user's key: then the edit is trusted, so the signature is what refuses it."""
    path = write(store)
    load_dataset("data", store)
    shard = path / "steps" / "shard-00000.arrow"
    table = pa.ipc.open_file(str(shard)).read_all()
    actions = table.column("action").to_numpy().copy()
    actions[4] = 7
    table = table.set_column(table.schema.get_field_index("action"), table.schema.field("action"), pa.array(actions))
    with pa.OSFile(str(shard), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    forge_cache(store)
    with pytest.raises(RlpipeError, match="sha256 differs"):
        load_dataset("data", store)
    one_line_exit_2(cli("datasets", "inspect", "data", "--store", store), "sha256 differs")
    forge_cache(store, key=user_key())
    assert load_dataset("data", store).action[4] == 7


@pytest.mark.parametrize("problem", ["shared", "unwritable"])
def test_without_a_private_key_nothing_is_cached(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, problem: str) -> None:
    """A key others can read, or no key at all (a cache folder that cannot be made): every load
    hashes the shards, and no cache is written that a later load might trust."""
    if problem == "shared":
        monkeypatch.setenv("RLPIPE_CACHE_DIR", str(tmp_path / "cache"))
        user_key()
        (user_cache_dir() / "verify.key").chmod(0o644)
    else:
        (tmp_path / "file").write_text("")
        monkeypatch.setenv("RLPIPE_CACHE_DIR", str(tmp_path / "file" / "cache"))
    assert user_key() is None
    write(store)
    hashed = count_hashes(monkeypatch)
    load_dataset("data", store)
    load_dataset("data", store)
    assert len(hashed) == 2 and not (store / VERIFIED_DIR / "data.json").exists()
