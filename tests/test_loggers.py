"""`rlpipe train --logger`: the eval curve in TensorBoard's event files and an offline W&B run,
read back with their own readers; several sinks at once; a missing extra named up front."""

from __future__ import annotations

import json
import math
import struct
import sys
from pathlib import Path

import pytest

from rlpipe.errors import RlpipeError
from rlpipe.training.config import RunConfig
from rlpipe.training.resume import read_state, write_state

# PPO on CartPole for two evaluations: the fastest run that has a curve.
TRAIN = ["train", "ppo", "--env", "CartPole-v1", "--env-steps", "1024", "--device", "cpu", "--no-progress"]
QUICK = ["--set", "eval_every=512", "--set", "eval_episodes=2", "--set", "heldout_eval_episodes=2"]


@pytest.fixture(autouse=True)
def wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B offline and quiet, its caches and logs under tmp_path (never the network or $HOME)."""
    home = tmp_path / "wandb-home"
    for name, value in {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DIR": home,
        "WANDB_CACHE_DIR": home / "cache",
        "WANDB_CONFIG_DIR": home / "config",
        "WANDB_DATA_DIR": home / "data",
        "XDG_CACHE_HOME": home / "xdg",  # wandb-core's own log
    }.items():
        monkeypatch.setenv(name, str(value))


def _train(cli, out: Path, *loggers: str) -> dict:
    result = cli(*TRAIN, *QUICK, "--out", out, *(arg for name in loggers for arg in ("--logger", name)))
    assert result.code == 0, result.err
    assert result.err == ""  # no logger prints
    return json.loads((out / "metrics.json").read_text())


def _dvclive_curve(run: Path) -> list[tuple[int, float]]:
    rows = (run / "dvclive/plots/metrics/eval/return_mean.tsv").read_text().splitlines()[1:]
    return [(int(step), float(value)) for step, value in (row.split("\t") for row in rows)]


def _tensorboard_curve(run: Path, tag: str = "eval/return_mean") -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    return [(event.step, event.value) for event in events.Scalars(tag)]


def _wandb_records(run: Path) -> list:
    """The records of the run's offline W&B file (LevelDB's log format: 32 KiB blocks of
    chunks, each a 7-byte header (crc32, length, type) and its bytes, after a 7-byte W&B header)."""
    from wandb.proto import wandb_internal_pb2

    (path,) = run.glob("wandb/offline-run-*/run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pending, pos = [], b"", 7
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:  # zeros: the end of what was written
            break
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def _wandb_history(records: list) -> list[dict]:
    return [
        {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
        for record in records
        if record.WhichOneof("record_type") == "history"
    ]


def test_tensorboard_event_files_hold_the_eval_curve(cli, tmp_path: Path) -> None:
    run = tmp_path / "run"
    metrics = _train(cli, run, "tensorboard")
    curve = _tensorboard_curve(run)
    assert len(curve) == 2 and curve[-1][0] == metrics["env_steps"]
    assert curve[-1][1] == pytest.approx(metrics["eval_return_mean"], rel=1e-6)
    assert _tensorboard_curve(run, "eval/return_std")[-1][1] == pytest.approx(metrics["eval_return_std"], rel=1e-6)
    assert not (run / "dvclive").exists() and not (run / "wandb").exists()  # only the logger asked for
    assert json.loads((run / "checkpoint.json").read_text())["config"]["loggers"] == ["tensorboard"]


def test_wandb_writes_an_offline_run_of_the_curve_and_config(cli, tmp_path: Path) -> None:
    run = tmp_path / "run"
    metrics = _train(cli, run, "wandb")
    records = _wandb_records(run)
    history = _wandb_history(records)
    assert [point["_step"] for point in history][-1] == metrics["env_steps"] and len(history) == 2
    assert history[-1]["eval/return_mean"] == pytest.approx(metrics["eval_return_mean"])
    assert history[-1]["eval/return_std"] == pytest.approx(metrics["eval_return_std"])
    (info,) = [record.run for record in records if record.WhichOneof("record_type") == "run"]
    assert info.project == "rlpipe" and info.display_name == "run"
    config = {item.key: json.loads(item.value_json) for item in info.config.update}
    assert config["env_id"] == "CartPole-v1" and config["eval_every"] == 512 and config["loggers"] == ["wandb"]
    assert not any(path.is_symlink() for path in run.rglob("*"))  # no `latest-run` links in a run directory
    assert not (run / "dvclive").exists()


def test_several_loggers_record_the_same_curve(cli, tmp_path: Path) -> None:
    run = tmp_path / "run"
    _train(cli, run, "dvclive", "tensorboard", "wandb")
    expected = _dvclive_curve(run)
    assert len(expected) == 2
    assert [(step, pytest.approx(value, rel=1e-6)) for step, value in expected] == _tensorboard_curve(run)
    assert [(step, value) for step, value in expected] == [(p["_step"], p["eval/return_mean"]) for p in _wandb_history(_wandb_records(run))]


@pytest.fixture(scope="module")
def pendulum_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rlpipe.commands.collect import collect_dataset

    store = tmp_path_factory.mktemp("diagnostics")
    collect_dataset("Pendulum-v1", episodes=3, name="pendulum", store=store, progress=False)
    return store


# Each family's run (offline, off-policy online, on-policy) and the diagnostics its updates report.
DIAGNOSED = {
    "bc": (["--dataset", "pendulum", "--updates", "40"], ["loss"]),
    "td3bc": (["--dataset", "pendulum", "--updates", "40"], ["critic_loss", "actor_loss", "q_mean", "q_min", "bc_mse"]),
    "iql": (["--dataset", "pendulum", "--updates", "40"], ["value_loss", "critic_loss", "actor_loss", "q_mean", "advantage_mean"]),
    "cql": (["--dataset", "pendulum", "--updates", "40"], ["critic_loss", "actor_loss", "alpha", "entropy", "conservative_gap"]),
    "sac": (
        ["--env", "Pendulum-v1", "--env-steps", "80", "--set", "learning_starts=40"],
        ["critic_loss", "actor_loss", "alpha", "entropy"],
    ),
    "dqn": (["--env", "CartPole-v1", "--env-steps", "80", "--set", "learning_starts=40"], ["td_loss", "q_mean"]),
    "ppo": (
        ["--env", "CartPole-v1", "--env-steps", "128", "--set", "num_steps=64"],
        ["policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction"],
    ),
}


@pytest.mark.parametrize("algo", list(DIAGNOSED))
def test_tensorboard_holds_what_each_family_learns(cli, tmp_path: Path, pendulum_store: Path, algo: str) -> None:
    """Beside the eval curve, every evaluation logs the means of the updates' diagnostics since
    the last one under train/, and the run's units per second."""
    args, names = DIAGNOSED[algo]
    unit = "updates" if "--dataset" in args else "steps"
    run = tmp_path / "run"
    result = cli(
        "train",
        algo,
        *args,
        "--store",
        pendulum_store,
        "--set",
        "eval_every=40",
        "--set",
        "eval_episodes=1",
        "--set",
        "heldout_eval_episodes=0",
        "--set",
        "hidden=[16,16]",
        "--logger",
        "tensorboard",
        "--no-progress",
        "--out",
        run,
    )
    assert result.code == 0, result.err
    for name in [*names, f"{unit}_per_s"]:
        curve = _tensorboard_curve(run, f"train/{name}")
        assert curve and all(math.isfinite(value) for _, value in curve), name


@pytest.mark.parametrize("logger", ["wandb", "tensorboard"])
def test_a_missing_extra_is_one_line_exit_2_and_nothing_written(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logger: str) -> None:
    monkeypatch.setitem(sys.modules, logger, None)  # `import wandb` now fails as if it were not installed
    out = tmp_path / "runs" / "run"
    result = cli(*TRAIN, *QUICK, "--out", out, "--logger", "dvclive", "--logger", logger)
    assert result.code == 2
    assert result.err == f"error: --logger {logger} needs the {logger} extra: pip install 'rlpipe[{logger}]'\n"
    assert not (tmp_path / "runs").exists()


def test_an_unknown_logger_is_refused(cli, tmp_path: Path) -> None:
    result = cli(*TRAIN, "--out", tmp_path / "run", "--logger", "mlflow")
    assert result.code == 2 and result.err == "error: unknown logger 'mlflow': expected dvclive, tensorboard, wandb\n"
    result = cli(*TRAIN, "--out", tmp_path / "run", "--set", "loggers=[dvclive, mlflow]")
    assert (
        result.code == 2 and "setting loggers=['dvclive', 'mlflow']: expected list of 'dvclive' or 'tensorboard' or 'wandb'" in result.err
    )
    assert not (tmp_path / "run").exists()


def test_a_failed_run_leaves_nothing_of_its_loggers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """From Python: the config's ``loggers`` field; a run that fails after its sinks opened
    ends them and removes its staging directory."""
    from rlpipe.algos import get_algo
    from rlpipe.training import run as run_module

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the evaluation failed")

    monkeypatch.setattr(run_module, "evaluate", broken)
    ppo = get_algo("ppo")
    config = ppo.make_config("CartPole-v1", env_steps=1024, eval_every=512, loggers=("tensorboard", "wandb", "dvclive"))
    with pytest.raises(RuntimeError, match="the evaluation failed"):
        ppo.train(config, tmp_path / "runs" / "run", progress=False)
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [".locks", ".rlpipe-root"]


def test_loggers_setting_is_checked_and_normalised() -> None:
    assert RunConfig().loggers == ("dvclive",)
    assert RunConfig(loggers="wandb").loggers == ("wandb",)  # type: ignore[arg-type]
    assert RunConfig(loggers=("tensorboard", "dvclive", "tensorboard")).loggers == ("tensorboard", "dvclive")
    assert RunConfig(loggers=()).loggers == ()
    with pytest.raises(RlpipeError, match="setting loggers=\\('csv',\\): expected list of 'dvclive' or 'tensorboard' or 'wandb'"):
        RunConfig(loggers=("csv",))  # type: ignore[arg-type]


def test_a_state_saved_before_loggers_existed_still_resumes(tmp_path: Path) -> None:
    """Resume states name their config; one saved without ``loggers`` (or with other loggers)
    continues a run of the same config, since loggers do not change what a run computes."""
    state = {"objects": {}, "rng": {}, "run": {"history": [], "next_eval": 512}, "next_save": 100, "loop": {}}
    config = json.loads(json.dumps(RunConfig(env_id="CartPole-v1", checkpoint_every=100).__dict__))
    old = {key: value for key, value in config.items() if key != "loggers"}
    write_state(tmp_path / "old.safetensors", old, state)
    assert read_state(tmp_path / "old.safetensors", config) is not None
    assert read_state(tmp_path / "old.safetensors", {**config, "loggers": ["tensorboard"]}) is not None
    assert read_state(tmp_path / "old.safetensors", {**config, "seed": 1}) is None  # control: another config does not resume


def test_the_curve_and_metrics_hold_the_episodes_mean_length(cli, tmp_path: Path) -> None:
    """CartPole pays 1 a step, so an episode's length is its return: the logged lengths must equal the returns."""
    run = tmp_path / "run"
    metrics = _train(cli, run, "tensorboard")
    returns, lengths = _tensorboard_curve(run), _tensorboard_curve(run, "eval/length_mean")
    assert [step for step, _ in lengths] == [step for step, _ in returns]
    assert [value for _, value in lengths] == pytest.approx([value for _, value in returns], rel=1e-6)
    assert metrics["heldout_length_mean"] == pytest.approx(metrics["heldout_return_mean"])
