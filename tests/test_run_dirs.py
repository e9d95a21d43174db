"""Run directories are written like datasets: locked, staged, published by renames."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import pytest

from rlpipe.datasets.writer import write_rows
from rlpipe.storage.atomic import FAULT_ENV, FAULT_EXIT_CODE
from tests.test_dataset_store import BOX, synthetic_rows

ACT = gym.spaces.Discrete(2)

RLPIPE = str(Path(sys.executable).with_name("rlpipe"))
QUICK = ["train", "ppo", "--env", "CartPole-v1", "--env-steps", "1024", "--no-progress"]


def snapshot(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def start_long_run(out: Path) -> subprocess.Popen:
    """A second process training into `out`, stopped by the caller once it has started."""
    proc = subprocess.Popen(
        [RLPIPE, "train", "ppo", "--env", "CartPole-v1", "--env-steps", "10000000", "--seed", "1", "--out", str(out), "--no-progress"],
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not list(out.parent.glob(f".tmp-*-{out.name}/dvclive")) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    assert proc.poll() is None
    return proc


def test_killed_rerun_keeps_the_old_run_whole(tmp_path: Path, cli) -> None:
    out = tmp_path / "models" / "ppo"
    assert cli(*QUICK, "--out", out).code == 0
    before = snapshot(out)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        proc = start_long_run(out)
        try:
            busy = cli(*QUICK, "--out", out)  # a second writer of the same run directory
            assert busy.code == 2 and "is being written by another process" in busy.err
        finally:
            proc.send_signal(sig)
            code = proc.wait(timeout=30)
        assert snapshot(out) == before  # the old checkpoint, metrics and curve, nothing of the new run
        leftovers = [p.name for p in out.parent.iterdir() if p.name not in (".locks", ".rlpipe-root") and p != out]
        if sig == signal.SIGTERM:  # handled like Ctrl-C: the work directory is deleted
            assert code == 128 + signal.SIGTERM and leftovers == []
        else:  # the dead writer's work directory, deleted by the next command that looks
            assert leftovers and all(name.startswith(".tmp-") for name in leftovers)
    evaluated = cli("eval", out, "--episodes", "1")
    assert evaluated.code == 0, evaluated.err
    assert [p.name for p in out.parent.iterdir() if p.name not in (".locks", ".rlpipe-root")] == ["ppo"]
    assert cli(*QUICK, "--seed", "2", "--out", out).code == 0  # a finished rerun replaces the run
    assert snapshot(out) != before


def test_out_that_is_not_a_run_directory_is_refused(tmp_path: Path, cli) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    result = cli(*QUICK, "--out", tmp_path / "mine")
    assert result.code == 2 and "not a run directory; refusing to replace it" in result.err
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    (tmp_path / "file").write_text("x")
    result = cli(*QUICK, "--out", tmp_path / "file")
    assert result.code == 2 and "must name a directory" in result.err


def test_a_directory_dvc_left_with_only_its_gitignore_is_replaced(tmp_path: Path, cli) -> None:
    """`dvc repro` removes a stage's output files from a run directory but keeps the `.gitignore`
    it wrote there; the stage's next run must still be able to write that directory."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".gitignore").write_text("/model.safetensors\n/checkpoint.json\n")
    result = cli(*QUICK, "--out", tmp_path / "run")
    assert result.code == 0, result.err
    assert (tmp_path / "run" / "metrics.json").is_file()


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rlpipe.algos import get_algo

    out = tmp_path_factory.mktemp("trained") / "run"
    ppo = get_algo("ppo")
    ppo.train(ppo.make_config("CartPole-v1", env_steps=1024), out, progress=False)
    return out


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m.pop("sha256"), "'sha256' is missing"),
        (lambda m: m["policy"].update(kind="Nope"), "unknown policy kind 'Nope'"),
        (lambda m: m["policy"]["spec"].update(wings=2), "policy spec does not fit"),
        (lambda m: m["policy"]["spec"].update(hidden=[2**70]), "policy spec does not fit"),  # was torch's C++ stack, 12 lines
        # refused from the spec's shapes alone, before a network of 4096x4096 layers is built
        (lambda m: m["policy"]["spec"].update(hidden=[4096, 4096]), "does not match its policy spec: tensor '"),
        (lambda m: m.update(env_id="Pendulum-v1"), "names env 'Pendulum-v1', but its env spec is of 'CartPole-v1'"),
        (lambda m: m.update(env_id="Pendulum-v1", env_spec=gym.spec("Pendulum-v1").to_json()), "does not fit Pendulum-v1"),
        (lambda m: m.update(weights_file="../model.safetensors"), "is not a file name in the run directory"),
        (lambda m: m.update(action_space={"type": "Box"}), "malformed space description"),
        (lambda m: m.update(config=[]), "'config' is not an object"),
    ],
)
def test_malformed_checkpoint_is_one_line(trained_run: Path, tmp_path: Path, cli, edit, message: str) -> None:
    out = tmp_path / "run"
    shutil.copytree(trained_run, out)
    meta = json.loads((out / "checkpoint.json").read_text())
    edit(meta)
    (out / "checkpoint.json").write_text(json.dumps(meta))
    result = cli("eval", out, "--episodes", "1")
    assert result.code == 2 and message in result.err and len(result.err.strip().splitlines()) == 1, result.err


def test_dataset_whose_spaces_differ_from_its_env_fails_before_training(store: Path, tmp_path: Path, cli) -> None:
    write_rows("wrong", [synthetic_rows([5] * 4, BOX, ACT)], BOX, ACT, env_id="CartPole-v1", producer={}, store=store, fmt="arrow")
    result = cli("train", "bc", "--dataset", "wrong", "--store", store, "--out", tmp_path / "run", "--no-progress")
    assert result.code == 2 and "has observations Box(-1.0, 1.0, (3,), float32), but its env CartPole-v1 has" in result.err
    assert not (tmp_path / "run").exists()


def test_diverged_run_is_one_line_and_publishes_nothing(tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch) -> None:
    import rlpipe.training.run as run_module
    from rlpipe.training.evaluation import EvalResult

    nan = EvalResult(float("nan"), float("nan"), [float("nan")], [1])
    monkeypatch.setattr(run_module, "evaluate", lambda *args, **kwargs: nan)  # NaN weights give NaN returns
    result = cli(*QUICK, "--out", tmp_path / "run")
    assert result.code == 2 and "NaN or infinity in eval_return_mean, eval_return_std" in result.err, result.err
    assert sorted(p.name for p in tmp_path.iterdir()) == [".locks", ".rlpipe-root"]


def test_eval_rolls_back_a_replace_that_died_midway(trained_run: Path, tmp_path: Path, cli) -> None:
    out = tmp_path / "models" / "run"
    shutil.copytree(trained_run, out)  # a folder rlpipe did not create: the lock goes beside the run
    rerun = subprocess.run(
        [RLPIPE, *QUICK, "--out", str(out)], env={**os.environ, FAULT_ENV: "old-moved"}, capture_output=True, timeout=300
    )
    assert rerun.returncode == FAULT_EXIT_CODE and not out.exists()  # killed between the two renames
    result = cli("eval", out, "--episodes", "1")
    assert result.code == 0, result.err
    assert sorted(p.name for p in out.parent.iterdir()) == [".rlpipe-lock-run", "run"]
    assert snapshot(out) == snapshot(trained_run)


def test_final_heldout_evaluation_is_recorded_on_its_own_seeds(tmp_path: Path, cli) -> None:
    from rlpipe.training.run import EVAL_SEED_OFFSET, HELDOUT_SEED_OFFSET

    result = cli(*QUICK, "--seed", "3", "--set", "eval_episodes=4", "--set", "heldout_eval_episodes=7", "--out", tmp_path / "run")
    assert result.code == 0, result.err
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["heldout_episodes"] == 7 and metrics["eval_episodes"] == 4
    assert {"eval_return_mean", "eval_return_std", "heldout_return_mean", "heldout_return_std"} <= set(metrics)
    # The periodic evaluation's env seeds (3 + 10000 + i, i < 4) and the held-out ones
    # (3 + 20000 + i, i < 7) are disjoint; the held-out figure is `rlpipe eval`'s on those seeds.
    periodic = set(range(3 + EVAL_SEED_OFFSET, 3 + EVAL_SEED_OFFSET + 4))
    assert periodic.isdisjoint(range(3 + HELDOUT_SEED_OFFSET, 3 + HELDOUT_SEED_OFFSET + 7))
    evaluated = cli("eval", tmp_path / "run", "--episodes", "7", "--seed", str(3 + HELDOUT_SEED_OFFSET), "--json")
    assert evaluated.code == 0, evaluated.err
    assert json.loads(evaluated.out)["return_mean"] == pytest.approx(metrics["heldout_return_mean"])


def test_heldout_evaluation_can_be_switched_off_and_not_made_negative(tmp_path: Path, cli) -> None:
    result = cli(*QUICK, "--set", "eval_episodes=2", "--set", "heldout_eval_episodes=0", "--out", tmp_path / "run")
    assert result.code == 0, result.err
    assert not any(key.startswith("heldout") for key in json.loads((tmp_path / "run" / "metrics.json").read_text()))
    refused = cli(*QUICK, "--set", "heldout_eval_episodes=-1", "--out", tmp_path / "bad")
    assert refused.code == 2 and "heldout_eval_episodes=-1: expected an integer >= 0" in refused.err, refused.err


def test_heldout_evaluation_calls_the_evaluator_on_disjoint_seeds_and_leaves_the_extras_alone() -> None:
    """With a custom evaluator (as the multi-agent runs use): the periodic evaluation gets
    eval_episodes on seed + 10000, the held-out one heldout_eval_episodes on seed + 20000, and
    metrics the caller computed from its evaluator's records are kept as training left them."""
    from torch import nn

    from rlpipe.training import EvalResult, OnlineConfig, Run

    calls: list[tuple[int, int]] = []

    def evaluator(_policy: object, episodes: int, seed: int) -> EvalResult:
        calls.append((episodes, seed))
        return EvalResult(float(seed), 1.0, [float(seed)] * episodes, [1] * episodes)

    run = Run(
        "ppo", OnlineConfig(env_id="CartPole-v1", seed=5, eval_episodes=4, heldout_eval_episodes=30), progress=False, evaluator=evaluator
    )
    try:
        metrics = run.finish(None, nn.Identity(), {}, gym.spaces.Discrete(2), 100, 0, {"eval_calls": calls}).metrics
    finally:
        run.close()
    assert calls == [(4, 10_005), (30, 20_005)]
    assert metrics["eval_return_mean"] == 10_005 and metrics["heldout_return_mean"] == 20_005
    assert metrics["heldout_episodes"] == 30 and metrics["eval_calls"] == [(4, 10_005)]
