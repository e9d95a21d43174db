"""The Python API (`rlpipe.api`, on the package itself): the functions check input as the
commands do, write what the commands write, and docs/python.md runs as printed."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import rlpipe
from rlpipe.errors import RlpipeError
from rlpipe.training.sampler import TransitionSampler
from tests.test_layers import torch_modules_after

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "python.md"


def test_the_package_names_the_api_and_imports_no_torch_for_it() -> None:
    import rlpipe.api

    assert sorted(rlpipe.api.__all__) == sorted(rlpipe.API) and set(rlpipe.API) <= set(dir(rlpipe))
    assert torch_modules_after("import rlpipe\nrlpipe.train, rlpipe.load_dataset, rlpipe.collect") == []
    with pytest.raises(AttributeError, match="no attribute 'trian'"):
        rlpipe.trian  # noqa: B018


def test_make_config_applies_the_tuned_defaults_then_checked_settings(offline_store: Path) -> None:
    config = rlpipe.make_config("cql", dataset="pendulum-mixed", store=offline_store, updates=300, batch_size=64)
    assert (config.env_id, config.dataset, config.updates, config.batch_size, config.hidden) == (
        "Pendulum-v1",
        "pendulum-mixed",
        300,
        64,
        (64, 64),
    )
    with pytest.raises(RlpipeError, match="unknown setting 'learning_rat'"):
        rlpipe.make_config("cql", dataset="pendulum-mixed", store=offline_store, learning_rat=1e-3)
    with pytest.raises(RlpipeError, match="setting updates='many': expected"):
        rlpipe.make_config("cql", dataset="pendulum-mixed", store=offline_store, updates="many")
    with pytest.raises(ValueError, match="offline algorithm: give dataset="):
        rlpipe.make_config("cql", env="Pendulum-v1")


def test_train_without_out_writes_nothing_and_with_out_writes_a_run(offline_store: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = rlpipe.make_config("bc", dataset="pendulum-mixed", store=offline_store, updates=50, eval_every=50, eval_episodes=2)
    result = rlpipe.train("bc", config)
    assert result.run_dir is None and list(tmp_path.iterdir()) == [] and result.history[-1].done == 50
    result = rlpipe.train("bc", config, out=tmp_path / "run", updates=60, heldout_eval_episodes=3)
    assert result.run_dir == tmp_path / "run" and result.metrics["gradient_updates"] == 60 and result.metrics["heldout_episodes"] == 3
    policy = rlpipe.load_policy(result.run_dir)
    assert (policy.algo, policy.env_id) == ("bc", "Pendulum-v1") and policy(np.zeros((4, 3), np.float32)).shape == (4, 1)
    by_path, by_policy = rlpipe.evaluate(result.run_dir, episodes=3, seed=7), rlpipe.evaluate(policy, episodes=3, seed=7)
    assert by_path.returns == by_policy.returns and len(by_path.returns) == 3 and by_path.lengths == [200] * 3
    with pytest.raises(RlpipeError, match="either a config or env/dataset/store"):
        rlpipe.train("bc", config, dataset="pendulum-mixed")
    with pytest.raises(RlpipeError, match="bc trains with a Config of rlpipe.algos.bc, not a Config"):
        rlpipe.train("bc", rlpipe.make_config("cql", dataset="pendulum-mixed", store=offline_store))
    for call, error, message in [
        (lambda: rlpipe.evaluate(policy, episodes=0), ValueError, "episodes=0: expected an integer from 1 to"),
        (lambda: rlpipe.evaluate(policy, episodes=2**70), ValueError, "episodes=1180591620717411303424: expected an integer from 1"),
        (lambda: rlpipe.evaluate(policy, seed=-1), ValueError, "seed=-1: expected an integer from 0"),
        (lambda: rlpipe.evaluate(5), TypeError, "policy=5: expected a LoadedPolicy"),
        (lambda: policy(np.zeros((4, 7), np.float32)), ValueError, r"obs of shape \(4, 7\) does not fit the bc policy of Pendulum-v1"),
        (lambda: rlpipe.make_config("ppo", env=5), TypeError, "env=5: expected a string or None"),
        (lambda: rlpipe.collect(5, episodes=1), TypeError, "env_id=5: expected a string"),
        (lambda: rlpipe.collect("CartPole-v1", episodes=2.5, store=tmp_path / "store"), TypeError, "episodes=2.5: expected an integer"),
        (lambda: rlpipe.collect("CartPole-v1", store=tmp_path / "store"), ValueError, "give exactly one of episodes= and steps="),
        (lambda: rlpipe.collect("NoSuchEnv-v0", episodes=1, store=tmp_path / "store"), ValueError, "unknown environment 'NoSuchEnv-v0'"),
        (lambda: rlpipe.make_config(2.5, env="CartPole-v1"), TypeError, "algo=2.5: expected a string"),
        (lambda: rlpipe.train(None, env="CartPole-v1"), TypeError, "algo=None: expected a string"),
        (lambda: rlpipe.make_config("sarsa", env="CartPole-v1"), ValueError, "unknown algorithm 'sarsa'; choose from"),
        (lambda: rlpipe.make_config("ppo"), ValueError, "ppo trains in an environment: give env="),
        (lambda: rlpipe.train("bc"), ValueError, r"bc is an offline algorithm: give dataset= \(rlpipe.list_datasets\(\) names them\)"),
        (lambda: rlpipe.train("bc", dataset="nothing", store=offline_store), ValueError, "dataset 'nothing' not found in"),
        (lambda: rlpipe.evaluate(tmp_path / "no-run"), ValueError, "no checkpoint in"),
        (lambda: rlpipe.make_config("bc", dataset="pendulum-mixed", store=5), TypeError, "store=5: expected a path"),
        (lambda: rlpipe.collect("CartPole-v1", episodes=1, store=5), TypeError, "store=5: expected a path"),
        (lambda: rlpipe.collect("CartPole-v1", episodes=1, name=5, store=tmp_path / "store"), TypeError, "name=5: expected a string"),
        (lambda: rlpipe.load_policy(5), TypeError, "run_dir=5: expected a path"),
        (lambda: rlpipe.train("bc", dataset="pendulum-mixed", store=offline_store, out=5), TypeError, "out=5: expected a path"),
        (lambda: rlpipe.sampler("pendulum-mixed", store=offline_store, frame_stack=0), ValueError, "frame_stack=0: expected an integer"),
        (lambda: rlpipe.make_config("bc", dataset="pendulum-mixed", store=offline_store, bogus=1), ValueError, "bogus"),
        (lambda: rlpipe.make_config("bc", dataset="pendulum-mixed", store=offline_store, batch_size=2**63), ValueError, "batch_size"),
        (lambda: rlpipe.train("bc", config, batch_size=2**63), ValueError, "batch_size"),
        (lambda: rlpipe.make_config("bc", dataset="pendulum-mixed", store=offline_store, learning_rate="x"), ValueError, "learning_rate"),
    ]:
        with pytest.raises(error, match=message):
            call()
    assert not (tmp_path / "store").exists()


def test_sampler_draws_what_the_transition_sampler_draws(offline_store: Path) -> None:
    data = rlpipe.load_dataset("pendulum-mixed", store=offline_store)
    ours = rlpipe.sampler("pendulum-mixed", store=offline_store, seed=3).sample(32)
    direct = TransitionSampler(data, seed=3).sample(32)
    assert torch.equal(ours.obs, direct.obs) and torch.equal(ours.actions, direct.actions) and ours.obs.shape == (32, 3)
    assert set(ours.actions.flatten().tolist()) <= set(np.asarray(data.action, np.float32).flatten().tolist())  # env units
    with pytest.raises(RlpipeError, match="no-such-data"):
        rlpipe.sampler("no-such-data", store=offline_store)
    sampler = rlpipe.sampler("pendulum-mixed", store=offline_store)
    for call, error, message in [
        (lambda: rlpipe.sampler("pendulum-mixed", store=offline_store, seed="x"), TypeError, "seed='x': expected an integer"),
        (lambda: rlpipe.sampler("pendulum-mixed", store=offline_store, device="tpu"), ValueError, "unknown device 'tpu'"),
        (lambda: sampler.sample(-1), ValueError, "batch_size=-1: expected an integer from 1 to"),
        (lambda: sampler.sample(10**12), ValueError, "batch_size=1000000000000: expected an integer from 1 to"),
    ]:
        with pytest.raises(error, match=message):
            call()
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device is available"):
            rlpipe.sampler("pendulum-mixed", store=offline_store, device="cuda")


def page_code() -> str:
    """docs/python.md's Python blocks, in order, as one script."""
    return "\n".join(re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), flags=re.M | re.S))


@pytest.mark.slow
def test_the_python_page_runs_as_printed(tmp_path: Path) -> None:
    """The page's code at smaller budgets (its three budget constants replaced), in a fresh
    interpreter in an empty directory: every block runs and leaves the files it says."""
    code = page_code()
    for name, value in {"EXPERT_STEPS": 1_500, "UPDATES": 300}.items():
        code, replaced = re.subn(rf"^{name} = [0-9_]+", f"{name} = {value}", code, flags=re.M)
        assert replaced == 1, name
    code = code.replace("episodes=50, seed=50_000", "episodes=5, seed=50_000").replace("over 50 episodes", "over 5 episodes")
    env = {k: v for k, v in os.environ.items() if k != "RLPIPE_DATASETS"}
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert re.search(r"held-out -?\d+\.\d over 100 episodes", run.stdout) and re.search(
        r"± \d+\.\d \(standard error over 5 episodes\)", run.stdout
    )
    assert (tmp_path / "datasets" / "pendulum-mixed" / "metadata.json").is_file()
    assert (tmp_path / "runs" / "cql-pendulum-mixed" / "metrics.json").is_file()


def api_reads(source: str) -> list[int]:
    """Lines of ``source`` that read an API attribute of the package (``rlpipe.train``, ...)."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "rlpipe" and node.attr in rlpipe.API
    ]


def test_no_rlpipe_module_reads_the_packages_api_attributes() -> None:
    """The pipeline's stage dependencies leave rlpipe.api out of what the package imports
    (rlpipe.commands.stage_deps): true while no module of rlpipe reads `rlpipe.<API name>`."""
    assert api_reads('import rlpipe\n"rlpipe.train in a string"\nrlpipe.train("cql")\n') == [3]  # control
    found = {path: api_reads(path.read_text()) for path in sorted((REPO / "rlpipe").rglob("*.py"))}
    assert not {path: lines for path, lines in found.items() if lines}
