"""Many seeds as one computation: CQL seed-updates per second, K seeds batched vs one seed.

A seed-update is one gradient update of one seed. Three configurations, equal work per
seed-update (networks, batch and sampled actions as in bench/offline.py: 256x256, batch
256, 10 sampled actions per proposal, unless changed):
- ``1 seed``: the update `rlpipe train cql` runs (one seed);
- ``K batched``: K seeds' updates as one batched computation on stacked weights, the path
  `rlpipe sweep cql --batched` (and a CUDA sweep by default) takes
  (rlpipe.training.seedstack), for each K of ``--seeds``.
Each timed update includes sampling the minibatches; on CUDA both replay as CUDA graphs as
in training (unless RLPIPE_CUDA_GRAPHS=0). The issue's goal is K=16 at >= 8x the
seed-updates/s of one seed on a GPU; on a CPU the figure is a CPU figure (a CPU has no
idle lanes for the extra seeds to fill).

    .venv/bin/python bench/batched_seeds.py                         # CPU, K = 1 and 16
    .venv/bin/python bench/batched_seeds.py --device cuda --updates 200
    .venv/bin/python bench/batched_seeds.py --quick                 # tiny sizes: checks it runs
"""

from __future__ import annotations

import _common  # noqa: F401  (sets thread limits before numpy/torch are imported)

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import core_loads, limit_threads, machine_description, random_dataset, table, today, versions
from offline import ENV_ID, NAME, RLPIPE_CONFIGS, time_rlpipe


def time_batched(store: Path, seeds: int, updates: int, device: str, overrides: dict[str, Any]) -> float:
    """Wall seconds of `updates` batched updates of `seeds` CQL seeds (sampling included),
    after an untimed start (one update on CPU; warm-up and graph capture on CUDA)."""
    import torch

    from rlpipe.algos import get_algo
    from rlpipe.algos.cql import ACTION_SPACES, batched_continuous_cql
    from rlpipe.training.graphs import UpdateStepper, graphs_enabled
    from rlpipe.training.offline import load_offline
    from rlpipe.training.sampler import SeedSampler

    spec = get_algo("cql")
    configs = [spec.make_config(ENV_ID, dataset=NAME, store=str(store), device=device, seed=s, **overrides) for s in range(seeds)]
    data = load_offline("cql", configs[0], ACTION_SPACES)
    _, _, update, _ = batched_continuous_cql(configs, data)
    sampler = SeedSampler(data.sampler, [c.seed for c in configs])
    step = UpdateStepper(update, sampler, configs[0].batch_size, total=10**9, graph=graphs_enabled(torch.device(device)))
    done = step(0)
    sync = torch.cuda.synchronize if device == "cuda" else lambda: None
    sync()
    start, end = time.perf_counter(), done + updates
    while done < end:
        done += step(done)
    sync()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--seeds", default="1,16", help="numbers of batched seeds K, comma-separated")
    parser.add_argument("--updates", type=int, default=20, help="timed updates per configuration")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20_000, help="transitions in the dataset")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (16x16 nets, batch 32, K = 1 and 4, 3 updates)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.updates, args.hidden, args.batch_size, args.steps = "1,4", 3, 16, 32, 2_000
    limit_threads()
    overrides = {**RLPIPE_CONFIGS["cql"], "hidden": (args.hidden, args.hidden), "batch_size": args.batch_size}
    ks = [int(k) for k in args.seeds.split(",")]
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="rlpipe-bench-seeds-") as tmp:
        store = Path(tmp)
        random_dataset(store, ENV_ID, NAME, args.steps)
        print(f"date: {today()}; machine: {machine_description()}; {versions('torch', 'rlpipe')}")
        print(f"device: {args.device}; CQL {args.hidden}x{args.hidden}, batch {args.batch_size}, "
              f"{overrides['num_sampled_actions']} sampled actions per proposal; torch threads 1; {args.updates} timed updates; "
              "core loads before start: " + ", ".join(f"{c}: {load:.0%}" for c, load in core_loads().items()), flush=True)
        for repeat in range(args.repeats):
            wall, _ = time_rlpipe("cql", store, args.updates, args.device, overrides)
            results.setdefault("1 seed", []).append(args.updates / wall)
            for k in ks:
                wall = time_batched(store, k, args.updates, args.device, overrides)
                results.setdefault(f"{k} batched", []).append(k * args.updates / wall)
            print(f"  repeat {repeat}: " + ", ".join(f"{name} {rates[-1]:.1f}" for name, rates in results.items()), flush=True)
    base = sorted(results["1 seed"])[len(results["1 seed"]) // 2]
    rows = []
    for name, rates in results.items():
        rate = sorted(rates)[len(rates) // 2]
        rows.append([name, f"{rate:.1f}", f"{rate / base:.2f}x"])
    print()
    print(table(["configuration", f"seed-updates/s ({args.device})", "/ one seed"], rows))
    print("\ncore loads after: " + ", ".join(f"{c}: {load:.0%}" for c, load in core_loads().items()))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
