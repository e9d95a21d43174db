"""Sampling rate of frame-stacked minibatches from a MinAtar dataset, in RAM and from the
memory-mapped shards (`MappedSampler`, columns held in RAM or read with pread).

    python bench/frame_stack.py --store DIR [--steps 100000] [--batch 32] [--calls 2000]
    python bench/frame_stack.py --store DIR --dataset NAME   # an existing image dataset, mapped only

Collects `--steps` random MinAtar/Breakout-v1 steps (bool 10 x 10 x 4 frames, bit-packed in
the shards) into DIR once (dataset `bool`, and `uint8`: the same frames as uint8), then
times `sample(batch)` at frame_stack 1 and 4. Run it again with PYTHONPATH pointing at an
older checkout (`git archive REV | tar -x -C OLD`) and the same DIR to time that version's
samplers (frame_stack 1 only where it has none; a sampler it cannot build is reported).
Prints calls per CPU second (one thread), the best of `--repeats` rounds. With `--dataset`
it times that dataset of the store instead (e.g. a million Atari frames, whose decoded frames
exceed the resident budget), from the maps only, and prints its shard bytes per frame.
"""

from __future__ import annotations

import argparse
import inspect
import time
from pathlib import Path

import _common  # sets thread limits before numpy/torch are imported
import gymnasium as gym
import numpy as np


def rate(sampler, batch: int, calls: int, repeats: int) -> float:
    sampler.sample(batch)
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()  # CPU time: other processes on a shared machine barely move it
        for _ in range(calls):
            sampler.sample(batch)
        best = min(best, time.process_time() - start)
    return calls / best


def build_store(store: Path, steps: int) -> None:
    """Datasets `bool` (collected) and `uint8` (its frames as uint8) in `store`, unless there."""
    from rlpipe.commands.collect import collect_dataset
    from rlpipe.datasets.loader import load_shards
    from rlpipe.datasets.store import open_dataset
    from rlpipe.datasets.writer import write_rows

    if (store / "uint8").is_dir():
        return
    store.mkdir(parents=True, exist_ok=True)
    collect_dataset("MinAtar/Breakout-v1", steps=steps, num_envs=8, store=store, name="bool", fmt="arrow", progress=False)
    info = open_dataset("bool", store)
    data = load_shards(info)
    frame = gym.spaces.Box(0, 1, info.observation_space.shape, np.uint8)
    rows = {name: getattr(data, name) for name in ("action", "reward", "terminated", "truncated", "episode_id", "step")}
    rows.update(obs=data.obs.astype(np.uint8), next_obs=data.next_obs.astype(np.uint8))
    write_rows("uint8", [rows], frame, info.action_space, env_id=None, producer=info.metadata["producer"], store=store, fmt="arrow")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dataset", help="time this dataset of --store (mapped samplers only)")
    args = parser.parse_args()
    _common.limit_threads()
    import minatar.gym

    import rlpipe
    from rlpipe.datasets.loader import load_shards
    from rlpipe.datasets.mapped import MappedTransitions
    from rlpipe.datasets.store import open_dataset
    from rlpipe.training.sampler import MappedSampler, TransitionSampler

    if "MinAtar/Breakout-v1" not in gym.registry:
        minatar.gym.register_envs()
    if args.dataset is None:
        build_store(args.store, args.steps)
    stacks = (1, 4) if "frame_stack" in inspect.signature(TransitionSampler).parameters else (1,)
    print(
        f"rlpipe from {Path(rlpipe.__file__).parent}; batch {args.batch}; sample() calls per CPU second, best of {args.repeats} x {args.calls}"
    )
    for name in (args.dataset,) if args.dataset else ("uint8", "bool"):
        info = open_dataset(name, args.store)
        if args.dataset:
            shard_bytes = sum(path.stat().st_size for path in info.shard_paths)
            print(f"{name}: {shard_bytes / info.metadata['total_steps']:.0f} shard bytes per frame")
        for k in stacks:
            option = {} if k == 1 else {"frame_stack": k}
            builders = {
                "in RAM": lambda: TransitionSampler(load_shards(info), **option),
                "mapped, resident": lambda: MappedSampler(MappedTransitions(info), **option),
                "mapped, pread": lambda: MappedSampler(MappedTransitions(info, resident_bytes=0), **option),
            }
            if args.dataset:  # decoding the whole dataset into RAM is what the maps avoid
                del builders["in RAM"]
            for label, build in builders.items():
                try:
                    result = f"{rate(build(), args.batch, args.calls, args.repeats):9.0f}/s"
                except Exception as exc:  # an older reader that cannot sample these columns
                    result = f"fails: {type(exc).__name__}: {str(exc)[:60]}"
                print(f"{name:6} ({info.metadata['total_steps']} steps) k={k}  {label:17} {result}")


if __name__ == "__main__":
    main()
