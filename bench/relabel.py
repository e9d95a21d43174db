"""HER relabelling speed: `rlpipe relabel her` (future, k=4) on a 1M-transition GoalWorld dataset.

Goal: seconds, not minutes. The peer for the online loop (SB3's HerReplayBuffer)
is measured in bench/her_online.py; this one times the dataset transform alone.

    .venv/bin/python bench/relabel.py [--steps 1000000] [--k 4]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import _common  # noqa: F401  (thread limits before numpy/torch)
from _common import limit_threads, machine_description, table, today

from rlpipe.commands.collect import collect_dataset
from rlpipe.datasets.her import relabel_dataset
from rlpipe.datasets.store import open_dataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--k", type=int, default=4)
    args = parser.parse_args()
    limit_threads()
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp)
        start = time.perf_counter()
        collect_dataset("GoalWorld-v0", steps=args.steps, num_envs=16, name="goals", fmt="arrow", store=store, progress=False)
        collect_seconds = time.perf_counter() - start
        source = open_dataset("goals", store)
        rows = []
        for strategy in ("future", "final", "episode", "random"):
            start = time.perf_counter()
            relabel_dataset(source, f"goals-{strategy}", strategy=strategy, k=args.k, store=store)
            seconds = time.perf_counter() - start
            out_rows = open_dataset(f"goals-{strategy}", store).metadata["total_steps"]
            rows.append((strategy, f"{source.metadata['total_steps']:,}", f"{out_rows:,}", f"{seconds:.2f}", f"{out_rows / seconds:,.0f}"))
    print(f"{today()} — {machine_description()}")
    print(f"source: GoalWorld-v0 random policy, {source.metadata['total_steps']:,} transitions (collected in {collect_seconds:.1f} s)")
    print(table(["strategy", "source rows", "written rows", "seconds", "rows written/s"], rows))


if __name__ == "__main__":
    main()
