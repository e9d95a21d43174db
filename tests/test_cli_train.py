"""`rlpipe train` / `rlpipe eval`: bad input, outputs of a run, determinism."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rlpipe.algos import load_policy


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "rainbow", "--env", "CartPole-v1"], "unknown algorithm 'rainbow'"),
        (["train", "sac", "--env", "CartPole-v1"], "sac needs a continuous (Box) action space; CartPole-v1 has Discrete(2)"),
        (["train", "ppo", "--env", "NoSuchEnv-v0"], "unknown environment 'NoSuchEnv-v0'"),
        (["train", "ppo", "--env", "CartPole-v1", "--dataset", "cartpole-expert"], "ppo is an online algorithm"),
        (["train", "td3"], "td3 needs --env"),
        (["train", "ppo", "--env", "CartPole-v1", "--set", "lr=1"], "unknown setting 'lr'"),
        (["eval", "no/such/run"], "no checkpoint in no/such/run"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(cli, tmp_path: Path, args: list[str], message: str) -> None:
    result = cli(*args, *(["--out", tmp_path / "run"] if args[0] == "train" else []))
    assert result.code == 2
    assert result.err.strip().count("\n") == 0 and result.err.startswith("error: ") and message in result.err, result.err
    assert not (tmp_path / "run").exists()  # nothing half-written


PENDULUM = ["train", "sac", "--env", "Pendulum-v1"]


@pytest.mark.parametrize(
    "args, message",
    [
        # --set values are parsed against the config field's declared type.
        ([*PENDULUM, "--set", "batch_size=1.5"], "setting batch_size=1.5: expected int"),
        ([*PENDULUM, "--set", "hidden=[64, x]"], "setting hidden=[64, 'x']: expected list of int"),
        ([*PENDULUM, "--set", "target_entropy=abc"], "setting target_entropy='abc': expected float or null"),
        ([*PENDULUM, "--set", "actor_lr=nan"], "setting actor_lr='nan': expected float"),
        (["train", "ddpg", "--env", "Pendulum-v1", "--set", "noise=foo"], "setting noise='foo': expected 'gaussian' or 'ou'"),
        (["train", "ppo", "--env", "CartPole-v1", "--set", "anneal=maybe"], "setting anneal='maybe': expected bool"),
        ([*PENDULUM, "--set", "noise=ou"], "unknown setting 'noise'"),
        ([*PENDULUM, "--set", "batch_size"], "--set expects KEY=VALUE"),
        # ... and their ranges checked (budgets, sizes, rates, schedules, seed).
        ([*PENDULUM, "--set", "batch_size=0"], "setting batch_size=0: expected a positive number"),
        ([*PENDULUM, "--set", "actor_lr=-1e-3"], "setting actor_lr=-0.001: expected a positive number"),
        ([*PENDULUM, "--set", "hidden=[64, 0]"], "setting hidden=(64, 0): expected a positive number"),
        ([*PENDULUM, "--set", "eval_episodes=0"], "setting eval_episodes=0: expected a positive number"),
        ([*PENDULUM, "--set", "hidden=[64, 1000000000]"], "setting hidden=(64, 1000000000): expected at most 8192 per layer"),
        ([*PENDULUM, "--set", "buffer_size=1000000000000"], "setting buffer_size=1000000000000: expected at most 100000000"),
        ([*PENDULUM, "--set", "torch_threads=0"], "setting torch_threads=0: expected a positive number"),
        ([*PENDULUM, "--env-steps", "0"], "setting env_steps=0: expected a positive number"),
        ([*PENDULUM, "--set", "seed=-1"], "setting seed=-1: expected an integer from 0 to 4294967295"),
        # A field that is also an option: merged when equal, an error when not; the env is an option only.
        ([*PENDULUM, "--seed", "2", "--set", "seed=3"], "seed is given twice: as an option (2) and as a setting (3)"),
        ([*PENDULUM, "--env-steps", "100", "--set", "env_steps=200"], "env_steps is given twice"),
        ([*PENDULUM, "--set", "env_id=CartPole-v1"], "setting env_id: not a setting, use --env"),
        (["train", "cql", "--dataset", "x", "--set", "dataset=y"], "setting dataset: not a setting, use --dataset"),
        ([*PENDULUM, "--set-from", "no-such.yaml:a"], "cannot read settings from no-such.yaml"),
    ],
)
def test_bad_settings_are_one_line_and_exit_2(cli, tmp_path: Path, args: list[str], message: str) -> None:
    result = cli(*args, "--out", tmp_path / "run", "--no-progress")
    assert result.code == 2, result.err
    assert result.err.strip().count("\n") == 0 and result.err.startswith("error: ") and message in result.err, result.err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "content, message",
    [
        ("a: [1, 2\n", "while parsing a flow sequence: expected ',' or ']', but got '<stream end>' at line 2, column 1"),
        ("a:\n\tb: 1\n", "found character '\\t' that cannot start any token at line 2, column 1"),
        ("a: !!python/object/apply:os.system [echo hi]\n", "could not determine a constructor for the tag"),
        ("a: *undefined\n", "found undefined alias 'undefined'"),
        (b"\xff\xfe garbage", "'utf-8' codec can't decode byte 0xff"),
        ("a: " + "[" * 100_000, "cannot read settings from"),  # deeper than the parser's recursion
        ("a: '" + "x" * (17 << 20) + "'\n", "larger than 16 MiB"),
    ],
)
def test_a_broken_settings_file_is_one_line(cli, tmp_path: Path, content: str | bytes, message: str) -> None:
    params = tmp_path / "params.yaml"
    params.write_bytes(content if isinstance(content, bytes) else content.encode())
    result = cli(*PENDULUM, "--set-from", f"{params}:a", "--out", tmp_path / "run", "--no-progress")
    assert result.code == 2 and result.err.count("\n") == 1, result.err  # PyYAML's own text took five lines
    assert result.err.startswith(f"error: cannot read settings from {params}: ") and message in result.err, result.err
    assert not (tmp_path / "run").exists()


def test_settings_from_a_params_file_equal_the_same_set_options(cli, tmp_path: Path) -> None:
    params = tmp_path / "params.yaml"
    params.write_text("stage:\n  run:\n    set: {env_steps: 512, eval_every: 512, hidden: [16], anneal: false}\n")
    from_file = cli(
        "train",
        "ppo",
        "--env",
        "CartPole-v1",
        "--seed",
        "1",
        "--device",
        "cpu",
        "--no-progress",
        "--out",
        tmp_path / "a",
        "--set-from",
        f"{params}:stage.run.set",
        "--set",
        "env_steps=512",
    )
    as_options = cli(
        "train",
        "ppo",
        "--env",
        "CartPole-v1",
        "--seed",
        "1",
        "--device",
        "cpu",
        "--no-progress",
        "--out",
        tmp_path / "b",
        "--env-steps",
        "512",
        "--set",
        "eval_every=512",
        "--set",
        "hidden=[16]",
        "--set",
        "anneal=false",
    )
    assert from_file.code == 0 and as_options.code == 0, from_file.err + as_options.err
    a, b = (json.loads((tmp_path / run / "checkpoint.json").read_text()) for run in ("a", "b"))
    assert a["config"] == b["config"] and a["config"]["hidden"] == [16] and a["config"]["anneal"] is False
    assert a["sha256"] == b["sha256"]


def _train(cli, out: Path, *extra: str) -> dict:
    result = cli(
        "train",
        "ppo",
        "--env",
        "CartPole-v1",
        "--env-steps",
        "1024",
        "--seed",
        "3",
        "--out",
        out,
        "--device",
        "cpu",
        "--no-progress",
        "--set",
        "eval_every=512",
        *extra,
    )
    assert result.code == 0, result.err
    return json.loads((out / "metrics.json").read_text())


def test_train_writes_metrics_curve_checkpoint_and_eval_reads_it(cli, tmp_path: Path) -> None:
    metrics = _train(cli, tmp_path / "run")
    for key in ("eval_return_mean", "eval_return_std", "env_steps", "gradient_updates", "wall_seconds"):
        assert key in metrics
    assert metrics["env_steps"] >= 1024 and metrics["gradient_updates"] > 0
    curve = (tmp_path / "run/dvclive/plots/metrics/eval/return_mean.tsv").read_text().splitlines()
    assert curve[0] == "step\treturn_mean" and len(curve) == 3  # eval at 512 and at the end
    policy = load_policy(tmp_path / "run")
    assert policy.env_id == "CartPole-v1" and policy.checkpoint_sha256 == metrics["checkpoint_sha256"]
    actions = policy(np.zeros((6, 4), np.float32))
    assert actions.shape == (6,) and set(actions.tolist()) <= {0, 1}

    result = cli("eval", tmp_path / "run", "--episodes", "4", "--seed", "1", "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["episodes"] == 4 and len(report["returns"]) == 4 and report["env_id"] == "CartPole-v1"
    assert report["return_mean"] == pytest.approx(np.mean(report["returns"]))
    text = cli("eval", tmp_path / "run", "--episodes", "4", "--seed", "1")
    assert text.code == 0 and f"{report['return_mean']:.2f} ± {report['return_std']:.2f}" in text.out


def test_same_seed_gives_identical_metrics_and_weights(cli, tmp_path: Path) -> None:
    a, b = _train(cli, tmp_path / "a"), _train(cli, tmp_path / "b")
    a.pop("wall_seconds"), b.pop("wall_seconds")
    assert a == b
    c = _train(cli, tmp_path / "c", "--seed", "4")
    assert c["checkpoint_sha256"] != a["checkpoint_sha256"]


def test_off_policy_runs_are_deterministic(cli, tmp_path: Path) -> None:
    runs = []
    for name in ("a", "b"):
        result = cli(
            "train",
            "td3",
            "--env",
            "Pendulum-v1",
            "--env-steps",
            "300",
            "--out",
            tmp_path / name,
            "--no-progress",
            "--device",
            "cpu",
            "--set",
            "learning_starts=100",
            "--set",
            "eval_episodes=2",
        )
        assert result.code == 0, result.err
        runs.append(json.loads((tmp_path / name / "metrics.json").read_text()))
        runs[-1].pop("wall_seconds")
    assert runs[0] == runs[1] and runs[0]["gradient_updates"] == 200
