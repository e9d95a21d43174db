"""What N critics cost: one EDAC (and SAC-N) update against the ensemble size.

The update is the one `rlpipe train edac` runs (rlpipe.algos.edac.make_update): N critics as
one fused batched network, the diversity term's action gradients from the same critic pass,
then SAC's actor, temperature and target steps. Sizes as the paper's MuJoCo runs: 256x256
networks, batch 256, Hopper's 11-d observations and 3-d actions, on a fixed random batch (no
sampling), one torch thread. For N = 2, 10, 20, 50 it prints ms per update (wall, median of
the repeats), CPU ms per update (user + system, which load on a shared machine disturbs
less) and the ratio of each to N = 2.

    .venv/bin/python bench/edac_ensemble.py                 # N = 2, 10, 20, 50; 3 repeats
    .venv/bin/python bench/edac_ensemble.py --quick         # a few updates: checks it runs
"""

from __future__ import annotations

import argparse
import time

import _common  # noqa: F401  (sets thread limits before numpy/torch are imported)
import torch
from _common import core_loads, limit_threads, machine_description, median, table, today, versions

from rlpipe.algos.edac import Config, make_update
from rlpipe.algos.sac import SoftActorCritic
from rlpipe.training import Batch

OBS_DIM, ACT_DIM, HIDDEN, BATCH = 11, 3, (256, 256), 256


def random_batch(seed: int) -> Batch:
    g = torch.Generator().manual_seed(seed)
    return Batch(
        torch.randn(BATCH, OBS_DIM, generator=g),
        torch.rand(BATCH, ACT_DIM, generator=g) * 2 - 1,
        torch.randn(BATCH, generator=g),
        torch.randn(BATCH, OBS_DIM, generator=g),
        torch.zeros(BATCH),
    )


def time_updates(n_critics: int, eta: float, updates: int, repeats: int) -> tuple[float, float]:
    """(wall ms, CPU ms) per update, the median over ``repeats`` timings of ``updates`` updates."""
    config = Config(hidden=HIDDEN, batch_size=BATCH, n_critics=n_critics, eta=eta)
    torch.manual_seed(0)
    sac = SoftActorCritic.build(config, OBS_DIM, ACT_DIM, torch.device("cpu"), n_critics=n_critics)
    update, _ = make_update(config, sac)
    b = random_batch(0)
    for i in range(3):  # warm-up: allocator, optimiser state
        update(b, i)
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        for i in range(updates):
            update(b, i)
        walls.append((time.perf_counter() - wall) * 1000 / updates)
        cpus.append((time.process_time() - cpu) * 1000 / updates)
    return median(walls), median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2,10,20,50", help="ensemble sizes N, comma-separated (the first is the ratios' base)")
    parser.add_argument("--updates", type=int, default=20, help="updates per timing")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="N = 2, 10 and 2 updates: checks it runs")
    args = parser.parse_args()
    limit_threads()
    sizes = [2, 10] if args.quick else [int(n) for n in args.sizes.split(",")]
    updates, repeats = (2, 1) if args.quick else (args.updates, args.repeats)
    loads = ", ".join(f"{c}: {load:.0%}" for c, load in core_loads().items())
    print(f"# EDAC / SAC-N update cost against N, {today()}")
    print(f"machine: {machine_description()}\nversions: {versions('torch')}\ncore loads before start: {loads}")
    print(f"{HIDDEN[0]}x{HIDDEN[1]} nets, batch {BATCH}, obs {OBS_DIM}-d, actions {ACT_DIM}-d, one torch thread\n")
    rows, base = [], {}
    for n in sizes:
        edac_wall, edac_cpu = time_updates(n, 1.0, updates, repeats)
        sacn_wall, sacn_cpu = time_updates(n, 0.0, updates, repeats)
        base = base or {"edac": edac_wall, "edac_cpu": edac_cpu, "sacn": sacn_wall, "sacn_cpu": sacn_cpu}
        rows.append(
            [
                n,
                f"{edac_wall:.1f} ({edac_wall / base['edac']:.2f}x)",
                f"{edac_cpu:.1f} ({edac_cpu / base['edac_cpu']:.2f}x)",
                f"{sacn_wall:.1f} ({sacn_wall / base['sacn']:.2f}x)",
                f"{sacn_cpu:.1f} ({sacn_cpu / base['sacn_cpu']:.2f}x)",
                f"{edac_cpu / sacn_cpu:.2f}x",
            ]
        )
        print(f"N={n}: EDAC {edac_wall:.1f} ms/update ({edac_cpu:.1f} CPU ms), SAC-N {sacn_wall:.1f} ({sacn_cpu:.1f} CPU ms)", flush=True)
    ratio = f"(x N={sizes[0]})"
    headers = [
        "N",
        f"EDAC ms/update {ratio}",
        f"EDAC CPU ms {ratio}",
        f"SAC-N ms/update {ratio}",
        f"SAC-N CPU ms {ratio}",
        "EDAC / SAC-N (CPU)",
    ]
    print("\n" + table(headers, rows))


if __name__ == "__main__":
    main()
