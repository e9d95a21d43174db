"""The collect and datasets commands, including every bad-input path (one line, exit 2)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from rlpipe.datasets.store import list_datasets
from tests.conftest import store_contents


def test_collect_then_registry_commands(store: Path, cli) -> None:
    result = cli("collect", "--env", "CartPole-v1", "--episodes", "10", "--num-envs", "4", "--store", store, "--quiet")
    assert result.code == 0, result.err
    assert "cartpole-random" in result.out

    listed = cli("datasets", "list", "--store", store)
    assert listed.code == 0 and "cartpole-random" in listed.out

    shown = cli("datasets", "show", "cartpole-random", "--store", store)
    meta = json.loads(shown.out)
    assert meta["total_episodes"] == 10 and meta["env_id"] == "CartPole-v1"
    assert meta["producer"]["algorithm"] == "random" and meta["format_version"] == 1
    assert json.loads(meta["observation_space"])["type"] == "Box"

    inspected = cli("datasets", "inspect", "cartpole-random", "--store", store)
    assert inspected.code == 0 and "episodes" in inspected.out and "count" in inspected.out

    assert cli("datasets", "validate", "cartpole-random", "--store", store).code == 0
    frame = pl.scan_ipc(str(store / "cartpole-random" / "steps" / "*.arrow")).collect()
    assert frame.height == meta["total_steps"]
    assert frame["episode_id"].n_unique() == 10

    assert cli("datasets", "rm", "cartpole-random", "--store", store).code == 0
    assert not (store / "cartpole-random").exists()


def test_store_from_environment_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    monkeypatch.setenv("RLPIPE_DATASETS", str(tmp_path / "env-store"))
    assert cli("collect", "--env", "Pendulum-v1", "--episodes", "1", "--num-envs", "1", "--quiet", "--format", "arrow").code == 0
    assert (tmp_path / "env-store" / "pendulum-random" / "metadata.json").exists()


@pytest.mark.parametrize(
    "args,message",
    [
        (["collect", "--env", "NoSuchEnv-v0", "--episodes", "1"], "unknown environment 'NoSuchEnv-v0'"),
        (["collect", "--env", "CartPole-v1", "--episodes", "1", "--name", "../escape"], "invalid dataset name"),
        (["collect", "--env", "CartPole-v1", "--episodes", "1", "--name", "a/b"], "invalid dataset name"),
        (["collect", "--env", "CartPole-v1"], "exactly one of --episodes and --steps"),
        (["collect", "--env", "CartPole-v1", "--episodes", "0"], "at least 1"),
        (["collect", "--env", "CartPole-v1", "--episodes", "1", "--format", "csv"], "unknown format 'csv'"),
        (["collect", "--env", "CartPole-v1", "--episodes", "1", "--policy", "greedy"], "unknown policy 'greedy'"),
        (["datasets", "show", "missing"], "dataset 'missing' not found"),
        (["datasets", "inspect", "../etc"], "invalid dataset name"),
        (["datasets", "export", "missing"], "dataset 'missing' not found"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(store: Path, cli, args: list[str], message: str) -> None:
    result = cli(*args, "--store", store)
    assert result.code == 2
    assert message in result.err
    assert len(result.err.strip().splitlines()) == 1
    assert store_contents(store) == []


def test_existing_dataset_needs_force(store: Path, cli) -> None:
    args = ["collect", "--env", "CartPole-v1", "--episodes", "2", "--store", store, "--quiet"]
    assert cli(*args).code == 0
    before = (store / "cartpole-random" / "metadata.json").read_bytes()
    again = cli(*args, "--seed", "1")
    assert again.code == 2 and "already exists" in again.err and "--force" in again.err
    assert (store / "cartpole-random" / "metadata.json").read_bytes() == before
    assert cli(*args, "--seed", "1", "--force").code == 0
    assert (store / "cartpole-random" / "metadata.json").read_bytes() != before


def test_corrupted_and_newer_datasets_are_reported(store: Path, cli) -> None:
    assert cli("collect", "--env", "CartPole-v1", "--episodes", "20", "--store", store, "--quiet").code == 0
    shard = store / "cartpole-random" / "steps" / "shard-00000.arrow"
    shard.write_bytes(shard.read_bytes()[:200])
    result = cli("datasets", "validate", "cartpole-random", "--store", store)
    assert result.code == 2 and "corrupted" in result.err and len(result.err.strip().splitlines()) == 1

    meta_path = store / "cartpole-random" / "metadata.json"
    meta = json.loads(meta_path.read_text())
    meta["format_version"] = 3
    meta_path.write_text(json.dumps(meta))
    newer = cli("datasets", "show", "cartpole-random", "--store", store)
    assert newer.code == 2 and "format version 3" in newer.err


def test_help_texts(cli) -> None:
    for args in (["--help"], ["collect", "--help"], ["datasets", "--help"], ["datasets", "inspect", "--help"]):
        result = cli(*args)
        assert result.code == 0 and "Usage" in result.out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train", "bc", "--no-such-flag"], "No such option: --no-such-flag"),
        (["train", "bc", "--updates", "many"], "Invalid value for '--updates'"),
        (["no-such-command"], "No such command"),
        (["train"], "Missing argument"),
    ],
)
def test_usage_errors_are_one_line(cli, args: list[str], message: str) -> None:
    result = cli(*args)
    assert result.code == 2 and message in result.err and len(result.err.strip().splitlines()) == 1


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killed_collection_leaves_no_dataset(store: Path, sig: int) -> None:
    """Kill a long collection mid-way: the store shows no dataset, only hidden work files."""
    rlpipe = Path(sys.executable).with_name("rlpipe")
    proc = subprocess.Popen(
        [
            str(rlpipe),
            "collect",
            "--env",
            "CartPole-v1",
            "--steps",
            "50000000",
            "--num-envs",
            "64",
            "--store",
            str(store),
            "--quiet",
            "--format",
            "arrow",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while not any(store.glob(".tmp-*")) and time.monotonic() < deadline:
        time.sleep(0.1)  # wait until the writer has started
    time.sleep(1.0)  # ... and is collecting
    assert proc.poll() is None
    proc.send_signal(sig)
    code = proc.wait(timeout=30)
    assert not (store / "cartpole-random").exists()
    assert list_datasets(store) == []
    if sig == signal.SIGTERM:  # handled like Ctrl-C: exit 128 + 15, work files deleted
        assert code == 128 + signal.SIGTERM and store_contents(store) == []
    else:  # only hidden work files, which the next writer deletes (tests/test_store_safety.py)
        assert all(p.startswith(".tmp-") for p in store_contents(store))
