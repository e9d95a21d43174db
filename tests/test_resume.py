"""Resumable training: a run killed with SIGKILL and resumed with `--resume` ends with the
same metrics and weights as an uninterrupted run of the same config (offline BC, on-policy
PPO, off-policy SAC). Only the killed run is a subprocess; the others run in-process."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlpipe.commands.collect import collect_dataset
from rlpipe.envs.stepper import VecStepper
from rlpipe.training.resume import STATE_FILE, resume_dir

# The CLI, made to SIGKILL itself at the first checkpoint point at or past KILL_AT units: a
# few units after a saved state, so the work done since that state is lost.
KILLED_CLI = """
import os, signal, sys
from rlpipe.training.resume import Checkpointer
save, kill_at = Checkpointer.maybe_save, int(sys.argv.pop(1))
def maybe_save(self, done, loop):
    if done >= kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    save(self, done, loop)
Checkpointer.maybe_save = maybe_save
from rlpipe.cli.main import main
main()
"""


def _final(run_dir: Path) -> tuple[dict, bytes]:
    metrics = json.loads((run_dir / "metrics.json").read_text())
    metrics.pop("wall_seconds")
    return metrics, (run_dir / "model.safetensors").read_bytes()


def _train(cli, args: list[str]) -> None:
    res = cli("train", *args)
    assert res.code == 0, res.err[-3000:]


def _killed_and_resumed(cli, algo: str, args: list[str], run_dir: Path, kill_at: int) -> None:
    """Train in a subprocess killed with SIGKILL past ``kill_at`` units, then resume it here."""
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_CLI, str(kill_at), "train", *args, "--out", str(run_dir)], capture_output=True, text=True, timeout=300
    )
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert (resume_dir(run_dir) / STATE_FILE).exists() and not (run_dir / "metrics.json").exists(), "not killed mid-way"
    shutil.copytree(resume_dir(run_dir), resume_dir(run_dir.with_name("copy")))  # for a control to resume as well
    _train(cli, [algo, "--resume", str(run_dir), "--no-progress"])
    assert not resume_dir(run_dir).exists()


@pytest.mark.slow
def test_killed_offline_run_resumes_to_the_same_result(tmp_path: Path, cli) -> None:
    store = tmp_path / "store"
    collect_dataset("CartPole-v1", episodes=10, num_envs=2, name="cp", store=store, fmt="arrow", progress=False)
    args = [
        "bc",
        "--dataset",
        "cp",
        "--store",
        str(store),
        "--updates",
        "1200",
        "--set",
        "eval_every=600",
        "--set",
        "eval_episodes=2",
        "--set",
        "hidden=[32, 32]",
        "--checkpoint-every",
        "300",
        "--no-progress",
        "--device",
        "cpu",
    ]
    _train(cli, [*args, "--out", str(tmp_path / "whole")])
    _killed_and_resumed(cli, "bc", args, tmp_path / "killed", kill_at=700)
    assert _final(tmp_path / "killed") == _final(tmp_path / "whole")
    # control: the comparison sees a different run
    _train(cli, [*args, "--seed", "1", "--out", str(tmp_path / "seed1")])
    assert _final(tmp_path / "seed1")[1] != _final(tmp_path / "whole")[1]


# Pendulum: sub-envs in a SyncVectorEnv, episodes of 200 steps (so the kill lands mid-episode
# with autoresets pending), PPO with its observation normaliser (Pendulum's TUNED).
ONLINE_RUNS = {
    "ppo": (
        [
            "--env-steps",
            "1024",
            "--num-envs",
            "2",
            "--set",
            "num_steps=64",
            "--set",
            "num_epochs=2",
            "--set",
            "eval_every=512",
            "--checkpoint-every",
            "256",
        ],
        700,
    ),
    "sac": (
        [
            "--env-steps",
            "600",
            "--num-envs",
            "2",
            "--set",
            "learning_starts=200",
            "--set",
            "batch_size=32",
            "--set",
            "hidden=[32, 32]",
            "--set",
            "eval_every=300",
            "--checkpoint-every",
            "200",
        ],
        450,
    ),
}


def _restore_all_but_the_envs(stepper: VecStepper, state: dict) -> None:
    for name in stepper._RESUMED:
        setattr(stepper, name, state[name])


@pytest.mark.slow
@pytest.mark.parametrize("algo", sorted(ONLINE_RUNS))
def test_killed_online_run_resumes_to_the_same_result(algo: str, tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch) -> None:
    budget, kill_at = ONLINE_RUNS[algo]
    args = [algo, "--env", "Pendulum-v1", *budget, "--set", "eval_episodes=1", "--no-progress", "--device", "cpu"]
    _train(cli, [*args, "--out", str(tmp_path / "whole")])
    _killed_and_resumed(cli, algo, args, tmp_path / "killed", kill_at)
    assert _final(tmp_path / "killed") == _final(tmp_path / "whole")
    # control: the same state resumed without the envs' own (fresh envs, all else restored) differs
    monkeypatch.setattr(VecStepper, "load_state_dict", _restore_all_but_the_envs)
    _train(cli, [algo, "--resume", str(tmp_path / "copy"), "--no-progress"])
    assert _final(tmp_path / "copy")[1] != _final(tmp_path / "whole")[1]


def test_checkpoint_every_is_refused_for_algorithms_that_cannot_resume(tmp_path: Path, cli) -> None:
    res = cli("train", "td3", "--env", "Pendulum-v1", "--checkpoint-every", "100", "--out", str(tmp_path / "td3"))
    assert res.code == 2 and "td3 does not support --checkpoint-every" in res.err
    assert not (tmp_path / "td3").exists()
