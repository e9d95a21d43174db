"""Frame-stacked minibatches from Atari-sized frames, rlpipe vs d3rlpy: batches/s and peak RSS.

    python bench/frame_stack_peer.py [--frames 100000] [--batch 32] [--frame-stack 4] [--store DIR]
    python bench/frame_stack_peer.py --quick      # 10k frames, few calls: checks it runs

Both sides sample the same data: `--frames` random uint8 frames of 1 x 84 x 84 in terminated
episodes of 1000-3000 steps (seed 0; the last one shorter), discrete actions. rlpipe reads them
as a dataset (Arrow shards, one compressed obs frame per row and next_obs at episode ends;
random pixels do not compress, so a block holds the frame's 7,056 bytes and a few more); d3rlpy as one
N x 1 x 84 x 84 observation array (`observations.npy`). Each contender runs in its own process
(d3rlpy in its virtualenv: bench/peers/d3rlpy_frame_stack.py), one thread, building its sampler
and timing `--calls` batches of `--batch`, best of `--repeats` rounds; this process polls its
/proc status for the peak anonymous and file-backed resident memory (that of building the
sampler included); the contender reports its resident memory after the timing too.

- rlpipe, in RAM: `TransitionSampler(load_shards(info), frame_stack=k).sample(batch)`: a Batch
  of torch CPU tensors, obs and next_obs uint8 [B, k, 1, 84, 84]; "+ float" (here and below)
  also converts both to float32, d3rlpy's dtype.
- rlpipe, mapped: `MappedSampler(MappedTransitions(info), frame_stack=k)`, its columns held in
  RAM up to the default resident budget ("resident"), or read per batch ("pread").
- d3rlpy: `MDPDataset(..., transition_picker=FrameStackTransitionPicker(k))`,
  `sample_transition_batch(batch)` (what its `fit` calls): numpy float32 [B, k, 84, 84]
  observations and next_observations, the observation array in RAM or memory-mapped (d3rlpy
  only slices it). d3rlpy pads stacks at an episode's start with zeros, rlpipe with the
  episode's first frame.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import _common  # noqa: F401  (sets thread limits before numpy/torch are imported)
import numpy as np
from _common import limit_threads, machine_description, table, today, versions
from offline import PEER_PYTHON, ensure_peer_venv

sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
from d3rlpy_frame_stack import resident_kib  # the peer script imports d3rlpy only inside main()

PEER_SCRIPT = Path(__file__).resolve().parent / "peers" / "d3rlpy_frame_stack.py"
FRAME = (1, 84, 84)
ACTIONS = 6
NAME = "frames"
RLPIPE_SIDES = ("in RAM", "in RAM + float", "mapped, resident", "mapped, resident + float", "mapped, pread")


def episodes(frames: int, seed: int = 0) -> Iterator[tuple[int, np.ndarray]]:
    """(episode id, its frames: length + 1 of them, the last only a next_obs) until `frames` steps."""
    rng = np.random.default_rng(seed)
    done, episode = 0, 0
    while done < frames:
        length = min(int(rng.integers(1000, 3001)), frames - done)
        yield episode, rng.integers(0, 256, (length + 1, *FRAME), dtype=np.uint8)
        done += length
        episode += 1


def build(store: Path, frames: int) -> None:
    """The rlpipe dataset and d3rlpy's arrays of the same frames in `store`, unless there."""
    import gymnasium as gym

    from rlpipe.datasets.writer import write_rows

    if (store / "columns.npz").is_file():
        return
    store.mkdir(parents=True, exist_ok=True)
    observations = np.lib.format.open_memmap(store / "observations.npy", "w+", np.uint8, (frames, *FRAME))
    rng = np.random.default_rng(1)
    actions = rng.integers(0, ACTIONS, frames)
    rewards = rng.random(frames).astype(np.float32)
    terminals = np.zeros(frames, np.float32)

    def rows() -> Iterator[dict[str, np.ndarray]]:
        at = 0
        for episode, frames_ in episodes(frames):
            length = len(frames_) - 1
            observations[at : at + length] = frames_[:-1]
            terminals[at + length - 1] = 1.0
            part = slice(at, at + length)
            terminated = np.zeros(length, bool)
            terminated[-1] = True
            yield dict(
                obs=frames_[:-1],
                next_obs=frames_[1:],
                action=actions[part],
                reward=rewards[part],
                terminated=terminated,
                truncated=np.zeros(length, bool),
                episode_id=np.full(length, episode, np.int64),
                step=np.arange(length, dtype=np.int64),
            )
            at += length

    space = gym.spaces.Box(0, 255, FRAME, np.uint8)
    write_rows(
        NAME,
        rows(),
        space,
        gym.spaces.Discrete(ACTIONS),
        env_id=None,
        producer={"script": "bench/frame_stack_peer.py"},
        store=store,
        fmt="arrow",
    )
    observations.flush()
    np.savez(store / "columns.npz", actions=actions, rewards=rewards, terminals=terminals, timeouts=np.zeros(frames, np.float32))


def time_rlpipe(store: Path, side: str, frame_stack: int, batch: int, calls: int, repeats: int) -> dict[str, object]:
    """One rlpipe contender (run in its own process by `measure`): batches per CPU and wall second."""
    import torch

    from rlpipe.datasets.loader import load_shards
    from rlpipe.datasets.mapped import MappedTransitions
    from rlpipe.datasets.store import open_dataset
    from rlpipe.training.sampler import MappedSampler, TransitionSampler

    limit_threads()
    start = time.perf_counter()
    info = open_dataset(NAME, store)
    if side.startswith("in RAM"):
        sampler = TransitionSampler(load_shards(info), frame_stack=frame_stack)
    else:
        mapped = MappedTransitions(info) if side.startswith("mapped, resident") else MappedTransitions(info, resident_bytes=0)
        sampler = MappedSampler(mapped, frame_stack=frame_stack)
    build_s = time.perf_counter() - start

    def sample() -> torch.Tensor:
        out = sampler.sample(batch)
        if side.endswith("+ float"):  # d3rlpy's dtype
            obs, _ = out.obs.float(), out.next_obs.float()
            return obs
        return out.obs

    obs = sample()
    best_cpu = best_wall = float("inf")
    for _ in range(repeats):
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(calls):
            sample()
        best_cpu = min(best_cpu, time.process_time() - cpu)
        best_wall = min(best_wall, time.perf_counter() - wall)
    return {
        "build_s": build_s,
        "per_cpu_s": calls / best_cpu,
        "per_wall_s": calls / best_wall,
        "shape": list(obs.shape),
        "dtype": str(obs.dtype),
        "end_kib": resident_kib(),
    }


def measure(cmd: list[str]) -> dict[str, object]:
    """Run a contender's process; its JSON line plus the peak RssAnon/RssFile (MiB) polled every 20 ms."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = {"RssAnon": 0, "RssFile": 0}
    while proc.poll() is None:
        try:
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                key, _, value = line.partition(":")
                if key in peak:
                    peak[key] = max(peak[key], int(value.split()[0]))
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    out, err = proc.communicate()
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{cmd[1]} failed ({proc.returncode}): {err.strip()[-2000:]}")
    return {**json.loads(lines[-1]), "anon_mib": peak["RssAnon"] / 1024, "file_mib": peak["RssFile"] / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--frame-stack", type=int, default=4)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--store", type=Path, help="where the data is built once and kept (default: a temporary directory)")
    parser.add_argument("--quick", action="store_true", help="10k frames, 50 calls, one round")
    parser.add_argument("--rlpipe-side", choices=RLPIPE_SIDES, help=argparse.SUPPRESS)  # a contender's own process
    args = parser.parse_args()
    if args.quick:
        args.frames, args.calls, args.repeats = 10_000, 50, 1
    timing = [
        "--frame-stack",
        str(args.frame_stack),
        "--batch",
        str(args.batch),
        "--calls",
        str(args.calls),
        "--repeats",
        str(args.repeats),
    ]
    if args.rlpipe_side:
        print(json.dumps(time_rlpipe(args.store, args.rlpipe_side, args.frame_stack, args.batch, args.calls, args.repeats)))
        return
    ensure_peer_venv()
    with tempfile.TemporaryDirectory() as tmp:
        store = args.store or Path(tmp)
        start = time.perf_counter()
        build(store, args.frames)
        print(
            f"machine: {machine_description()}\nversions: {versions('numpy', 'torch')}; data built in {time.perf_counter() - start:.0f} s",
            flush=True,
        )
        contenders = {
            f"rlpipe, {side}": [sys.executable, __file__, "--store", str(store), "--rlpipe-side", side, *timing] for side in RLPIPE_SIDES
        }
        for label, extra in (("d3rlpy, in RAM", []), ("d3rlpy, mmap", ["--mmap"])):
            contenders[label] = [str(PEER_PYTHON), str(PEER_SCRIPT), str(store), *timing, *extra]
        results = {}
        for label, cmd in contenders.items():
            results[label] = measure(cmd)
            print(f"{label}: {json.dumps(results[label])}", flush=True)
    peer = results["d3rlpy, in RAM"]
    rows = [
        [
            label,
            f"{r['shape']} {r['dtype']}",
            f"{r['per_cpu_s']:,.0f}",
            f"{r['per_wall_s']:,.0f}",
            f"{r['per_cpu_s'] / peer['per_cpu_s']:.1f}x",
            f"{r['anon_mib']:,.0f} + {r['file_mib']:,.0f}",
            f"{r['end_kib'][0] / 1024:,.0f} + {r['end_kib'][1] / 1024:,.0f}",
            f"{r['build_s']:.1f}",
        ]
        for label, r in results.items()
    ]
    print(
        f"\n{today()}  {args.frames} frames of {FRAME} uint8, batch {args.batch}, frame_stack {args.frame_stack}, best of {args.repeats} x {args.calls} calls\n"
    )
    headers = [
        "sampler",
        "obs batch",
        "batches per CPU s",
        "per wall s",
        "vs d3rlpy in RAM (CPU s)",
        "peak RSS MiB (anon + file)",
        "RSS after timing",
        "build s",
    ]
    print(table(headers, rows))


if __name__ == "__main__":
    main()
