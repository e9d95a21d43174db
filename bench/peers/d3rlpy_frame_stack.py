"""Peer side of bench/frame_stack_peer.py, run inside the d3rlpy virtualenv.

Builds d3rlpy's `MDPDataset` (an `InfiniteBuffer` whose episodes are views of one uint8
observation array, `FrameStackTransitionPicker(k)`) from the frames in DIR (observations.npy,
N x 1 x 84 x 84 uint8; the other columns in columns.npz), loaded into RAM or, with ``--mmap``,
memory-mapped (``np.load(mmap_mode="r")``: d3rlpy slices the array, so it never copies it), and
times ``sample_transition_batch(batch)``, the call d3rlpy's ``fit`` makes each update. Prints
one JSON line: {"build_s", "per_cpu_s", "per_wall_s", "shape", "dtype", "end_kib"} (batches
per CPU and wall second, the best of the rounds, the observations batch's shape and dtype, and
the resident anonymous and file-backed KiB after the timing).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def resident_kib() -> list[int]:
    """This process's RssAnon and RssFile now (KiB)."""
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return [int(status[key].split()[0]) for key in ("RssAnon", "RssFile")]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--frame-stack", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mmap", action="store_true")
    args = parser.parse_args()

    import d3rlpy

    start = time.perf_counter()
    observations = np.load(f"{args.dir}/observations.npy", mmap_mode="r" if args.mmap else None)
    columns = np.load(f"{args.dir}/columns.npz")
    dataset = d3rlpy.dataset.MDPDataset(
        observations=observations,
        actions=columns["actions"],
        rewards=columns["rewards"],
        terminals=columns["terminals"],
        timeouts=columns["timeouts"],
        transition_picker=d3rlpy.dataset.FrameStackTransitionPicker(args.frame_stack),
        action_space=d3rlpy.ActionSpace.DISCRETE,
        action_size=int(columns["actions"].max()) + 1,
    )
    build_s = time.perf_counter() - start
    np.random.seed(0)  # d3rlpy draws its indices from numpy's global generator
    batch = dataset.sample_transition_batch(args.batch)
    best_cpu = best_wall = float("inf")
    for _ in range(args.repeats):
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(args.calls):
            dataset.sample_transition_batch(args.batch)
        best_cpu = min(best_cpu, time.process_time() - cpu)
        best_wall = min(best_wall, time.perf_counter() - wall)
    print(
        json.dumps(
            {
                "build_s": build_s,
                "per_cpu_s": args.calls / best_cpu,
                "per_wall_s": args.calls / best_wall,
                "shape": list(batch.observations.shape),
                "dtype": str(batch.observations.dtype),
                "end_kib": resident_kib(),
            }
        )
    )


if __name__ == "__main__":
    main()
