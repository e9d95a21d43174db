"""What `--set precision=bf16` buys: updates/s of BC, TD3+BC, IQL, CQL and SAC in float32 and
under bfloat16 autocast (rlpipe.training.optim.mixed_precision, as `rlpipe train` wraps its
updates), at the D4RL sizes of bench/update_flops.py (256x256, batch 256, Hopper's 11-d
observations and 3-d actions, CQL with 10 sampled actions), one torch thread.

The two precisions run the same update in alternating blocks (the median of the repeats), so
a load that shifts during the run shifts both. Whether bf16 is faster depends on the CPU: AMX
(Intel Sapphire Rapids and later) and AVX512-BF16 (AMD Zen 4) multiply bfloat16 natively;
elsewhere torch emulates it and it is slower. The script prints the CPU's flags.

    .venv/bin/python bench/precision.py             # five updates, 5 repeats of 200 updates
    .venv/bin/python bench/precision.py --quick     # a few updates: checks it runs

With ``--learning DATASET`` it instead trains BC, TD3+BC and IQL on that dataset at the main
pipeline's budgets (params.yaml's bc-pendulum-mixed, td3bc-pendulum and iql-pendulum) in both
precisions on each of ``--seeds`` and prints the held-out returns, mean and standard error:

    .venv/bin/python bench/precision.py --learning pendulum-mixed --store datasets --seeds 0-4
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import _common  # noqa: F401  (sets thread limits before numpy/torch are imported)
import numpy as np
import torch
from _common import limit_threads, machine_description, median, table, today, versions
from update_flops import Step, algorithm_steps

from rlpipe.training.optim import autocast

ALGOS = ("bc", "td3bc", "iql", "cql", "sac")
# The main pipeline's budgets for its pendulum-mixed stages (params.yaml).
LEARNING_UPDATES = {"bc": 5_000, "td3bc": 10_000, "iql": 20_000}


def bf16_flags() -> str:
    """The CPU's bfloat16 instructions (from /proc/cpuinfo), or 'none'."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return "unknown"
    found = sorted(flags & {"amx_bf16", "avx512_bf16"})
    return ",".join(found) or "none"


def updates_per_s(step: Step, start: int, updates: int, precision: str) -> float:
    device = torch.device("cpu")
    began = time.perf_counter()
    for i in range(start, start + updates):
        with autocast(precision, device):  # type: ignore[arg-type]  # "fp32" or "bf16"
            step(i)
    return updates / (time.perf_counter() - began)


def seed_list(text: str) -> list[int]:
    """``0-4`` or ``0,3,5``."""
    if "-" in text:
        first, last = text.split("-")
        return list(range(int(first), int(last) + 1))
    return [int(seed) for seed in text.split(",")]


def learning(dataset: str, store: str, seeds: list[int], algos: list[str]) -> dict[str, dict[str, list[float]]]:
    """Held-out returns of ``algos`` (of BC, TD3+BC and IQL) on ``dataset``: algo -> precision -> one per seed."""
    import rlpipe

    found: dict[str, dict[str, list[float]]] = {}
    for algo in algos:
        updates = LEARNING_UPDATES[algo]
        found[algo] = {"fp32": [], "bf16": []}
        for seed in seeds:
            for precision, returns in found[algo].items():
                result = rlpipe.train(algo, dataset=dataset, store=store, seed=seed, updates=updates, precision=precision)
                returns.append(result.metrics["heldout_return_mean"])
                print(f"{algo} seed {seed} {precision}: {returns[-1]:.1f}", flush=True)
    return found


def mean_se(values: list[float]) -> tuple[float, float]:
    array = np.asarray(values)
    return float(array.mean()), float(array.std(ddof=1) / np.sqrt(len(array))) if len(array) > 1 else 0.0


def print_learning(dataset: str, found: dict[str, dict[str, list[float]]]) -> None:
    rows = []
    for algo, by_precision in found.items():
        (fp32, fp32_se), (bf16, bf16_se) = mean_se(by_precision["fp32"]), mean_se(by_precision["bf16"])
        rows.append([algo, LEARNING_UPDATES[algo], f"{fp32:.1f} ± {fp32_se:.1f}", f"{bf16:.1f} ± {bf16_se:.1f}", f"{bf16 - fp32:+.1f}"])
    seeds = len(next(iter(found.values()))["fp32"])
    print(f"\n{today()}  {machine_description()}  bf16 instructions: {bf16_flags()}")
    print(f"{dataset}, {seeds} seeds, held-out return (100 episodes a run), mean ± standard error\n")
    print(table(["algo", "updates", "fp32", "bf16", "bf16 - fp32"], rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", help="comma-separated: " + ", ".join(ALGOS) + " (with --learning: bc, td3bc, iql; default all)")
    parser.add_argument("--updates", type=int, default=200, help="timed updates per block")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="10 updates, one repeat")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--learning", metavar="DATASET", help="train BC, TD3+BC and IQL on DATASET in both precisions instead")
    parser.add_argument("--store", default="datasets", help="the dataset store of --learning")
    parser.add_argument("--seeds", default="0-4", help="the seeds of --learning: 0-4 or 0,3,5")
    args = parser.parse_args()
    algos = args.algos.split(",") if args.algos else list(LEARNING_UPDATES if args.learning else ALGOS)
    if args.learning:
        limit_threads()
        if unknown := set(algos) - set(LEARNING_UPDATES):
            parser.error(f"--algos with --learning: {sorted(unknown)} not among {sorted(LEARNING_UPDATES)}")
        found = learning(args.learning, args.store, seed_list(args.seeds), algos)
        print_learning(args.learning, found)
        if args.json:
            Path(args.json).write_text(json.dumps({"cpu_bf16": bf16_flags(), "heldout_return": found}, indent=2) + "\n")
        return
    if args.quick:
        args.updates, args.repeats = 10, 1
    if unknown := set(algos) - set(ALGOS):
        parser.error(f"--algos: unknown {sorted(unknown)}")
    limit_threads()
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for algo, step in algorithm_steps(algos, Path(tmp)):
            done = 0
            for precision in ("fp32", "bf16"):  # warm-up, both paths (even count: delayed actor updates alternate)
                updates_per_s(step, done, 10, precision)
                done += 10
            speeds: dict[str, list[float]] = {"fp32": [], "bf16": []}
            for _ in range(args.repeats):
                for precision, found in speeds.items():
                    found.append(updates_per_s(step, done, args.updates, precision))
                    done += args.updates
            results[algo] = {precision: median(found) for precision, found in speeds.items()}
            print(f"{algo}: fp32 {results[algo]['fp32']:.0f}, bf16 {results[algo]['bf16']:.0f} updates/s", flush=True)
    print(f"\n{today()}  {machine_description()}  bf16 instructions: {bf16_flags()}  {versions()}")
    print(f"one torch thread, 256x256, batch 256, Hopper sizes; {args.updates} updates x {args.repeats} alternating blocks\n")
    rows = [[algo, f"{r['fp32']:.0f}", f"{r['bf16']:.0f}", f"{r['bf16'] / r['fp32']:.2f}x"] for algo, r in results.items()]
    print(table(["update", "fp32 updates/s", "bf16 updates/s", "bf16 / fp32"], rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu_bf16": bf16_flags(), "updates_per_s": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
