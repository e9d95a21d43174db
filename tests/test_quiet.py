"""Normal use prints no library warnings: the quickstart's commands (docs/index.md), run as a
user runs them, through the installed `rlpipe` console script with Python's default warning
filters, leave nothing on stderr that reads as a warning (progress bars go there too, so the
check looks for warning text, not for an empty stderr)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

RLPIPE = Path(sys.executable).parent / "rlpipe"
# What Python's warnings module prints ("file:line: UserWarning: ...", then the source line),
# what a library prints with print(): a "notice", gymnasium-robotics' Adroit reward notice.
WARNING_TEXT = re.compile(r"warning\b|warn\(|notice|AdroitHand", re.IGNORECASE)


def _user_env() -> dict[str, str]:
    """The environment of a user's shell: Python's default warning filters, the default store."""
    return {key: value for key, value in os.environ.items() if key not in ("PYTHONWARNINGS", "RLPIPE_DATASETS")}


def _run_quietly(cwd: Path, *args: str) -> str:
    """Run `rlpipe ARGS...` in ``cwd``; fail on a non-zero exit or on warning text on stderr."""
    result = subprocess.run([str(RLPIPE), *args], cwd=cwd, env=_user_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"rlpipe {' '.join(args)} exited {result.returncode}:\n{result.stderr}"
    warned = [line for line in result.stderr.splitlines() if WARNING_TEXT.search(line)]
    assert not warned, f"rlpipe {' '.join(args)} printed warnings:\n{result.stderr}"
    return result.stdout


def test_warning_text_is_recognised() -> None:
    """Control: what torch, the warnings module and gymnasium-robotics print is caught."""
    printed = [
        "/x/evaluation.py:51: UserWarning: The given NumPy array is not writable, and PyTorch does not support",
        "  warnings.warn(",
        "/x/y.py:3: DeprecationWarning: use z",
        "AdroitHandRelocateDense-v1, AdroitHandHammerDense-v1 environment's reward functions were updated",
    ]
    assert all(WARNING_TEXT.search(line) for line in printed)
    assert not WARNING_TEXT.search("training cql  45% ━━━━━━━━━━━━━━━━━━╸  90/200 412 steps/s return -1038.5")


@pytest.mark.slow
def test_quickstart_prints_no_warnings(tmp_path: Path) -> None:
    """The quickstart at small budgets: collect from an expert's training, inspect, train CQL
    offline, evaluate, export, estimate with FQE, report (about 2 CPU-minutes)."""
    budgets = ["--set", "eval_every=50", "--set", "eval_episodes=2", "--set", "heldout_eval_episodes=2"]
    steps = [
        ["collect", "--expert", "sac", "--env", "Pendulum-v1", "--from-training", "--expert-steps", "500", "--name", "pendulum-mixed"],
        ["datasets", "list"],
        ["datasets", "inspect", "pendulum-mixed"],
        ["train", "cql", "--dataset", "pendulum-mixed", "--out", "runs/cql", "--updates", "100", *budgets],
        ["eval", "runs/cql", "--episodes", "2", "--seed", "20000", "--json"],
        ["ope", "fqe", "runs/cql", "--dataset", "pendulum-mixed", "--out", "fqe.json", "--updates", "50"],
        ["report", "runs/*", "--out", "report", "--datasets", "datasets", "--ope", "fqe.json"],
    ]
    if importlib.util.find_spec("onnx") is not None:  # the deploy extra
        steps.insert(5, ["export", "runs/cql", "--onnx", "cql.onnx"])
    for args in steps:
        _run_quietly(tmp_path, *args)
    assert (tmp_path / "report" / "index.html").is_file()


@pytest.mark.heavy  # with the quickstart above in the default suite, these two run with the heavy tests
def test_discrete_evaluation_and_fqe_print_no_warnings(tmp_path: Path) -> None:
    """A discrete env's dataset and policy (integer actions, CartPole's numpy-batched vector env)."""
    _run_quietly(tmp_path, "collect", "--env", "CartPole-v1", "--episodes", "10", "--name", "cartpole-random")
    _run_quietly(
        tmp_path, "train", "bc", "--dataset", "cartpole-random", "--out", "runs/bc", "--updates", "50", "--set", "heldout_eval_episodes=2"
    )
    _run_quietly(tmp_path, "eval", "runs/bc", "--episodes", "2")
    _run_quietly(tmp_path, "ope", "fqe", "runs/bc", "--dataset", "cartpole-random", "--updates", "20")


@pytest.mark.heavy
def test_robotics_envs_print_no_adroit_notice(tmp_path: Path) -> None:
    """Importing gymnasium-robotics prints a notice about its Adroit envs' rewards
    (`python -c "import gymnasium_robotics"` shows it); users of the other robotics envs
    (FetchReach here) do not see it."""
    if importlib.util.find_spec("gymnasium_robotics") is None:
        pytest.skip("needs the robotics extra")
    _run_quietly(tmp_path, "collect", "--env", "FetchReach-v4", "--episodes", "1", "--name", "fetch-random")
