"""One offline run across processes (`rlpipe train ALGO --dataset D --nproc N`): what it learns and
what it costs against one process, at the same global batch.

``returns``: BC, TD3+BC and IQL on a dataset (the tests' `pendulum-mixed`: every transition of a
10k-step SAC run) at the learning tests' budgets, seeds given, at 1 and 2 processes: each run's
held-out return (100 episodes) and the largest resident set of any of its processes; prints the
mean ± standard error per algorithm and process count, and the gap in standard errors.

``speed``: updates/s of the same algorithms on a random Pendulum dataset at 1 and 2 processes
(one torch thread each). On a 2-core machine this measures the overhead of splitting a batch
and averaging gradients (gloo over loopback), not a speed-up: each rank does half the rows of a
small network, and the all-reduce is paid every optimiser step.

    .venv/bin/python bench/data_parallel.py returns --store DIR --dataset pendulum-mixed --seeds 0-4
    .venv/bin/python bench/data_parallel.py returns --store suites/d4rl-cpu/datasets \
        --dataset hopper-medium --algos bc --updates 10000 --seeds 0-4     # a Hopper dataset
    .venv/bin/python bench/data_parallel.py speed
    .venv/bin/python bench/data_parallel.py speed --quick     # a few updates: checks it runs
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import _common  # noqa: F401  (sets thread limits before numpy/torch are imported)
from _common import machine_description, random_dataset, table, today

# The learning tests' budgets on pendulum-mixed (tests/test_offline_rl_beats_bc.py).
BUDGETS = {"bc": 2000, "td3bc": 8000, "iql": 6000}


def train(algo: str, store: Path, dataset: str, out: Path, updates: int, seed: int, nproc: int, heldout: int) -> dict:
    """One `rlpipe train` run in a child process: its metrics, and the largest resident set
    (MiB) of any one process of it (the launcher's ranks included: `wait4` reports the
    largest over the child's tree)."""
    command = [sys.executable, "-m", "rlpipe", "train", algo, "--dataset", dataset, "--store", str(store), "--out", str(out)]
    settings = {"eval_every": updates, "eval_episodes": 1, "heldout_eval_episodes": heldout}
    for key, value in settings.items():
        command += ["--set", f"{key}={value}"]
    command += ["--updates", str(updates), "--seed", str(seed), "--nproc", str(nproc), "--device", "cpu", "--no-progress"]
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    if status != 0:
        raise SystemExit(f"{' '.join(command)} failed: {child.stderr.read().decode() if child.stderr else ''}")
    metrics = json.loads((out / "metrics.json").read_text())
    return {**metrics, "peak_rss_mib": round(usage.ru_maxrss / 1024, 1)}


def mean_se(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")


def seeds_of(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def returns(args: argparse.Namespace) -> dict:
    budget = {algo: args.updates or BUDGETS[algo] for algo in args.algos.split(",")}
    rows, runs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for algo in args.algos.split(","):
            for nproc in (1, 2):
                values = []
                for seed in seeds_of(args.seeds):
                    m = train(algo, args.store, args.dataset, Path(tmp) / f"{algo}-{nproc}-{seed}", budget[algo], seed, nproc, 100)
                    values.append(m["heldout_return_mean"])
                    runs.append(
                        {
                            "algo": algo,
                            "nproc": nproc,
                            "seed": seed,
                            "heldout_return_mean": m["heldout_return_mean"],
                            "heldout_length_mean": m["heldout_length_mean"],
                            "wall_seconds": m["wall_seconds"],
                            "peak_rss_mib": m["peak_rss_mib"],
                        }
                    )
                    print(f"{algo} nproc={nproc} seed={seed}: held-out {m['heldout_return_mean']:.1f}", flush=True)
                mean, se = mean_se(values)
                rows.append([algo, nproc, budget[algo], f"{mean:.1f} ± {se:.1f}", ", ".join(f"{v:.1f}" for v in values)])
    print(table(["algorithm", "processes", "updates", "held-out return", "per seed"], rows))
    for algo in args.algos.split(","):
        one = [r["heldout_return_mean"] for r in runs if r["algo"] == algo and r["nproc"] == 1]
        two = [r["heldout_return_mean"] for r in runs if r["algo"] == algo and r["nproc"] == 2]
        (m1, se1), (m2, se2) = mean_se(one), mean_se(two)
        gap = m2 - m1
        print(
            f"{algo}: 2 processes - 1 process = {gap:+.1f}: {gap / se1:+.2f} standard errors of one process, {gap / math.hypot(se1, se2):+.2f} of the gap"
        )
    return {"dataset": args.dataset, "seeds": args.seeds, "updates": budget, "runs": runs}


def speed(args: argparse.Namespace) -> dict:
    updates = 50 if args.quick else args.updates or 3000
    rows, results = [], []
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "datasets"
        random_dataset(store, "Pendulum-v1", "pendulum-random", 20_000)
        for algo in args.algos.split(","):
            rate = {}
            for nproc in (1, 2):
                m = train(algo, store, "pendulum-random", Path(tmp) / f"{algo}-{nproc}", updates, 0, nproc, 0)
                rate[nproc] = updates / m["wall_seconds"]
                results.append({"algo": algo, "nproc": nproc, "updates_per_s": round(rate[nproc], 1), "peak_rss_mib": m["peak_rss_mib"]})
            peak = {r["nproc"]: r["peak_rss_mib"] for r in results if r["algo"] == algo}
            rows.append([algo, f"{rate[1]:.0f}", f"{rate[2]:.0f}", f"{rate[2] / rate[1]:.2f}", peak[1], peak[2]])
    print(
        table(["algorithm", "1 process (updates/s)", "2 processes (updates/s)", "ratio", "peak RSS, 1 (MiB)", "peak RSS per rank, 2"], rows)
    )
    return {"updates": updates, "runs": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["returns", "speed"])
    parser.add_argument("--algos", default="bc,td3bc,iql")
    parser.add_argument("--store", type=Path, help="returns: the store holding --dataset")
    parser.add_argument("--dataset", default="pendulum-mixed")
    parser.add_argument("--seeds", default="0-4")
    parser.add_argument("--updates", type=int, help="updates per run (speed: 3000; returns: the learning tests' budgets)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    result = returns(args) if args.what == "returns" else speed(args)
    result.update(date=today(), machine=machine_description(), what=args.what)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
