"""One offline run across processes (rlpipe.training.distributed): N ranks on batch_size/N rows
each, gradients averaged, give what one process gives; rank 0 alone writes; a dead rank ends
the run in one line; an interrupted run resumes to the uninterrupted one's weights."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from rlpipe.datasets.loader import TransitionArrays
from rlpipe.training.distributed import Ranks, RankShard
from rlpipe.training.resume import STATE_FILE
from rlpipe.training.sampler import TransitionSampler

QUICK = ["--set", "eval_every=100", "--set", "eval_episodes=1", "--set", "heldout_eval_episodes=1", "--no-progress"]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pend`: 20 episodes of random Pendulum actions (4000 transitions)."""
    from rlpipe.commands.collect import collect_dataset

    root = tmp_path_factory.mktemp("ddp") / "datasets"
    collect_dataset("Pendulum-v1", steps=4000, name="pend", store=root, progress=False)
    return root


def train(store: Path, out: Path, algo: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``rlpipe train ALGO`` on `pend` in a child process (as a user runs it)."""
    command = [sys.executable, "-m", "rlpipe", "train", algo, "--dataset", "pend", "--store", str(store), "--out", str(out), *QUICK, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "model.safetensors")


def test_rank_shards_split_the_global_batch() -> None:
    """Two ranks' shards are the two halves of the batch one process draws, in order."""
    rows = 100
    data = TransitionArrays(
        obs=np.arange(rows, dtype=np.float32)[:, None],
        action=np.zeros((rows, 1), np.float32),
        reward=np.zeros(rows, np.float32),
        next_obs=np.zeros((rows, 1), np.float32),
        terminated=np.zeros(rows, bool),
        truncated=np.zeros(rows, bool),
        episode_id=np.zeros(rows, np.int64),
        step=np.arange(rows, dtype=np.int64),
    )
    whole = TransitionSampler(data, seed=3).sample(8).obs[:, 0]
    halves = [RankShard(TransitionSampler(data, seed=3), Ranks(rank, 2)).sample(8).obs[:, 0] for rank in (0, 1)]
    assert torch.equal(torch.cat(halves), whole)


@pytest.mark.heavy
def test_two_processes_train_bc_as_one_does(store: Path, tmp_path: Path) -> None:
    """BC's mean loss: two ranks' averaged half-batch gradients are the whole batch's, so 300
    updates end at one process's weights up to float rounding; rank 0 alone wrote a run."""
    one = train(store, tmp_path / "one", "bc", "--updates", "300")
    two = train(store, tmp_path / "two", "bc", "--updates", "300", "--nproc", "2")
    assert one.returncode == 0 and two.returncode == 0, (one.stderr, two.stderr)
    a, b = weights(tmp_path / "one"), weights(tmp_path / "two")
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["one", "two"]


@pytest.mark.heavy
@pytest.mark.parametrize("algo", ["td3bc", "iql", "cql", "dt"])
def test_offline_families_train_across_two_processes(store: Path, tmp_path: Path, algo: str) -> None:
    """Several optimisers per update (actor, critics, value, α), target networks, sequence
    windows: each trains as two ranks and rank 0 writes its run."""
    result = train(store, tmp_path / "run", algo, "--updates", "100", "--nproc", "2")
    assert result.returncode == 0, result.stderr
    assert "after 100 updates" in result.stdout
    assert (tmp_path / "run" / "metrics.json").is_file()


def test_a_batch_that_does_not_split_is_refused_before_any_process_starts(store: Path, tmp_path: Path, cli) -> None:
    result = cli("train", "bc", "--dataset", "pend", "--store", store, "--out", tmp_path / "run", "--set", "batch_size=255", "--nproc", "2")
    assert result.code == 2
    assert result.err.strip() == "error: batch_size=255 is not divisible by nproc=2"
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["sac", "--env", "Pendulum-v1"], "--nproc is for offline algorithms (trained on a --dataset), not sac"),
        (["mopo", "--dataset", "pend"], "mopo cannot train with nproc > 1: its batches mix the dataset with model rollouts"),
        (
            ["iql", "--dataset", "pend", "--finetune-env-steps", "100"],
            "iql with nproc > 1: fine-tuning online is not supported across processes",
        ),
    ],
)
def test_what_cannot_be_split_is_refused_in_one_line(store: Path, tmp_path: Path, cli, args: list[str], message: str) -> None:
    result = cli("train", *args, "--store", store, "--out", tmp_path / "run", "--nproc", "2")
    assert result.code == 2
    assert result.err.strip() == f"error: {message}"
    assert not list(tmp_path.iterdir())


def _kill_rank(rank: int, timeout: float = 120.0) -> None:
    """SIGKILL the process a launcher started as ``rank`` of a `rlpipe.commands.rank` run."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in os.listdir("/proc"):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except (OSError, ValueError):
                continue
            if b"rlpipe.commands.rank" in cmdline and f"RANK={rank}".encode() in environ:
                os.kill(int(pid), signal.SIGKILL)
                return
        time.sleep(0.1)
    raise AssertionError(f"no rank {rank} appeared")


@pytest.mark.heavy
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the rank's process in /proc")
def test_a_dead_rank_ends_the_run_in_one_line_and_it_resumes(store: Path, tmp_path: Path) -> None:
    """Rank 1 killed after a saved state: the run stops with one line naming it, nothing is
    published, and --resume ends at the weights of the same run left alone."""
    args = ["--updates", "1500", "--set", "checkpoint_every=200", "--nproc", "2"]
    command = [sys.executable, "-m", "rlpipe", "train", "bc", "--dataset", "pend", "--store", str(store), "--out", str(tmp_path / "cut")]
    child = subprocess.Popen([*command, *QUICK, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    state = tmp_path / ".resume-cut" / STATE_FILE
    deadline = time.monotonic() + 300
    while not state.exists() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    _kill_rank(1)
    out, err = child.communicate(timeout=300)
    assert child.returncode == 2, (out, err)
    assert err.strip().splitlines() == ["error: rank 1 of 2 exited with code -9; the run stopped"]
    assert not (tmp_path / "cut").exists()
    resumed = subprocess.run(
        [sys.executable, "-m", "rlpipe", "train", "bc", "--resume", str(tmp_path / "cut"), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr
    whole = train(store, tmp_path / "whole", "bc", *args)
    assert whole.returncode == 0, whole.stderr
    a, b = weights(tmp_path / "cut"), weights(tmp_path / "whole")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.heavy
@pytest.mark.ray
@pytest.mark.xdist_group("ray")
def test_ray_train_workers_run_the_same_ranks(store: Path, tmp_path: Path) -> None:
    """--backend ray: Ray Train's two workers make the process group and run the same ranks,
    ending at the local launcher's weights exactly."""
    pytest.importorskip("ray.train")
    local = train(store, tmp_path / "local", "bc", "--updates", "200", "--nproc", "2")
    on_ray = train(store, tmp_path / "ray", "bc", "--updates", "200", "--nproc", "2", "--backend", "ray")
    assert local.returncode == 0 and on_ray.returncode == 0, (local.stderr, on_ray.stderr)
    a, b = weights(tmp_path / "local"), weights(tmp_path / "ray")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not (tmp_path / ".ray-ray").exists()


def test_backend_ray_needs_several_processes(store: Path, tmp_path: Path, cli) -> None:
    result = cli("train", "bc", "--dataset", "pend", "--store", store, "--out", tmp_path / "run", "--backend", "ray")
    assert result.code == 2
    assert result.err.strip() == "error: --backend ray starts the processes of a run of --nproc 2 or more"


@pytest.mark.heavy
def test_the_python_api_starts_the_processes_as_the_cli_does(store: Path, tmp_path: Path) -> None:
    """``rlpipe.train(..., nproc=2)`` outside torchrun launches the ranks: the same weights as
    ``rlpipe train --nproc 2``, its metrics and policy read back from rank 0's run, and rank 0's
    eval history."""
    import rlpipe

    cli_run = train(store, tmp_path / "cli", "bc", "--updates", "200", "--nproc", "2")
    assert cli_run.returncode == 0, cli_run.stderr
    settings = {"updates": 200, "eval_every": 100, "eval_episodes": 1, "heldout_eval_episodes": 1, "nproc": 2}
    result = rlpipe.train("bc", dataset="pend", store=store, out=tmp_path / "api", **settings)
    a, b = weights(tmp_path / "cli"), weights(tmp_path / "api")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert result.run_dir == tmp_path / "api" and result.metrics["gradient_updates"] == 200
    assert result.checkpoint_sha256 == result.metrics["checkpoint_sha256"]
    assert [point.done for point in result.history] == [100, 200]
    assert result.history[-1].mean == result.metrics["eval_return_mean"]
    obs = torch.zeros(1, 3)
    assert torch.equal(result.policy(obs), rlpipe.load_policy(tmp_path / "cli").actor(obs))


def test_the_python_api_needs_a_run_directory_for_several_processes(store: Path) -> None:
    import rlpipe
    from rlpipe.errors import RlpipeError

    with pytest.raises(RlpipeError, match=r"^nproc=2: rank 0 of the processes writes the run; give out= a run directory$"):
        rlpipe.train("bc", dataset="pend", store=store, updates=10, nproc=2)
