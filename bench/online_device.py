"""Online training on a GPU against one CPU core: SAC and TD3 on Pendulum-v1.

Each algorithm trains with its tuned Pendulum settings (`rlpipe train ALGO --env
Pendulum-v1`: 10k env steps for SAC) once per device, one torch thread, evaluation only at
the end; the wall seconds of the whole `train` call (env stepping on the CPU, updates on
the device) are compared. The issue's goal: a GPU no slower than one CPU core.

    .venv/bin/python bench/online_device.py --devices cpu,cuda
    .venv/bin/python bench/online_device.py --devices cpu --steps 300   # a dry run
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import _common  # noqa: F401  (sets thread limits before numpy/torch are imported)
from _common import core_loads, limit_threads, machine_description, table, today, versions

ENV_ID = "Pendulum-v1"


def time_training(algo: str, device: str, steps: int | None, seed: int) -> tuple[float, float]:
    """(wall seconds, final eval return) of one `train` of ``algo`` on ``device``."""
    from rlpipe.algos import get_algo

    spec = get_algo(algo)
    config = spec.make_config(ENV_ID, device=device, seed=seed)
    steps = steps or config.env_steps
    config = spec.make_config(
        ENV_ID, device=device, seed=seed, env_steps=steps, eval_every=steps, learning_starts=min(config.learning_starts, steps // 2)
    )
    start = time.perf_counter()
    result = spec.train(config, progress=False)
    return time.perf_counter() - start, float(result.metrics["eval_return_mean"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="cpu,cuda", help="comma-separated; the first is the reference")
    parser.add_argument("--algos", default="sac,td3")
    parser.add_argument("--steps", type=int, default=None, help="env steps (default: each algorithm's tuned budget)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    limit_threads()
    devices, algos = args.devices.split(","), args.algos.split(",")
    print(f"date: {today()}; machine: {machine_description()}; {versions('torch', 'gymnasium', 'rlpipe')}")
    print(
        f"{ENV_ID}, tuned settings, env steps: {args.steps or 'tuned'}; torch threads 1; core loads before start: "
        + ", ".join(f"{c}: {load:.0%}" for c, load in core_loads().items()),
        flush=True,
    )
    results: dict[str, dict[str, tuple[float, float]]] = {}
    rows = []
    for algo in algos:
        for device in devices:
            results.setdefault(algo, {})[device] = time_training(algo, device, args.steps, args.seed)
            print(f"  {algo} {device}: {results[algo][device][0]:.1f} s, return {results[algo][device][1]:.1f}", flush=True)
        reference = results[algo][devices[0]][0]
        for device in devices:
            wall, ret = results[algo][device]
            rows.append([algo.upper(), device, f"{wall:.1f}", f"{ret:.1f}", f"{reference / wall:.2f}x"])
    print()
    print(table(["algorithm", "device", "wall s", "final return", f"speed vs {devices[0]}"], rows))
    print("\ncore loads after: " + ", ".join(f"{c}: {load:.0%}" for c, load in core_loads().items()))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
