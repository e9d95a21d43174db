"""Loading speed: rlpipe's `load_dataset` vs `minari.load_dataset` + `iterate_episodes`.

Builds a CartPole-v1 random-policy dataset of about 1M transitions with rlpipe
(fmt="both": Arrow shards + Minari's HDF5 layout of the same episodes) in a temporary store,
then times, each in a fresh Python process pinned to one core:

  rlpipe       load_dataset(NAME, store) -> TransitionArrays (memory-mapped views), and the
               same followed by copying every column into ordinary in-RAM numpy arrays
               ("materialised": every byte read from disk)
  Minari       minari.load_dataset(NAME) with MINARI_DATASETS_PATH=store, then
               iterate_episodes() gathering obs, next_obs, actions, rewards, terminations,
               truncations and episode ids into concatenated arrays (the same content)

Each is run cold (our files dropped from the OS page cache with posix_fadvise, no root
needed) and warm (files in the page cache). Import time is measured separately and not
included. Finally the arrays of both are compared (assert equal).

    .venv/bin/python bench/load.py             # 1M transitions
    .venv/bin/python bench/load.py --quick     # 50k transitions
    .venv/bin/python bench/load.py --large 50000000   # larger than memory: see below

`--large N` (instead of the comparison with Minari) writes a synthetic CartPole-shaped dataset
of N transitions (random observations, 100-step episodes; Arrow shards written directly by
DatasetWriter, ~56 bytes a row) and times, each in a fresh process, minibatches of 256:
  mapped       MappedSampler over the shards (what `rlpipe train` uses for datasets over
               1 GiB): nothing copied; action, reward, terminated memory-mapped, obs and
               next_obs read with pread per row (they would not fit the 1 GiB resident budget)
  in RAM       TransitionSampler over the sampled columns copied into RAM (the comparison;
               needs ~3 GB at 50M rows)
  train bc     `rlpipe train bc` on the dataset (mapped automatically), as a whole process
with each process's peak resident memory (VmHWM) and its anonymous/file-backed split. The
dataset is deleted afterwards (--keep keeps it).

Needs the `bench` extra:  pip install -c constraints.txt -e '.[dev,bench]'
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import _common  # noqa: F401  (sets thread limits before numpy is imported)
import numpy as np
from _common import core_loads, evict_from_page_cache, least_busy_core, limit_threads, machine_description, pinned, table, today, versions

ENV_ID = "CartPole-v1"
NAME = "cartpole-random-v0"  # valid as an rlpipe name and as a Minari dataset id
FIELDS = ("obs", "next_obs", "action", "reward", "terminated", "truncated", "episode_id")


def build(store: Path, steps: int, num_envs: int) -> dict:
    from rlpipe.commands.collect import collect_dataset

    start = time.perf_counter()
    meta = collect_dataset(
        ENV_ID, steps=steps, num_envs=num_envs, seed=0, name=NAME, fmt="both", store=store, force=True, progress=False
    ).metadata
    seconds = time.perf_counter() - start
    sizes = {rel: info["bytes"] for rel, info in meta["files"].items()}
    return {"seconds": seconds, "steps": meta["total_steps"], "episodes": meta["total_episodes"], "files": sizes}


# ---------------------------------------------------------------------------- child processes


def child_rlpipe(store: Path, out: Path | None) -> dict:
    start = time.perf_counter()
    from rlpipe.datasets.loader import load_dataset

    imported = time.perf_counter()
    arrays = load_dataset(NAME, store)
    loaded = time.perf_counter()
    owned = {name: np.array(getattr(arrays, name)) for name in FIELDS}  # copies: reads every byte
    materialised = time.perf_counter()
    if out is not None:
        np.savez(out, **owned)
    return {"import_s": imported - start, "load_s": loaded - imported, "materialise_s": materialised - imported, "rows": len(arrays)}


def child_minari(store: Path, out: Path | None) -> dict:
    os.environ["MINARI_DATASETS_PATH"] = str(store)
    start = time.perf_counter()
    import minari

    imported = time.perf_counter()
    dataset = minari.load_dataset(NAME)
    opened = time.perf_counter()
    parts: dict[str, list[np.ndarray]] = {name: [] for name in FIELDS}
    for episode in dataset.iterate_episodes():
        observations = np.asarray(episode.observations)
        parts["obs"].append(observations[:-1])
        parts["next_obs"].append(observations[1:])
        parts["action"].append(np.asarray(episode.actions))
        parts["reward"].append(np.asarray(episode.rewards))
        parts["terminated"].append(np.asarray(episode.terminations))
        parts["truncated"].append(np.asarray(episode.truncations))
        parts["episode_id"].append(np.full(len(episode.rewards), episode.id, dtype=np.int64))
    arrays = {name: np.concatenate(chunks) for name, chunks in parts.items()}
    gathered = time.perf_counter()
    if out is not None:
        np.savez(out, **arrays)
    return {"import_s": imported - start, "load_s": opened - imported, "materialise_s": gathered - imported, "rows": len(arrays["reward"])}


def run_child(which: str, store: Path, out: Path | None, cold: bool, dataset_dir: Path) -> dict:
    if cold:
        evict_from_page_cache([dataset_dir])
    command = [sys.executable, __file__, "--child", which, "--store", str(store)]
    if out is not None:
        command += ["--out", str(out)]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------- larger than memory

LARGE_NAME = "synthetic-large"
BATCH = 256


def memory_status() -> dict:
    """This process's peak and current resident memory (MiB), split into anonymous and file-backed pages."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def build_large(store: Path, rows: int, episode_length: int = 100, chunk: int = 1_000_000) -> float:
    """Write a synthetic CartPole-shaped dataset of `rows` transitions straight through DatasetWriter."""
    from rlpipe.datasets.writer import DatasetWriter
    from rlpipe.envs import env_spaces

    obs_space, act_space = env_spaces(ENV_ID)
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    with DatasetWriter(LARGE_NAME, obs_space, act_space, env_id=ENV_ID, store=store, fmt="arrow", force=True) as writer:
        for first in range(0, rows, chunk):
            n = min(chunk, rows - first)
            row = np.arange(first, first + n)
            obs = rng.standard_normal((n + 1, 4), dtype=np.float32)
            ends = row % episode_length == episode_length - 1
            writer.write(
                {
                    "episode_id": row // episode_length,
                    "step": row % episode_length,
                    "obs": obs[:-1],
                    "next_obs": obs[1:],
                    "action": rng.integers(2, size=n),
                    "reward": np.ones(n, np.float32),
                    "terminated": ends | (row == rows - 1),
                    "truncated": np.zeros(n, bool),
                }
            )
        writer.finalize({"algorithm": "synthetic"})
    return time.perf_counter() - start


def child_sampler(store: Path, which: str, batches: int) -> dict:
    import torch

    from rlpipe.datasets.loader import TransitionArrays
    from rlpipe.datasets.mapped import MappedTransitions
    from rlpipe.datasets.store import open_dataset
    from rlpipe.envs.spaces import ActionScaler
    from rlpipe.training.sampler import MappedSampler, TransitionSampler

    torch.set_num_threads(1)
    info = open_dataset(LARGE_NAME, store)
    action_map = ActionScaler(info.action_space).from_env
    start = time.perf_counter()
    mapped = MappedTransitions(info)  # set-up: reads the columns held in RAM, checks that next_obs chains
    if which == "mapped":
        sampler = MappedSampler(mapped, seed=0, action_map=action_map)
    else:  # the sampled columns copied into RAM (the others left empty: the sampler does not read them)
        columns = {name: mapped.column(name) for name in ("obs", "action", "reward", "next_obs", "terminated")}
        del mapped
        empty = np.zeros(0)
        arrays = TransitionArrays(**columns, truncated=empty, episode_id=empty, step=empty)
        sampler = TransitionSampler(arrays, seed=0, action_map=action_map)
        del arrays, columns
    ready = time.perf_counter()
    for _ in range(200):  # warm-up: first touches of pages, allocator
        sampler.sample(BATCH)
    timed, cpu = time.perf_counter(), time.process_time()
    for _ in range(batches):
        sampler.sample(BATCH)
    done, cpu_done = time.perf_counter(), time.process_time()
    return {
        "setup_s": ready - start,
        "batches_per_s": batches / (done - timed),
        "cpu_batches_per_s": batches / (cpu_done - cpu),
        "rows": sampler.size,
        **memory_status(),
    }


def large_case(args: argparse.Namespace) -> int:
    limit_threads()
    store = args.keep or Path(tempfile.mkdtemp(prefix="rlpipe-bench-large-"))
    print(f"# larger-than-memory sampling, synthetic CartPole-shaped data -- {today()}")
    print(f"# machine: {machine_description()}; {versions('rlpipe', 'numpy', 'pyarrow', 'torch')}")
    try:
        seconds = build_large(store, args.large)
        size = sum(p.stat().st_size for p in (store / LARGE_NAME).rglob("*") if p.is_file())
        print(f"# dataset: {args.large:,} transitions, {size / 2**30:.2f} GiB, written in {seconds:.0f} s", flush=True)
        results = {}
        for which in ("mapped", "in_ram"):
            command = [sys.executable, __file__, "--child", which, "--store", str(store), "--batches", str(args.batches)]
            results[which] = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
            print(f"  {which}: {results[which]}", flush=True)
        exe = Path(sys.executable).with_name("rlpipe")
        train = [
            str(exe),
            "train",
            "bc",
            "--dataset",
            LARGE_NAME,
            "--store",
            str(store),
            "--updates",
            "2000",
            "--out",
            str(store / "run"),
            "--no-progress",
            "--set",
            "eval_every=2000",
            "--set",
            "eval_episodes=2",
            "--set",
            "batch_size=256",
        ]
        # a wrapper process whose only child is the training run, so its peak RSS is that run's
        wrapper = [
            sys.executable,
            "-c",
            "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, capture_output=True); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)",
        ]
        start = time.perf_counter()
        peak_kib = int(subprocess.run(wrapper + train, check=True, capture_output=True, text=True).stdout.split()[-1])
        results["train_bc"] = {"seconds": time.perf_counter() - start, "VmHWM": peak_kib / 1024}
        print(f"  rlpipe train bc (2000 updates of 256, mapped): {results['train_bc']}", flush=True)
    finally:
        if args.keep is None:
            shutil.rmtree(store, ignore_errors=True)
    m, r = results["mapped"], results["in_ram"]
    print()
    print(
        table(
            [
                "sampler",
                "setup (s)",
                "batches of 256 / s (wall)",
                "per CPU second",
                "peak RSS (MiB)",
                "anonymous (MiB)",
                "file-backed (MiB)",
            ],
            [
                [
                    label,
                    f"{x['setup_s']:.2f}",
                    f"{x['batches_per_s']:,.0f}",
                    f"{x['cpu_batches_per_s']:,.0f}",
                    f"{x['VmHWM']:,.0f}",
                    f"{x['RssAnon']:,.0f}",
                    f"{x['RssFile']:,.0f}",
                ]
                for label, x in (("mapped (MappedSampler)", m), ("in RAM (TransitionSampler)", r))
            ],
        )
    )
    print(f"\nrlpipe train bc, whole process: peak RSS {results['train_bc']['VmHWM']:,.0f} MiB ")
    for text, ok, value in [
        ("mapped sampler peak RSS under 2 GiB", m["VmHWM"] < 2048, f"{m['VmHWM']:,.0f} MiB"),
        ("rlpipe train bc peak RSS under 2 GiB", results["train_bc"]["VmHWM"] < 2048, f"{results['train_bc']['VmHWM']:,.0f} MiB"),
        (
            "mapped sampling within 2x of in-RAM (wall)",
            m["batches_per_s"] * 2 >= r["batches_per_s"],
            f"{r['batches_per_s'] / m['batches_per_s']:.2f}x slower",
        ),
        (
            "mapped sampling within 2x of in-RAM (CPU time)",
            m["cpu_batches_per_s"] * 2 >= r["cpu_batches_per_s"],
            f"{r['cpu_batches_per_s'] / m['cpu_batches_per_s']:.2f}x slower",
        ),
    ]:
        print(f"goal {'MET   ' if ok else 'MISSED'} {text}: {value}")
    if args.json is not None:
        args.json.write_text(
            json.dumps({"date": today(), "machine": machine_description(), "rows": args.large, "results": results}, indent=2)
        )
    return 0


# ---------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1_000_000, help="transitions in the dataset")
    parser.add_argument("--quick", action="store_true", help="50k transitions")
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--core", type=int, default=None, help="core to pin to (default: the least busy one)")
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument("--keep", type=Path, default=None, help="build the store here and keep it (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results to this JSON file")
    parser.add_argument("--large", type=int, default=None, help="the larger-than-memory case with this many transitions")
    parser.add_argument("--batches", type=int, default=3000, help="--large: minibatches timed per sampler")
    parser.add_argument("--child", choices=["rlpipe", "minari", "mapped", "in_ram"], help=argparse.SUPPRESS)
    parser.add_argument("--store", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")

    if args.child in ("mapped", "in_ram"):
        print(json.dumps(child_sampler(args.store, args.child, args.batches)))
        return 0
    if args.child:  # no torch import here: the child's import time is measured
        result = (child_rlpipe if args.child == "rlpipe" else child_minari)(args.store, args.out)
        print(json.dumps(result))
        return 0
    if args.large:
        return large_case(args)

    if args.quick:
        args.steps = 50_000
    limit_threads()
    loads = core_loads()
    core = None if args.no_pin else (args.core if args.core is not None else least_busy_core())
    store = args.keep or Path(tempfile.mkdtemp(prefix="rlpipe-bench-load-"))
    scratch = Path(tempfile.mkdtemp(prefix="rlpipe-bench-load-arrays-"))
    where = f"pinned to core {core}" if core is not None else "not pinned"
    print(f"# loading benchmark, {ENV_ID} random policy -- {today()}")
    print(f"# machine: {machine_description()}")
    print("# core busy share before start: " + ", ".join(f"cpu{c} {v:.0%}" for c, v in loads.items()) + f"; this run {where}, 1 thread")
    print(f"# {versions('rlpipe', 'minari', 'numpy', 'pyarrow', 'h5py', 'torch')}")
    try:
        with pinned(None if core is None else [core]):
            built = build(store, args.steps, args.num_envs)
            print(
                f"# dataset: {built['steps']:,} transitions, {built['episodes']:,} episodes, built (fmt=both) in "
                f"{built['seconds']:.1f} s; files: "
                + ", ".join(f"{rel} {size / 2**20:.1f} MiB" for rel, size in sorted(built["files"].items()))
            )
            dataset_dir = store / NAME
            results = {}
            for which in ("rlpipe", "minari"):
                results[f"{which}_cold"] = run_child(which, store, None, True, dataset_dir)
                print(f"  {which} cold: {results[f'{which}_cold']}", flush=True)
                results[f"{which}_warm"] = run_child(which, store, scratch / f"{which}.npz", False, dataset_dir)
                print(f"  {which} warm: {results[f'{which}_warm']}", flush=True)

        # Same content: every column equal (values and row order).
        ours, theirs = np.load(scratch / "rlpipe.npz"), np.load(scratch / "minari.npz")
        for name in FIELDS:
            assert ours[name].shape == theirs[name].shape, (name, ours[name].shape, theirs[name].shape)
            assert np.array_equal(ours[name], theirs[name]), f"column {name} differs between rlpipe and Minari"
        print(f"# equality check: all {len(FIELDS)} columns equal ({ours['reward'].shape[0]:,} rows)")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if args.keep is None:
            shutil.rmtree(store, ignore_errors=True)

    rows = []
    for cache in ("cold", "warm"):
        r, m = results[f"rlpipe_{cache}"], results[f"minari_{cache}"]
        rows.append(
            [
                cache,
                f"{r['load_s']:.3f}",
                f"{r['materialise_s']:.3f}",
                f"{m['load_s']:.3f}",
                f"{m['materialise_s']:.2f}",
                f"{m['materialise_s'] / r['load_s']:,.0f}x",
                f"{m['materialise_s'] / r['materialise_s']:,.1f}x",
            ]
        )
    print()
    print(
        table(
            [
                "page cache",
                "rlpipe load_dataset (s)",
                "rlpipe + copy to RAM (s)",
                "minari.load_dataset (s)",
                "Minari load + iterate_episodes (s)",
                "ratio vs load_dataset",
                "ratio vs copy to RAM",
            ],
            rows,
        )
    )
    print(
        f"\nimport time (not included above): rlpipe.datasets.loader {results['rlpipe_warm']['import_s']:.2f} s, "
        f"minari {results['minari_warm']['import_s']:.2f} s"
    )

    r, m = results["rlpipe_cold"], results["minari_cold"]
    print()
    for text, ok, value in [
        ("rlpipe load under 1 s (cold, load_dataset)", r["load_s"] < 1.0, f"{r['load_s']:.3f} s"),
        ("rlpipe load under 1 s (cold, copied into RAM)", r["materialise_s"] < 1.0, f"{r['materialise_s']:.3f} s"),
        (
            ">= 20x faster than Minari (cold, copied into RAM)",
            m["materialise_s"] / r["materialise_s"] >= 20,
            f"{m['materialise_s'] / r['materialise_s']:,.1f}x",
        ),
    ]:
        print(f"goal {'MET   ' if ok else 'MISSED'} {text}: {value}")

    if args.json is not None:
        args.json.write_text(
            json.dumps({"date": today(), "machine": machine_description(), "core": core, "build": built, "results": results}, indent=2)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
