"""Many seeds as one computation: CQL and SAC seed-updates per second, K seeds batched vs one seed.

A seed-update is one gradient update of one seed. Per algorithm (``--algos``), equal work
per seed-update (256x256 networks, batch 256, and for CQL 10 sampled actions per proposal
as in bench/offline.py, unless changed):
- ``1 seed``: the update `rlpipe train` runs (one seed);
- ``K batched``: K seeds' updates as one batched computation on stacked weights, the path
  `rlpipe sweep --batched` (and a CUDA sweep by default) takes
  (rlpipe.training.seedstack), for each K of ``--seeds``.
Each timed update includes sampling the minibatches: CQL's from the dataset (on CUDA both
replay as CUDA graphs as in training, unless RLPIPE_CUDA_GRAPHS=0), SAC's from per-seed
replay buffers filled with random Pendulum-sized transitions (eager, as online training
runs it; env stepping is not timed). The issue's goal is K=16 at >= 8x the seed-updates/s
of one seed on a GPU; on a CPU the figure is a CPU figure (a CPU has no idle lanes for the
extra seeds to fill).

    .venv/bin/python bench/batched_seeds.py                         # CPU, K = 1 and 16, CQL and SAC
    .venv/bin/python bench/batched_seeds.py --device cuda --updates 200
    .venv/bin/python bench/batched_seeds.py --quick                 # tiny sizes: checks it runs
    .venv/bin/python bench/batched_seeds.py --returns 0-14          # SAC returns, batched vs separate

``--returns`` compares learning instead of speed: SAC on Pendulum (tuned settings, 5,000 env
steps: the budget of SAC's learning test) for the given seeds, once as one batched run of
all of them and once as separate runs; it prints each seed's final and held-out returns and
the CPU seconds of each side.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import _common  # noqa: F401  (sets thread limits before numpy/torch are imported)
from _common import core_loads, limit_threads, machine_description, median, random_dataset, table, today, versions
from offline import ENV_ID, NAME, RLPIPE_CONFIGS, time_rlpipe


def time_steps(step: Callable[[int], int], updates: int, device: str) -> float:
    """Wall seconds of ``updates`` updates run by ``step(done) -> updates performed``, after
    an untimed first call (one update on CPU; warm-up and graph capture on CUDA)."""
    import torch

    done = step(0)
    sync = torch.cuda.synchronize if device == "cuda" else lambda: None
    sync()
    start, end = time.perf_counter(), done + updates
    while done < end:
        done += step(done)
    sync()
    return time.perf_counter() - start


def time_batched(store: Path, seeds: int, updates: int, device: str, overrides: dict[str, Any]) -> float:
    """Wall seconds of `updates` batched updates of `seeds` CQL seeds (sampling included)."""
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
    return time_steps(step, updates, device)


def time_sac(seeds: int | None, updates: int, device: str, hidden: int, batch_size: int, steps: int) -> float:
    """Wall seconds of `updates` SAC updates (sampling included): one seed's own update
    (``seeds`` None) or K seeds' batched update, each seed sampling its own replay buffer
    of ``steps`` random Pendulum-sized transitions."""
    import numpy as np
    import torch

    from rlpipe.algos import get_algo
    from rlpipe.algos.sac import make_agent, make_stacked_agent
    from rlpipe.training.buffer import ReplayBuffer
    from rlpipe.training.seedstack import sample_seeds

    spec = get_algo("sac")
    configs = [spec.make_config(ENV_ID, device=device, seed=s, hidden=(hidden, hidden), batch_size=batch_size) for s in range(seeds or 1)]
    env = SimpleNamespace(obs_dim=3, act_dim=1, device=torch.device(device))
    buffers = []
    for config in configs:
        rng = np.random.default_rng(config.seed)
        buffer = ReplayBuffer(steps, env.obs_dim, env.act_dim, device, seed=config.seed)
        buffer.add(
            rng.normal(size=(steps, 3)),
            rng.uniform(-1, 1, (steps, 1)),
            rng.normal(size=steps),
            rng.normal(size=(steps, 3)),
            np.zeros(steps),
        )
        buffers.append(buffer)
    if seeds is None:
        update = make_agent(configs[0], env).update
        sample = lambda: buffers[0].sample(batch_size)  # noqa: E731
    else:
        _, update = make_stacked_agent(configs, env)
        sample = lambda: sample_seeds(buffers, batch_size)  # noqa: E731

    def step(done: int) -> int:
        update(sample(), done)
        return 1

    return time_steps(step, updates, device)


def compare_returns(seeds: list[int], env_steps: int) -> None:
    """Print SAC's final and held-out returns per seed, batched and separate, and each side's CPU seconds."""
    from rlpipe.algos import get_algo

    spec = get_algo("sac")
    configs = [spec.make_config(ENV_ID, seed=s, env_steps=env_steps, eval_every=env_steps, device="cpu") for s in seeds]
    start = time.process_time()
    together = spec.train_seeds(configs, [None] * len(configs), progress=False)
    middle = time.process_time()
    apart = [spec.train(config, progress=False) for config in configs]
    end = time.process_time()
    keys = ("eval_return_mean", "heldout_return_mean")
    rows = [[seed, *(f"{r.metrics[key]:.1f}" for r in (b, a) for key in keys)] for seed, b, a in zip(seeds, together, apart)]
    rows.append(["mean", *(f"{sum(r.metrics[key] for r in results) / len(results):.1f}" for results in (together, apart) for key in keys)])
    print(table(["seed", "batched final", "batched held-out", "separate final", "separate held-out"], rows))
    print(f"\nCPU seconds: batched {middle - start:.1f}, separate {end - middle:.1f} ({len(seeds)} seeds, {env_steps} env steps each)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--algos", default="cql,sac", help="algorithms to measure, comma-separated (cql, sac)")
    parser.add_argument("--seeds", default="1,16", help="numbers of batched seeds K, comma-separated")
    parser.add_argument("--updates", type=int, default=20, help="timed updates per configuration")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20_000, help="transitions in the dataset (and in each SAC seed's replay buffer)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (16x16 nets, batch 32, K = 1 and 4, 3 updates)")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--returns", help="instead: SAC returns of these seeds (A-B or a comma list), batched vs separate")
    parser.add_argument("--env-steps", type=int, default=5_000, help="env steps per seed with --returns")
    args = parser.parse_args()
    if args.returns:
        first, _, last = args.returns.partition("-")
        seeds = list(range(int(first), int(last) + 1)) if last else [int(s) for s in args.returns.split(",")]
        limit_threads()
        print(f"date: {today()}; machine: {machine_description()}; {versions('torch', 'rlpipe')}")
        compare_returns(seeds, args.env_steps)
        return
    if args.quick:
        args.seeds, args.updates, args.hidden, args.batch_size, args.steps = "1,4", 3, 16, 32, 2_000
    limit_threads()
    overrides = {**RLPIPE_CONFIGS["cql"], "hidden": (args.hidden, args.hidden), "batch_size": args.batch_size}
    ks = [int(k) for k in args.seeds.split(",")]
    algos = [algo for algo in args.algos.split(",") if algo]
    if not algos or set(algos) - {"cql", "sac"}:
        parser.error(f"--algos {args.algos!r}: choose from cql, sac")
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="rlpipe-bench-seeds-") as tmp:
        store = Path(tmp)
        random_dataset(store, ENV_ID, NAME, args.steps)
        print(f"date: {today()}; machine: {machine_description()}; {versions('torch', 'rlpipe')}")
        print(
            f"device: {args.device}; {args.hidden}x{args.hidden} networks, batch {args.batch_size}, CQL "
            f"{overrides['num_sampled_actions']} sampled actions per proposal; torch threads 1; {args.updates} timed updates; "
            "core loads before start: " + ", ".join(f"{c}: {load:.0%}" for c, load in core_loads().items()),
            flush=True,
        )
        for repeat in range(args.repeats):
            for algo in algos:
                if algo == "cql":
                    wall, _ = time_rlpipe("cql", store, args.updates, args.device, overrides)
                else:
                    wall = time_sac(None, args.updates, args.device, args.hidden, args.batch_size, args.steps)
                results.setdefault(f"{algo} 1 seed", []).append(args.updates / wall)
                for k in ks:
                    if algo == "cql":
                        wall = time_batched(store, k, args.updates, args.device, overrides)
                    else:
                        wall = time_sac(k, args.updates, args.device, args.hidden, args.batch_size, args.steps)
                    results.setdefault(f"{algo} {k} batched", []).append(k * args.updates / wall)
            print(f"  repeat {repeat}: " + ", ".join(f"{name} {rates[-1]:.1f}" for name, rates in results.items()), flush=True)
    rows = []
    for name, rates in results.items():
        algo = name.split()[0]
        base = median(results[f"{algo} 1 seed"])
        rows.append([name, f"{median(rates):.1f}", f"{median(rates) / base:.2f}x"])
    print()
    print(table(["configuration", f"seed-updates/s ({args.device})", "/ one seed"], rows))
    print("\ncore loads after: " + ", ".join(f"{c}: {load:.0%}" for c, load in core_loads().items()))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
