"""Scaling collection over workers: stored steps/s with 1 and 2 workers, local worker
processes and Ray tasks, and Ray's overhead per task.

CartPole-v1, uniform random actions, 16 envs per task, `--steps` transitions split into
tasks of 10,000 steps (rlpipe.commands.tasks). Rates are stored transitions per second of
wall time for the whole `collect_dataset` call (task start-up, the driver adopting shards,
metadata, rename); the Ray rows exclude `ray.init` (one local Ray, started first). The Ray
overhead per task is the wall time of `--noop` empty tasks divided by their number.

    .venv/bin/python bench/scale.py            # 80k steps per row, 200 empty tasks
    .venv/bin/python bench/scale.py --quick    # 20k steps

Needs the `ray` extra: pip install -c constraints.txt -e '.[dev,ray]'
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from rlpipe.commands.cluster import ensure_ray
from rlpipe.commands.collect import collect_dataset


def rate(steps: int, backend: str, workers: int, root: Path) -> float:
    start = time.perf_counter()
    result = collect_dataset(
        "CartPole-v1",
        steps=steps,
        num_envs=16,
        name=f"{backend}-{workers}",
        store=root,
        fmt="arrow",
        progress=False,
        backend=backend,
        workers=workers,
    )
    return result.metadata["total_steps"] / (time.perf_counter() - start)


def ray_overhead(tasks: int) -> float:
    ray = ensure_ray(2)
    noop = ray.remote(num_cpus=1)(lambda: None)
    ray.get([noop.remote() for _ in range(10)])  # warm the workers
    start = time.perf_counter()
    ray.get([noop.remote() for _ in range(tasks)])
    return (time.perf_counter() - start) / tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--noop", type=int, default=200)
    args = parser.parse_args()
    steps = 20_000 if args.quick else 80_000
    start = time.perf_counter()
    ensure_ray(2)
    print(f"ray.init (local, 2 CPUs): {time.perf_counter() - start:.1f} s")
    with tempfile.TemporaryDirectory() as tmp:
        for backend in ("local", "ray"):
            for workers in (1, 2):
                print(f"{backend:5} {workers} worker(s): {rate(steps, backend, workers, Path(tmp)):>9,.0f} steps/s ({steps:,} steps)")
    print(f"ray overhead per empty task: {ray_overhead(args.noop) * 1e3:.2f} ms ({args.noop} tasks)")


if __name__ == "__main__":
    main()
