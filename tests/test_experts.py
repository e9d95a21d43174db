"""Expert datasets: `collect --expert` trains or reuses an expert, `--from-training` stores a
whole training run. Tiny budgets: these test the plumbing, the learning tests test learning."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rlpipe.algos import load_policy
from rlpipe.datasets.loader import load_dataset
from rlpipe.datasets.store import open_dataset
from tests.conftest import store_contents
from tests.test_collector import assert_episodes_well_formed

# A SAC expert trained for 600 Pendulum steps, every transition it saw stored.
SAC_FROM_TRAINING_600 = ("collect", "--expert", "sac", "--from-training", "--env", "Pendulum-v1", "--expert-steps", "600")


def test_expert_is_trained_once_then_reused(store: Path, tmp_path: Path, cli) -> None:
    run = tmp_path / "ppo-run"
    args = [
        "collect",
        "--expert",
        "ppo",
        "--env",
        "CartPole-v1",
        "--expert-run",
        run,
        "--expert-steps",
        "2048",
        "--episodes",
        "3",
        "--num-envs",
        "2",
        "--store",
        store,
        "--quiet",
    ]
    first = cli(*args)
    assert first.code == 0, first.err
    meta = open_dataset("cartpole-expert", store).metadata
    assert meta["producer"]["algorithm"] == "ppo"
    assert meta["producer"]["checkpoint_sha256"] == load_policy(run).checkpoint_sha256
    weights = sorted(p for p in run.rglob("*") if p.is_file() and p.suffix in (".safetensors", ".pt"))
    stamps = [p.stat().st_mtime_ns for p in weights]
    assert weights
    again = cli(*args, "--name", "again")
    assert again.code == 0, again.err
    assert [p.stat().st_mtime_ns for p in weights] == stamps  # reused, not retrained
    assert open_dataset("again", store).metadata["content_hash"] == meta["content_hash"]  # deterministic expert
    assert_episodes_well_formed(load_dataset("cartpole-expert", store))
    # sampled actions (--stochastic) repeat with the seed, and differ with another one
    for name, seed in (("sampled", "0"), ("sampled-again", "0"), ("sampled-seed-1", "1")):
        assert cli(*args, "--stochastic", "--seed", seed, "--name", name).code == 0
    hashes = [open_dataset(name, store).metadata["content_hash"] for name in ("sampled", "sampled-again", "sampled-seed-1")]
    assert hashes[0] == hashes[1] != hashes[2]


def test_from_training_stores_every_transition(store: Path, tmp_path: Path, cli) -> None:
    result = cli(*SAC_FROM_TRAINING_600, "--expert-run", tmp_path / "sac-run", "--store", store, "--quiet")
    assert result.code == 0, result.err
    data = load_dataset("pendulum-mixed", store)
    assert len(data) == 600 and len(data.episode_starts()) == 3
    assert_episodes_well_formed(data)
    assert np.all(data.truncated[data.step == 199])
    meta = open_dataset("pendulum-mixed", store).metadata
    assert meta["producer"]["mode"] == "training-replay"
    assert meta["producer"]["checkpoint_sha256"] == load_policy(tmp_path / "sac-run").checkpoint_sha256


def test_expert_bad_input(store: Path, cli) -> None:
    for args, message in [
        (["--expert", "td3"], "unknown expert 'td3'"),
        (["--expert", "sac", "--from-training", "--episodes", "1"], "--from-training stores the whole training run"),
        (["--from-training"], "--from-training needs --expert"),
    ]:
        result = cli("collect", "--env", "Pendulum-v1", *args, "--store", store, "--quiet")
        assert result.code == 2 and message in result.err, result.err
    assert store_contents(store) == []


def test_default_expert_dir_is_never_overwritten_by_other_params(store: Path, tmp_path: Path, cli, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["collect", "--expert", "ppo", "--env", "CartPole-v1", "--episodes", "2", "--num-envs", "2", "--store", store, "--quiet"]
    assert cli(*args, "--expert-steps", "1024").code == 0
    weights = next(p for p in (tmp_path / "models" / "ppo-cartpole").rglob("*.safetensors"))
    before = weights.stat().st_mtime_ns
    assert cli(*args, "--expert-steps", "1024", "--name", "same").code == 0
    assert weights.stat().st_mtime_ns == before
    assert cli(*args, "--expert-steps", "1024", "--seed", "1", "--name", "more").code == 0
    assert weights.stat().st_mtime_ns == before  # the first dataset's expert is untouched ...
    first = open_dataset("cartpole-expert", store).metadata["producer"]
    assert first["checkpoint_sha256"] == load_policy(first["run_dir"]).checkpoint_sha256
    more = open_dataset("more", store).metadata["producer"]  # ... the new one has a dir of its own
    assert (
        Path(more["run_dir"]).name.startswith("ppo-cartpole-")
        and more["checkpoint_sha256"] == load_policy(more["run_dir"]).checkpoint_sha256
    )
    assert cli(*args, "--expert-steps", "1024", "--seed", "1", "--name", "again").code == 0  # found again by its hash
    assert open_dataset("again", store).metadata["producer"]["run_dir"] == more["run_dir"]
    wrong = cli(
        "collect",
        "--expert",
        "sac",
        "--env",
        "Pendulum-v1",
        "--expert-run",
        tmp_path / "models" / "ppo-cartpole",
        "--episodes",
        "1",
        "--store",
        store,
        "--quiet",
    )
    assert wrong.code == 2 and "holds a ppo run on CartPole-v1" in wrong.err


def test_expert_set_reaches_the_experts_training(store: Path, tmp_path: Path, cli) -> None:
    # A bar every evaluation clears stops the training run at its first evaluation (200 of 600
    # steps); the same settings without it store all 600 steps (the control).
    common = [
        *SAC_FROM_TRAINING_600,
        "--store",
        store,
        "--quiet",
        "--expert-set",
        "eval_every=200",
        "--expert-set",
        "eval_episodes=1",
        "--expert-set",
        "hidden=[16, 16]",
        "--expert-set",
        "heldout_eval_episodes=0",
    ]
    stopped = cli(*common, "--expert-set", "stop_at_return=-1e9", "--expert-run", tmp_path / "stopped", "--name", "stopped")
    full = cli(*common, "--expert-run", tmp_path / "full", "--name", "full")
    assert stopped.code == 0 and full.code == 0, stopped.err + full.err
    assert len(load_dataset("stopped", store)) == 200 and len(load_dataset("full", store)) == 600
    producer = open_dataset("stopped", store).metadata["producer"]
    assert producer["params"]["expert_settings"]["stop_at_return"] == -1e9
    assert load_policy(tmp_path / "stopped").config["hidden"] == [16, 16]


def test_expert_set_bad_input(store: Path, cli) -> None:
    for args, message in [
        (["--expert", "sac", "--expert-set", "hiden=[16]"], "unknown setting 'hiden'"),
        (["--expert", "sac", "--expert-set", "batch_size=many"], "setting batch_size='many': expected"),
        (["--expert", "sac", "--expert-set", "seed=3"], "--expert-set seed: use --seed"),
        (["--expert", "sac", "--expert-set", "env_steps=3"], "--expert-set env_steps: use --expert-steps"),
        (["--expert-set", "batch_size=64"], "--expert-set needs --expert"),
    ]:
        result = cli("collect", "--env", "Pendulum-v1", *args, "--episodes", "1", "--store", store, "--quiet")
        assert result.code == 2 and message in result.err and len(result.err.strip().splitlines()) == 1, result.err
    assert store_contents(store) == []
