"""What logging an update's diagnostics costs: updates/s of BC, TD3+BC, IQL and CQL as
`rlpipe train` steps them (bench/offline.py's captured updates: 256x256 networks, batch 256,
Pendulum), with each update's diagnostics summed into `rlpipe.training.diagnostics.Diagnostics`
as the training loops do, against the same updates whose diagnostics are dropped. Alternating
blocks of updates, median of the repeats; prints the slowdown (the goal: at most 2%).

    .venv/bin/python bench/diagnostics.py             # four algorithms, 5 repeats of 300 updates
    .venv/bin/python bench/diagnostics.py --quick     # a few updates: checks it runs
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import _common  # noqa: F401  (sets thread limits before numpy/torch are imported)
from _common import limit_threads, machine_description, median, random_dataset, table, today
from offline import BATCH, ENV_ID, HIDDEN, NAME, captured_update

from rlpipe.training.diagnostics import Diagnostics
from rlpipe.training.graphs import UpdateStepper


def updates_per_s(step: UpdateStepper, updates: int, diagnostics: Diagnostics | None) -> float:
    """Updates/s over ``updates`` updates, their diagnostics added to ``diagnostics`` (None: dropped)."""
    start = time.perf_counter()
    for done in range(updates):
        step(done)
        if diagnostics is not None:
            diagnostics.add(step.last)
    if diagnostics is not None:
        diagnostics.take(updates)  # the host sync an evaluation makes
    return updates / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", default="bc,td3bc,iql,cql")
    parser.add_argument("--updates", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    limit_threads()
    updates, repeats = (5, 1) if args.quick else (args.updates, args.repeats)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        store = Path(folder)
        random_dataset(store, ENV_ID, NAME, 20_000)
        for algo in args.algos.split(","):
            sizes = dict(hidden=(HIDDEN, HIDDEN), batch_size=BATCH, **({"num_sampled_actions": 10} if algo == "cql" else {}))
            sampler, update, batch_size = captured_update(algo, store, overrides=sizes)
            step = UpdateStepper(update, sampler, batch_size, total=10**9)
            step(0)
            logged, dropped = [], []
            for _ in range(repeats):
                logged.append(updates_per_s(step, updates, Diagnostics("updates")))
                dropped.append(updates_per_s(step, updates, None))
            with_logging, without = median(logged), median(dropped)
            rows.append([algo, f"{without:.0f}", f"{with_logging:.0f}", f"{100 * (without / with_logging - 1):+.1f}%"])
    print(f"# {today()} {machine_description()}; {updates} updates x {repeats} repeats, one thread")
    print(table(["algo", "updates/s dropped", "updates/s logged", "slowdown"], rows))


if __name__ == "__main__":
    main()
