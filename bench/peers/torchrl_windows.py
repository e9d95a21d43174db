"""Peer side of bench/windows.py, run inside the TorchRL virtualenv (`make bench`).

Puts the columns in DIR/columns.npz (obs, action, reward, returns_to_go, timestep, terminated,
episode: the same rows and returns-to-go as the rlpipe dataset beside them) into a TorchRL
`ReplayBuffer`, in RAM (`LazyTensorStorage`) or memory-mapped in a temporary directory
(`LazyMemmapStorage`), sampled by `SliceSampler(slice_len=K, traj_key="episode",
cache_values=True)` (trajectory boundaries found once: the documented set-up for a static
dataset), and times ``buffer.sample()`` of B * K rows reshaped to [B, K] windows. ``--pad``:
``strict_length=False, pad_output=True`` (episodes shorter than K padded, with a mask, as
rlpipe pads them); without it the default ``strict_length=True`` leaves such episodes out.
Prints one JSON line: {"build_s", "per_cpu_s", "per_wall_s", "shape", "end_kib"} (batches per
CPU and wall second, best of the rounds; the obs batch's shape; the resident anonymous and
file-backed KiB after the timing).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import numpy as np
from d3rlpy_frame_stack import resident_kib  # a /proc reader, no d3rlpy import


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--window", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memmap", action="store_true")
    parser.add_argument("--pad", action="store_true")
    args = parser.parse_args()

    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer
    from torchrl.data.replay_buffers import SliceSampler

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        start = time.perf_counter()
        columns = np.load(f"{args.dir}/columns.npz")
        rows = TensorDict({name: torch.from_numpy(columns[name]) for name in columns.files}, batch_size=[len(columns["episode"])])
        storage = LazyMemmapStorage(len(rows), scratch_dir=scratch) if args.memmap else LazyTensorStorage(len(rows))
        pad = {"strict_length": False, "pad_output": True} if args.pad else {}
        sampler = SliceSampler(slice_len=args.window, traj_key="episode", cache_values=True, **pad)
        buffer = ReplayBuffer(storage=storage, sampler=sampler, batch_size=args.batch * args.window)
        buffer.extend(rows)
        del rows, columns
        build_s = time.perf_counter() - start
        torch.manual_seed(0)

        def sample() -> TensorDict:
            return buffer.sample().reshape(args.batch, args.window)

        windows = sample()
        assert (windows["episode"] == windows["episode"][:, :1]).all()  # each window within one episode
        best_cpu = best_wall = float("inf")
        for _ in range(args.repeats):
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(args.calls):
                sample()
            best_cpu = min(best_cpu, time.process_time() - cpu)
            best_wall = min(best_wall, time.perf_counter() - wall)
        print(
            json.dumps(
                {
                    "build_s": build_s,
                    "per_cpu_s": args.calls / best_cpu,
                    "per_wall_s": args.calls / best_wall,
                    "shape": list(windows["obs"].shape),
                    "end_kib": resident_kib(),
                }
            )
        )


if __name__ == "__main__":
    main()
