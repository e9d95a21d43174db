"""Resumable training: a run killed with SIGKILL and resumed with `--resume` ends with the
same metrics and weights as an uninterrupted run of the same config."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlpipe.pipeline.collect import collect_dataset
from rlpipe.training.resume import INFO_FILE, STATE_FILE, resume_dir

RLPIPE = [sys.executable, "-m", "rlpipe.cli.main"]


def _final(run_dir: Path) -> tuple[dict, bytes]:
    metrics = json.loads((run_dir / "metrics.json").read_text())
    metrics.pop("wall_seconds")
    return metrics, (run_dir / "model.safetensors").read_bytes()


def _train(args: list[str]) -> None:
    done = subprocess.run([*RLPIPE, "train", *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def _kill_after_first_state(args: list[str], run_dir: Path) -> None:
    proc = subprocess.Popen([*RLPIPE, "train", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not (resume_dir(run_dir) / STATE_FILE).exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (resume_dir(run_dir) / STATE_FILE).exists() and not (run_dir / "metrics.json").exists(), "the run was not killed mid-way"


@pytest.mark.slow
def test_killed_offline_run_resumes_to_the_same_result(tmp_path: Path) -> None:
    store = tmp_path / "store"
    collect_dataset("CartPole-v1", episodes=10, num_envs=2, name="cp", store=store, fmt="arrow", progress=False)
    args = ["bc", "--dataset", "cp", "--store", str(store), "--updates", "3000", "--set", "eval_every=1000",
            "--set", "eval_episodes=2", "--set", "hidden=[32, 32]", "--checkpoint-every", "500", "--no-progress",
            "--device", "cpu"]
    _train([*args, "--out", str(tmp_path / "whole")])
    _kill_after_first_state([*args, "--out", str(tmp_path / "killed")], tmp_path / "killed")
    _train(["bc", "--resume", str(tmp_path / "killed"), "--no-progress"])
    assert _final(tmp_path / "killed") == _final(tmp_path / "whole")
    assert not resume_dir(tmp_path / "killed").exists()
    # control: the comparison sees a different run
    _train([*args, "--seed", "1", "--out", str(tmp_path / "seed1")])
    assert _final(tmp_path / "seed1")[1] != _final(tmp_path / "whole")[1]
