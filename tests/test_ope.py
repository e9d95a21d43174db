"""Fitted Q Evaluation: estimates from data alone rank policies as their true returns do."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from rlpipe.algos import load_policy
from rlpipe.commands.ope import FQEConfig, fitted_q_evaluation
from rlpipe.commands.report import spearman
from rlpipe.datasets.loader import load_dataset
from rlpipe.training.evaluation import evaluate

# Fractions of the expert's torque: eight deterministic policies from swing-up to hanging.
TORQUE_SHARES = (1.0, 0.8, 0.65, 0.5, 0.4, 0.3, 0.15, 0.0)


@pytest.mark.slow
@pytest.mark.heavy
def test_fqe_ranks_eight_pendulum_policies_like_their_true_returns(offline_store: Path, learning_seed: int, record_property) -> None:
    """The offline store's SAC run (10k steps) with its torque scaled down: true returns from
    50 held-out episodes each, FQE estimates from pendulum-mixed (that run's replay)."""
    expert = load_policy(offline_store.parent / "models" / "sac-mixed")
    data = load_dataset("pendulum-mixed", offline_store)
    policies = [
        dataclasses.replace(expert, _fn=lambda obs, share=share: (share * expert(obs)).astype(np.float32)) for share in TORQUE_SHARES
    ]
    true = [evaluate(policy, "Pendulum-v1", episodes=50, seed=10_000).mean for policy in policies]
    estimates = [result.estimate for result in fitted_q_evaluation(policies, data, FQEConfig(seed=learning_seed))]
    correlation = spearman(true, estimates)
    record_property("true_returns", [round(r, 1) for r in true])
    record_property("fqe_estimates", [round(e, 1) for e in estimates])
    record_property("spearman", correlation)
    assert correlation >= 0.8, (true, estimates)


def test_fqe_command_prints_an_estimate_and_refuses_another_env(cli, tmp_path: Path) -> None:
    store = tmp_path / "datasets"
    assert cli("collect", "--env", "Pendulum-v1", "--episodes", "4", "--num-envs", "2", "--store", store, "--quiet").code == 0
    assert cli("collect", "--env", "CartPole-v1", "--episodes", "4", "--num-envs", "2", "--store", store, "--quiet").code == 0
    run = tmp_path / "td3"
    assert (
        cli(
            "train",
            "td3",
            "--env",
            "Pendulum-v1",
            "--env-steps",
            "300",
            "--set",
            "learning_starts=100",
            "--out",
            run,
            "--no-progress",
            "--device",
            "cpu",
            "--set",
            "eval_episodes=1",
        ).code
        == 0
    )
    out = tmp_path / "ope" / "fqe.json"  # its folder is made
    result = cli("ope", "fqe", run, "--dataset", "pendulum-random", "--store", store, "--updates", "50", "--json", "--out", out)
    assert result.code == 0, result.err
    (report,) = json.loads(result.out)
    assert json.loads(out.read_text()) == [report]  # the file `rlpipe report --ope` reads
    assert report["initial_states"] == 4 and np.isfinite(report["estimate"]) and report["config"]["updates"] == 50
    wrong = cli("ope", "fqe", run, "--dataset", "cartpole-random", "--store", store)
    assert wrong.code == 2 and "CartPole-v1" in wrong.err and len(wrong.err.strip().splitlines()) == 1
