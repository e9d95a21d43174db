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

Needs the `bench` extra:  pip install -c constraints.txt -e '.[dev,bench]'
"""

from __future__ import annotations

import _common  # noqa: F401  (sets thread limits before numpy is imported)

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

import numpy as np

from _common import core_loads, evict_from_page_cache, least_busy_core, limit_threads, machine_description, pinned, table, today, versions

ENV_ID = "CartPole-v1"
NAME = "cartpole-random-v0"  # valid as an rlpipe name and as a Minari dataset id
FIELDS = ("obs", "next_obs", "action", "reward", "terminated", "truncated", "episode_id")


def build(store: Path, steps: int, num_envs: int) -> dict:
    from rlpipe.pipeline.collect import collect_dataset

    start = time.perf_counter()
    meta = collect_dataset(ENV_ID, steps=steps, num_envs=num_envs, seed=0, name=NAME, fmt="both", store=store, force=True,
                           progress=False).metadata
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
    return {"import_s": imported - start, "load_s": loaded - imported, "materialise_s": materialised - imported,
            "rows": len(arrays)}


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
    return {"import_s": imported - start, "load_s": opened - imported, "materialise_s": gathered - imported,
            "rows": len(arrays["reward"])}


def run_child(which: str, store: Path, out: Path | None, cold: bool, dataset_dir: Path) -> dict:
    if cold:
        evict_from_page_cache([dataset_dir])
    command = [sys.executable, __file__, "--child", which, "--store", str(store)]
    if out is not None:
        command += ["--out", str(out)]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


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
    parser.add_argument("--child", choices=["rlpipe", "minari"], help=argparse.SUPPRESS)
    parser.add_argument("--store", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")

    if args.child:  # no torch import here: the child's import time is measured
        result = (child_rlpipe if args.child == "rlpipe" else child_minari)(args.store, args.out)
        print(json.dumps(result))
        return 0

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
            total_mb = sum(built["files"].values()) / 2**20
            print(f"# dataset: {built['steps']:,} transitions, {built['episodes']:,} episodes, built (fmt=both) in "
                  f"{built['seconds']:.1f} s; files: " + ", ".join(f"{rel} {size / 2**20:.1f} MiB" for rel, size in sorted(built["files"].items())))
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
        rows.append([cache, f"{r['load_s']:.3f}", f"{r['materialise_s']:.3f}", f"{m['load_s']:.3f}", f"{m['materialise_s']:.2f}",
                     f"{m['materialise_s'] / r['load_s']:,.0f}x", f"{m['materialise_s'] / r['materialise_s']:,.1f}x"])
    print()
    print(table(["page cache", "rlpipe load_dataset (s)", "rlpipe + copy to RAM (s)", "minari.load_dataset (s)",
                 "Minari load + iterate_episodes (s)", "ratio vs load_dataset", "ratio vs copy to RAM"], rows))
    print(f"\nimport time (not included above): rlpipe.datasets.loader {results['rlpipe_warm']['import_s']:.2f} s, "
          f"minari {results['minari_warm']['import_s']:.2f} s")

    r, m = results["rlpipe_cold"], results["minari_cold"]
    print()
    for text, ok, value in [
        ("rlpipe load under 1 s (cold, load_dataset)", r["load_s"] < 1.0, f"{r['load_s']:.3f} s"),
        ("rlpipe load under 1 s (cold, copied into RAM)", r["materialise_s"] < 1.0, f"{r['materialise_s']:.3f} s"),
        (">= 20x faster than Minari (cold, copied into RAM)", m["materialise_s"] / r["materialise_s"] >= 20,
         f"{m['materialise_s'] / r['materialise_s']:,.1f}x"),
    ]:
        print(f"goal {'MET   ' if ok else 'MISSED'} {text}: {value}")

    if args.json is not None:
        args.json.write_text(json.dumps({"date": today(), "machine": machine_description(), "core": core, "build": built,
                                         "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
