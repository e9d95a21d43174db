"""Collection split into tasks, run by worker processes (``--backend local``) or Ray tasks
(``--backend ray``), committed by the driver.

The split depends only on the budget: ``ceil(budget / task_size)`` tasks, each with an even
share of it (:func:`plan_tasks`) and a seed spawned from ``(seed, task index)`` by numpy's
``SeedSequence``. Workers only execute tasks, so the dataset's bytes are the same for any
number of workers and either backend. Each task writes a small Arrow-only dataset into
the driver's hidden temporary directory (``TEMP/tasks/task-NNNNN``, itself written
atomically, so a retried task replaces a half-written one); the driver then adopts the
tasks' shards in task order (episode ids renumbered), writes metadata.json and renames
into place (:class:`~rlpipe.datasets.writer.DatasetWriter`). A driver killed mid-way
leaves only the hidden directory: no dataset that looks complete.
"""

from __future__ import annotations

import multiprocessing
import shutil
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from rlpipe.datasets.collector import RandomPolicy, collect, split_evenly
from rlpipe.datasets.store import METADATA_FILE, STEPS_DIR
from rlpipe.datasets.writer import DatasetWriter
from rlpipe.errors import RlpipeError
from rlpipe.storage.files import loads_json

BACKENDS = ("local", "ray")
TASK_EPISODES = 50  # episodes per task (an episodes budget)
TASK_STEPS = 10_000  # steps per task (a steps budget)
TASK_RETRIES = 3  # Ray re-runs a task whose worker died or which raised this many times
TASKS_DIR = "tasks"


@dataclass(frozen=True)
class CollectTask:
    """One task's share of a collection: its budget, seed and where its shards go."""

    index: int
    episodes: int | None
    steps: int | None
    seed: int
    out: Path  # the tasks directory inside the dataset's temporary directory

    @property
    def name(self) -> str:
        return f"task-{self.index:05d}"


@dataclass(frozen=True)
class TaskPolicy:
    """The behaviour policy a task rebuilds: random, or an expert run loaded from disk."""

    expert_run: str | None = None
    deterministic: bool = True

    def make(self, action_space: gym.Space, num_envs: int, seed: int) -> Any:
        if self.expert_run is None:
            return RandomPolicy(action_space, num_envs, seed=seed)
        from rlpipe.algos import load_policy
        from rlpipe.training.seeding import seed_everything

        policy = load_policy(self.expert_run, deterministic=self.deterministic)
        seed_everything(seed, torch_threads=None)  # the task's own seed: its sampled actions repeat with it
        return policy


def plan_tasks(episodes: int | None, steps: int | None, seed: int, out: Path, task_size: int | None = None) -> list[CollectTask]:
    """The tasks of a budget: ``ceil(budget / task_size)`` even shares, seeds spawned from ``seed``."""
    budget = episodes if episodes is not None else steps
    if budget is None or budget < 1:
        raise RlpipeError("give exactly one of --episodes and --steps (at least 1)")
    size = task_size or (TASK_EPISODES if episodes is not None else TASK_STEPS)
    shares = split_evenly(budget, -(-budget // size))
    seeds = [int(child.generate_state(1)[0]) for child in np.random.SeedSequence(seed).spawn(len(shares))]
    return [
        CollectTask(i, int(share) if episodes is not None else None, int(share) if steps is not None else None, seeds[i], out)
        for i, share in enumerate(shares)
    ]


def run_task(task: CollectTask, env_id: str, policy: TaskPolicy, num_envs: int, writer_args: dict[str, Any]) -> Path:
    """Collect one task's share into ``task.out/task-NNNNN`` (replacing an earlier attempt); returns its directory."""
    with DatasetWriter(task.name, store=task.out, fmt="arrow", force=True, **writer_args) as writer:
        collect(
            env_id,
            lambda space, n: policy.make(space, n, task.seed),
            writer.write,
            episodes=task.episodes,
            steps=task.steps,
            num_envs=num_envs,
            seed=task.seed,
            show_progress=False,
            info_space=writer_args["info_space"],
        )
        return writer.finalize({"task": task.index})


def _run_local(tasks: Sequence[CollectTask], workers: int, args: tuple) -> list[Path]:
    # spawn, not fork: torch and the envs start clean in each worker
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(run_task, tasks, *([arg] * len(tasks) for arg in args)))


def _run_ray(tasks: Sequence[CollectTask], workers: int, args: tuple) -> list[Path]:
    from rlpipe.commands.cluster import ensure_ray

    ray = ensure_ray(workers)
    remote = ray.remote(num_cpus=1, max_retries=TASK_RETRIES, retry_exceptions=True)(run_task)
    shared = [ray.put(arg) for arg in args]
    pending: dict[Any, int] = {}
    done: dict[int, Path] = {}
    queue = list(tasks)
    while queue or pending:
        while queue and len(pending) < workers:  # at most `workers` tasks in flight
            task = queue.pop(0)
            pending[remote.remote(task, *shared)] = task.index
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            done[pending.pop(ref)] = ray.get(ref)
    return [done[task.index] for task in tasks]


def collect_tasks(
    writer: DatasetWriter,
    env_id: str,
    policy: TaskPolicy,
    *,
    episodes: int | None,
    steps: int | None,
    seed: int,
    num_envs: int,
    backend: str,
    workers: int,
    task_size: int | None = None,
) -> tuple[int, float]:
    """Run the tasks of the budget on ``backend`` with ``workers`` at once, and adopt their
    shards into ``writer`` in task order; returns the number of tasks and the mean episode return."""
    if backend not in BACKENDS:
        raise RlpipeError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    out = writer.temp_path.resolve() / TASKS_DIR  # Ray workers run in other directories
    tasks = plan_tasks(episodes, steps, seed, out, task_size)
    writer_args = {
        "observation_space": writer.observation_space,
        "action_space": writer.action_space,
        "env_id": writer.env_id,
        "info_space": writer.info_space,
    }
    args = (env_id, policy, num_envs, writer_args)
    workers = max(1, min(workers, len(tasks)))
    task_dirs = _run_ray(tasks, workers, args) if backend == "ray" else _run_local(tasks, workers, args)
    episodes_and_returns = []
    for task_dir in task_dirs:
        meta = loads_json((Path(task_dir) / METADATA_FILE).read_text())
        episodes_and_returns.append((meta["total_episodes"], meta["episode_return"]["mean"]))
        for shard in sorted((Path(task_dir) / STEPS_DIR).glob("*.arrow")):
            writer.adopt_shard(shard)
    shutil.rmtree(out)
    counts, means = np.array(episodes_and_returns).T
    return len(tasks), float(np.dot(counts, means) / counts.sum())


__all__ = ["BACKENDS", "CollectTask", "TaskPolicy", "collect_tasks", "plan_tasks", "run_task"]
