"""Sweep grids and summaries, and collection split into tasks (local worker processes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlpipe.algos import get_algo
from rlpipe.commands.collect import collect_dataset
from rlpipe.commands.sweep import bootstrap_interval, parse_grid, parse_seeds, plan_trials, setting_name, summarize
from rlpipe.commands.tasks import plan_tasks
from rlpipe.datasets.store import list_datasets
from rlpipe.errors import RlpipeError


def test_seeds_and_grid_are_parsed_and_typed() -> None:
    assert parse_seeds("0-4") == [0, 1, 2, 3, 4]
    assert parse_seeds("0-1,7") == [0, 1, 7]
    with pytest.raises(RlpipeError):
        parse_seeds("0-1,1")
    sac = get_algo("sac").config_class
    grid = parse_grid(["actor_lr=3e-4,1e-3", "hidden=[64, 64],[256, 256]"], sac)
    assert grid == {"actor_lr": [3e-4, 1e-3], "hidden": [(64, 64), (256, 256)]}
    with pytest.raises(RlpipeError, match="expected"):
        parse_grid(["batch_size=64,big"], sac)
    trials = plan_trials(grid, [0, 1], Path("root"))
    assert len(trials) == 8 and trials[0].run_dir == Path("root/runs/actor_lr=0.0003,hidden=[64,64]/seed-0")
    assert setting_name({}) == "default"


def test_summary_statistics_over_seeds() -> None:
    trials = plan_trials({}, [0, 1, 2], Path("r"))
    summary = summarize(trials, [{"eval_return_mean": v} for v in (1.0, 2.0, 6.0)])["default"]
    assert summary["return_mean"] == 3.0 and summary["return_std"] == pytest.approx(2.6457513)
    assert 1.0 <= summary["return_ci95_low"] < 3.0 < summary["return_ci95_high"] <= 6.0
    assert bootstrap_interval([5.0, 5.0, 5.0]) == (5.0, 5.0)  # control: no spread, no width
    assert summary["metric"] == "eval_return_mean"


def test_summary_prefers_the_heldout_evaluation() -> None:
    trials = plan_trials({}, [0, 1], Path("r"))
    metrics = [{"eval_return_mean": 0.0, "heldout_return_mean": v} for v in (-150.0, -170.0)]
    summary = summarize(trials, metrics)["default"]
    assert summary["return_mean"] == -160.0 and summary["metric"] == "heldout_return_mean"


def test_task_split_depends_on_the_budget_only(tmp_path: Path) -> None:
    tasks = plan_tasks(120, None, 0, tmp_path)
    assert [t.episodes for t in tasks] == [40, 40, 40]
    assert len({t.seed for t in tasks}) == 3
    assert [t.seed for t in plan_tasks(120, None, 0, tmp_path)] == [t.seed for t in tasks]
    assert [t.steps for t in plan_tasks(None, 25_000, 0, tmp_path)] == [8334, 8333, 8333]


def _files(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_local_workers_give_the_same_bytes_for_any_number(tmp_path: Path) -> None:
    budget = dict(episodes=60, num_envs=2, seed=3, name="cartpole", progress=False, backend="local")
    two = collect_dataset("CartPole-v1", store=tmp_path / "two", workers=2, **budget)
    one = collect_dataset("CartPole-v1", store=tmp_path / "one", workers=1, **budget)
    assert two.metadata["total_episodes"] == 60
    assert _files(two.path) == _files(one.path)


def kill_driver_after_its_first_task(store: Path, backend_args: str, env: dict[str, str] | None = None) -> None:
    """Start a 200k-step collection with ``backend_args`` in a subprocess, SIGKILL it once a
    task's shard exists, and check that the store shows no dataset."""
    script = (
        "import sys; from rlpipe.commands.collect import collect_dataset; "
        f"collect_dataset('CartPole-v1', steps=200_000, num_envs=2, name='big', store=sys.argv[1], progress=False, {backend_args})"
    )
    driver = subprocess.Popen([sys.executable, "-c", script, str(store)], env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not list(store.glob(".tmp-*-big/tasks/task-*")) and time.monotonic() < deadline:  # a task finished
            time.sleep(0.2)
        assert list(store.glob(".tmp-*-big/tasks/task-*")), "no task finished in time"
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    assert list_datasets(store) == []
    assert not (store / "big").exists()


@pytest.mark.slow
def test_a_killed_driver_leaves_no_dataset(tmp_path: Path) -> None:
    kill_driver_after_its_first_task(tmp_path / "store", "workers=1")
