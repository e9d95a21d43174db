"""Windows of K consecutive steps (a sequence model's minibatches), rlpipe's `WindowSampler`
vs TorchRL's `SliceSampler`: windows and steps per second at equal window and batch size;
and the peak memory of rlpipe's memory-mapped path on datasets of up to 50M steps.

    python bench/windows.py [--steps 1000000] [--window 20] [--batch 64] [--store DIR]
    python bench/windows.py --large 5000000 10000000 50000000   # peak RSS, mapped path
    python bench/windows.py --quick                              # 50k steps, few calls

Rate. Both sides sample the same synthetic data: `--steps` rows of locomotion shape (17
float32 observations, 6 float32 actions in [-1, 1], float32 rewards) in terminated episodes
of 10-1000 steps (seed 0). rlpipe reads them as a dataset (Arrow shards); TorchRL as one
TensorDict of the columns a window carries, returns-to-go and timesteps stored beside them
(rlpipe computes both when its sampler is built). Each contender runs in a fresh process, one
torch thread, builds its sampler and times `--calls` batches of `--batch` windows, best of
`--repeats` rounds; this process polls its peak resident memory.
- rlpipe: `WindowSampler(data, K)` over `load_shards(info)` ("in RAM") or
  `MappedTransitions(info)` ("mapped": the columns held in RAM up to the resident budget) or
  `MappedTransitions(info, resident_bytes=0)` ("pread": every column read per batch); "per
  episode": `per_episode=True`. `sample(B)`: a `WindowBatch` of [B, K] tensors (obs,
  actions, rewards, returns_to_go, timesteps, terminated, mask), short windows padded.
- TorchRL (its own virtualenv: bench/peers/torchrl_windows.py): `ReplayBuffer` over
  `LazyTensorStorage` or `LazyMemmapStorage`, `SliceSampler(slice_len=K, traj_key="episode",
  cache_values=True)`, `sample()` of B * K rows reshaped to [B, K]; "pad":
  `strict_length=False, pad_output=True`. SliceSampler draws an episode uniformly, then a
  slice in it: rlpipe's `per_episode` draw.

Memory (`--large N ...`): for each N, a synthetic CartPole-shaped dataset of N steps in
100-step episodes (`bench/load.py`'s `build_large`: 4 float32 observations, ~56 bytes a
row), then in a fresh process `WindowSampler(MappedTransitions(info), K)`, 200 warm-up and
`--calls` timed batches; its peak resident memory (VmHWM, anonymous and file-backed), and
after building the sampler. The dataset is deleted afterwards unless `--store` is given.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import _common  # noqa: F401  (sets thread limits before numpy/torch are imported)
import numpy as np
from _common import limit_threads, machine_description, table, today, versions
from frame_stack_peer import measure
from load import LARGE_NAME, build_large, memory_status

ROOT = Path(__file__).resolve().parent.parent
PEER_VENV = ROOT / ".bench-venvs" / "torchrl"
PEER_PYTHON = PEER_VENV / "bin" / "python"
PEER_SCRIPT = ROOT / "bench" / "peers" / "torchrl_windows.py"
PEER_PINS = ("torchrl==0.14.1", "tensordict==0.14.3")  # torchrl 0.14.1 takes tensordict <0.15
NAME = "windows"
OBS, ACT = 17, 6
RLPIPE_SIDES = ("in RAM", "in RAM, per episode", "mapped", "mapped, per episode", "pread")
PEER_SIDES = {"in RAM": [], "in RAM, pad": ["--pad"], "memmap": ["--memmap"], "memmap, pad": ["--memmap", "--pad"]}


def ensure_peer_venv() -> None:
    """Create TorchRL's virtualenv as the Makefile's bench target does, if it is missing."""
    if PEER_PYTHON.exists():
        return
    print(f"creating {PEER_VENV} ({', '.join(PEER_PINS)}) ...", flush=True)
    subprocess.run(["python3", "-m", "venv", str(PEER_VENV)], check=True)
    torch_pin = [line for line in (ROOT / "constraints.txt").read_text().splitlines() if line.startswith("torch==")]
    wheels = ["--find-links", "/opt/wheels"] if Path("/opt/wheels").is_dir() else []
    subprocess.run([str(PEER_VENV / "bin" / "pip"), "install", "-q", *wheels, *PEER_PINS, *torch_pin], check=True, cwd=ROOT)


def episodes(steps: int, seed: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """Rows of terminated episodes of 10-1000 steps (the last one shorter) until `steps`."""
    rng = np.random.default_rng(seed)
    done, episode = 0, 0
    while done < steps:
        n = min(int(rng.integers(10, 1001)), steps - done)
        obs = rng.standard_normal((n + 1, OBS), dtype=np.float32)
        yield {
            "obs": obs[:-1],
            "next_obs": obs[1:],
            "action": rng.uniform(-1, 1, (n, ACT)).astype(np.float32),
            "reward": rng.random(n, dtype=np.float32),
            "terminated": np.arange(n) == n - 1,
            "truncated": np.zeros(n, bool),
            "episode_id": np.full(n, episode),
            "step": np.arange(n),
        }
        done, episode = done + n, episode + 1


def build(store: Path, steps: int) -> None:
    """The rlpipe dataset and TorchRL's columns of the same rows in `store`, unless there."""
    import gymnasium as gym

    from rlpipe.datasets.frames import chain_starts, returns_to_go
    from rlpipe.datasets.loader import load_shards
    from rlpipe.datasets.store import open_dataset
    from rlpipe.datasets.writer import write_rows

    if (store / "columns.npz").is_file():
        return
    store.mkdir(parents=True, exist_ok=True)
    obs_space = gym.spaces.Box(-np.inf, np.inf, (OBS,), np.float32)
    act_space = gym.spaces.Box(-1, 1, (ACT,), np.float32)
    write_rows(NAME, episodes(steps), obs_space, act_space, env_id=None, producer={"script": "bench/windows.py"}, store=store, fmt="arrow")
    data = load_shards(open_dataset(NAME, store))
    np.savez(
        store / "columns.npz",
        obs=data.obs,
        action=data.action,
        reward=data.reward,
        returns_to_go=returns_to_go(data.reward, chain_starts(data.episode_id, data.step)),
        timestep=data.step,
        terminated=data.terminated,
        episode=data.episode_id,
    )


def rlpipe_sampler(store: Path, name: str, side: str, window: int):
    from rlpipe.datasets.loader import load_shards
    from rlpipe.datasets.mapped import MappedTransitions
    from rlpipe.datasets.store import open_dataset
    from rlpipe.training.windows import WindowSampler

    info = open_dataset(name, store)
    if side.startswith("in RAM"):
        data = load_shards(info)
    else:
        data = MappedTransitions(info, resident_bytes=0) if side == "pread" else MappedTransitions(info)
    return WindowSampler(data, window, per_episode=side.endswith("per episode"))


def time_rlpipe(store: Path, side: str, window: int, batch: int, calls: int, repeats: int) -> dict[str, object]:
    """One rlpipe contender (its own process): batches per CPU and wall second."""
    from d3rlpy_frame_stack import resident_kib  # bench/peers, on the path through frame_stack_peer

    limit_threads()
    start = time.perf_counter()
    sampler = rlpipe_sampler(store, NAME, side, window)
    build_s = time.perf_counter() - start
    windows = sampler.sample(batch)
    best_cpu = best_wall = float("inf")
    for _ in range(repeats):
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(calls):
            sampler.sample(batch)
        best_cpu = min(best_cpu, time.process_time() - cpu)
        best_wall = min(best_wall, time.perf_counter() - wall)
    return {
        "build_s": build_s,
        "per_cpu_s": calls / best_cpu,
        "per_wall_s": calls / best_wall,
        "shape": list(windows.obs.shape),
        "end_kib": resident_kib(),
    }


def time_large(store: Path, window: int, batch: int, calls: int) -> dict[str, object]:
    """The mapped sampler on a large dataset (its own process): set-up, rate and memory."""
    limit_threads()
    start = time.perf_counter()
    sampler = rlpipe_sampler(store, LARGE_NAME, "mapped", window)
    built = {"setup_s": time.perf_counter() - start, **{f"built_{key}": value for key, value in memory_status().items()}}
    for _ in range(200):  # warm-up: first touches of pages, allocator
        sampler.sample(batch)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        sampler.sample(batch)
    return {
        **built,
        "per_wall_s": calls / (time.perf_counter() - wall),
        "per_cpu_s": calls / (time.process_time() - cpu),
        **memory_status(),
    }


def rate_case(args: argparse.Namespace, timing: list[str]) -> None:
    ensure_peer_venv()
    with tempfile.TemporaryDirectory() as tmp:
        store = args.store or Path(tmp)
        start = time.perf_counter()
        build(store, args.steps)
        print(
            f"machine: {machine_description()}\nversions: {versions('numpy', 'torch')}; data built in {time.perf_counter() - start:.0f} s"
        )
        contenders = {
            f"rlpipe, {side}": [sys.executable, __file__, "--store", str(store), "--rlpipe-side", side, *timing] for side in RLPIPE_SIDES
        }
        contenders.update(
            {f"TorchRL, {side}": [str(PEER_PYTHON), str(PEER_SCRIPT), str(store), *timing, *extra] for side, extra in PEER_SIDES.items()}
        )
        results = {}
        for label, cmd in contenders.items():
            results[label] = measure(cmd)
            print(f"{label}: {json.dumps(results[label])}", flush=True)
    peer = max((results[f"TorchRL, {side}"] for side in PEER_SIDES), key=lambda r: r["per_cpu_s"])
    rows = [
        [
            label,
            f"{r['per_cpu_s'] * args.batch:,.0f}",
            f"{r['per_cpu_s'] * args.batch * args.window:,.0f}",
            f"{r['per_wall_s'] * args.batch:,.0f}",
            f"{r['per_cpu_s'] / peer['per_cpu_s']:.2f}x",
            f"{r['anon_mib']:,.0f} + {r['file_mib']:,.0f}",
            f"{r['build_s']:.1f}",
        ]
        for label, r in results.items()
    ]
    print(f"\n{today()}  {args.steps:,} steps, window {args.window}, batch {args.batch}, best of {args.repeats} x {args.calls} calls\n")
    headers = [
        "sampler",
        "windows per CPU s",
        "steps per CPU s",
        "windows per wall s",
        "vs TorchRL's best (CPU s)",
        "peak RSS MiB (anon + file)",
        "build s",
    ]
    print(table(headers, rows))


def large_case(args: argparse.Namespace) -> None:
    rows = []
    for steps in args.large:
        store = args.store or Path(tempfile.mkdtemp(prefix="rlpipe-bench-windows-"))
        try:
            seconds = build_large(store, steps)
            size = sum(p.stat().st_size for p in (store / LARGE_NAME).rglob("*") if p.is_file())
            cmd = [
                sys.executable,
                __file__,
                "--store",
                str(store),
                "--large-child",
                "--window",
                str(args.window),
                "--batch",
                str(args.batch),
                "--calls",
                str(args.calls),
            ]
            result = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
            print(f"{steps:,} steps ({size / 2**30:.2f} GiB, written in {seconds:.0f} s): {json.dumps(result)}", flush=True)
        finally:
            if args.store is None:
                shutil.rmtree(store, ignore_errors=True)
            else:
                shutil.rmtree(store / LARGE_NAME, ignore_errors=True)
        rows.append(
            [
                f"{steps:,}",
                f"{size / 2**30:.2f}",
                f"{result['setup_s']:.1f}",
                f"{result['built_VmRSS']:,.0f}",
                f"{result['VmHWM']:,.0f}",
                f"{result['RssAnon']:,.0f} + {result['RssFile']:,.0f}",
                f"{result['per_cpu_s'] * args.batch:,.0f}",
            ]
        )
    print(f"\n{today()}  WindowSampler(MappedTransitions(info), {args.window}), batches of {args.batch}; MiB\n")
    headers = ["steps", "shards GiB", "set-up s", "RSS after set-up", "peak RSS (VmHWM)", "RSS at end (anon + file)", "windows per CPU s"]
    print(table(headers, rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--window", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--store", type=Path, help="where the data is built and kept (default: a temporary directory)")
    parser.add_argument("--large", type=int, nargs="+", help="measure the mapped path's memory on datasets of these many steps")
    parser.add_argument("--quick", action="store_true", help="50k steps, 20 calls, one round")
    parser.add_argument("--rlpipe-side", choices=RLPIPE_SIDES, help=argparse.SUPPRESS)  # a contender's own process
    parser.add_argument("--large-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.steps, args.calls, args.repeats = 50_000, 20, 1
    timing = ["--window", str(args.window), "--batch", str(args.batch), "--calls", str(args.calls), "--repeats", str(args.repeats)]
    if args.rlpipe_side:
        print(json.dumps(time_rlpipe(args.store, args.rlpipe_side, args.window, args.batch, args.calls, args.repeats)))
    elif args.large_child:
        print(json.dumps(time_large(args.store, args.window, args.batch, args.calls)))
    elif args.large:
        large_case(args)
    else:
        rate_case(args, timing)


if __name__ == "__main__":
    main()
