"""Collection speed: rlpipe vs raw gymnasium stepping vs Minari's DataCollector, in one run.

Contenders (CartPole-v1, uniform random actions, every one on the same single core):

  raw gym.make, 1 env          env.step + action_space.sample(), reset on episode end; nothing stored
  raw gym.make_vec, 64 envs    gymnasium's native vector CartPole; nothing stored
  raw gym.make_vec, 1 env      the same with one env (what rlpipe's 1-env collection steps)
  rlpipe collect, 64 envs      library call: collect_dataset(fmt="arrow"), i.e. DatasetWriter + collect + finalize
  rlpipe collect, 1 env        the same with num_envs=1
  rlpipe collect CLI, 64 envs  `rlpipe collect ... --format arrow --quiet --force` as a subprocess
                               (includes interpreter start-up and imports)
  rlpipe collect CLI, defaults `rlpipe collect --policy random --env CartPole-v1 --steps N --format arrow`
                               (--num-envs auto: 256 envs at 1M steps), 1M steps by default
  rlpipe collect CLI, 1 env    the same with --num-envs 1 (a plain gym.make loop)
  rlpipe collect CLI, both     the defaults with --format both (Arrow, then Minari's HDF5 layout
                               written from the finished shards)
  Minari DataCollector hdf5    minari.DataCollector(gym.make(...), data_format="hdf5") stepped like
                               the raw single env, then create_dataset
  Minari DataCollector arrow   the same with data_format="arrow" (fewer steps by default: Minari's
                               Arrow storage writes one pyarrow.dataset partition per episode and
                               slows down as the dataset grows -- ~1,300 steps/s at 5k steps, ~140
                               at 50k -- so a short run flatters it)

Rates are *stored* transitions per second of wall time, including writer set-up and the final
write (finalize / create_dataset). For rlpipe that counts only transitions of whole episodes
(it drops the unfinished tail and gymnasium's autoreset steps), so it is slightly conservative.
Each timing is the median of --repeat runs after an untimed warm-up. Besides wall time the
table gives CPU time (user + system, this process and its children): on a shared machine the
wall-clock rate understates what one free core does, the CPU-time rate is close to it.

    .venv/bin/python bench/collect.py            # full run (200k / 50k / 10k steps, 3 repeats; ~5 min)
    .venv/bin/python bench/collect.py --quick    # a few seconds

Needs the `bench` extra (minari[create] brings jax):  pip install -c constraints.txt -e '.[dev,bench]'
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import _common  # noqa: F401  (sets thread limits before numpy is imported)
import gymnasium as gym
import numpy as np
from _common import core_loads, least_busy_core, limit_threads, machine_description, median, pinned, table, today, versions

ENV_ID = "CartPole-v1"


# ---------------------------------------------------------------------------- contenders
# Each takes (steps, workdir, seed) and returns the number of transitions it produced/stored;
# the caller times it.


def step_randomly(env: gym.Env, steps: int, seed: int) -> None:
    """`steps` single-env steps with action_space.sample(), resetting on episode end: the loop
    both raw gymnasium and Minari's DataCollector are timed on."""
    env.action_space.seed(seed)
    env.reset(seed=seed)
    step, sample = env.step, env.action_space.sample
    for _ in range(steps):
        _, _, terminated, truncated, _ = step(sample())
        if terminated or truncated:
            env.reset()


def raw_single(steps: int, workdir: Path, seed: int) -> int:
    env = gym.make(ENV_ID)
    step_randomly(env, steps, seed)
    env.close()
    return steps


def raw_vector(num_envs: int) -> Callable[[int, Path, int], int]:
    def run(steps: int, workdir: Path, seed: int) -> int:
        envs = gym.make_vec(ENV_ID, num_envs=num_envs)
        rng = np.random.default_rng(seed)
        envs.reset(seed=seed)
        calls = -(-steps // num_envs)
        for _ in range(calls):
            envs.step(rng.integers(2, size=num_envs))
        envs.close()
        return calls * num_envs

    return run


def rlpipe_library(num_envs: int) -> Callable[[int, Path, int], int]:
    from rlpipe.commands.collect import collect_dataset

    def run(steps: int, workdir: Path, seed: int) -> int:
        collected = collect_dataset(
            ENV_ID, steps=steps, num_envs=num_envs, seed=seed, name="bench", fmt="arrow", store=workdir, force=True, progress=False
        )
        return int(collected.metadata["total_steps"])

    return run


def rlpipe_cli(num_envs: int | None, fmt: str = "arrow") -> Callable[[int, Path, int], int]:
    """`rlpipe collect` as a subprocess; num_envs None leaves --num-envs at its default (auto)."""
    exe = Path(sys.executable).with_name("rlpipe")
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "rlpipe.cli.main"]
    envs = [] if num_envs is None else ["--num-envs", str(num_envs)]

    def run(steps: int, workdir: Path, seed: int) -> int:
        subprocess.run(
            command
            + [
                "collect",
                "--policy",
                "random",
                "--env",
                ENV_ID,
                "--steps",
                str(steps),
                *envs,
                "--seed",
                str(seed),
                "--format",
                fmt,
                "--name",
                "bench-cli",
                "--store",
                str(workdir),
                "--quiet",
                "--force",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        return int(json.loads((workdir / "bench-cli" / "metadata.json").read_text())["total_steps"])

    return run


def minari_collector(data_format: str) -> Callable[[int, Path, int], int]:
    import minari

    counter = iter(range(10**9))

    def run(steps: int, workdir: Path, seed: int) -> int:
        # DataCollector and create_dataset both use $MINARI_DATASETS_PATH (set to a temp dir in main).
        env = minari.DataCollector(gym.make(ENV_ID), data_format=data_format)
        step_randomly(env, steps, seed)
        dataset = env.create_dataset(dataset_id=f"bench-{data_format}-{next(counter)}-v0", algorithm_name="random")
        env.close()
        return int(dataset.total_steps)

    return run


def cli_startup_seconds(repeat: int = 3) -> float:
    exe = Path(sys.executable).with_name("rlpipe")
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "rlpipe.cli.main"]
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(command + ["collect", "--help"], check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return median(times)


# ---------------------------------------------------------------------------- harness


def cpu_seconds() -> float:
    """User + system CPU time of this process and its waited-for children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def measure(fn: Callable[[int, Path, int], int], steps: int, repeat: int, warmup_steps: int, seed: int = 0) -> dict:
    base = Path(tempfile.mkdtemp(prefix="rlpipe-bench-"))
    try:
        fn(warmup_steps, base / "warmup", seed)  # imports, first-call costs, file-system warm-up
        rates, counts, seconds, cpu_rates = [], [], [], []
        for index in range(repeat):
            workdir = base / f"run{index}"
            start, cpu_start = time.perf_counter(), cpu_seconds()
            count = fn(steps, workdir, seed)
            elapsed, cpu = time.perf_counter() - start, cpu_seconds() - cpu_start
            rates.append(count / elapsed)
            cpu_rates.append(count / cpu)
            counts.append(count)
            seconds.append(elapsed)
            shutil.rmtree(workdir, ignore_errors=True)
        return {
            "steps": int(median(counts)),
            "seconds": median(seconds),
            "rate": median(rates),
            "rates": rates,
            "cpu_rate": median(cpu_rates),
        }
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200_000, help="steps for the fast contenders (raw gym, rlpipe 64 envs, CLI)")
    parser.add_argument("--slow-steps", type=int, default=50_000, help="steps for the slow ones (Minari DataCollector, rlpipe 1 env)")
    parser.add_argument(
        "--minari-arrow-steps",
        type=int,
        default=10_000,
        help="steps for Minari's Arrow DataCollector: its cost per step grows with the episodes already "
        "written (one pyarrow.dataset partition per episode), so fewer steps flatter it",
    )
    parser.add_argument("--cli-steps", type=int, default=1_000_000, help="steps for the CLI runs with default options (the goal's 1M)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per contender (the median is reported)")
    parser.add_argument("--quick", action="store_true", help="short run: 20k / 5k steps, 1 repeat")
    parser.add_argument("--core", type=int, default=None, help="core to pin the whole run to (default: the least busy one)")
    parser.add_argument("--no-pin", action="store_true", help="do not pin to one core")
    parser.add_argument("--skip-minari", action="store_true", help="leave out Minari's DataCollector")
    parser.add_argument("--json", type=Path, default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.slow_steps, args.minari_arrow_steps, args.repeat, args.cli_steps = 20_000, 5_000, 5_000, 1, 50_000

    limit_threads()
    loads = core_loads()
    core = None if args.no_pin else (args.core if args.core is not None else least_busy_core())
    minari_root = Path(tempfile.mkdtemp(prefix="rlpipe-bench-minari-"))
    os.environ["MINARI_DATASETS_PATH"] = str(minari_root)
    warnings.filterwarnings("ignore")

    fast, slow = args.steps, args.slow_steps
    warm_fast, warm_slow = min(fast, 5_000), min(slow, 2_000)
    contenders: list[tuple[str, str, Callable, int, int]] = [
        ("raw_single", "raw gymnasium gym.make, 1 env (no writing)", raw_single, fast, warm_fast),
        ("raw_vec64", "raw gymnasium gym.make_vec, 64 envs (no writing)", raw_vector(64), fast, warm_fast),
        ("raw_vec1", "raw gymnasium gym.make_vec, 1 env (no writing)", raw_vector(1), slow, warm_slow),
        ("rlpipe64", "rlpipe collect (library), 64 envs, Arrow + finalize", rlpipe_library(64), fast, warm_fast),
        ("rlpipe1", "rlpipe collect (library), 1 env, Arrow + finalize", rlpipe_library(1), slow, warm_slow),
        ("rlpipe_cli64", "`rlpipe collect` CLI, 64 envs, Arrow (incl. process start-up)", rlpipe_cli(64), fast, 200),
        (
            "rlpipe_cli_auto",
            "`rlpipe collect` CLI, default options (auto envs), Arrow (whole process)",
            rlpipe_cli(None),
            args.cli_steps,
            200,
        ),
        ("rlpipe_cli1", "`rlpipe collect` CLI, --num-envs 1, Arrow (whole process)", rlpipe_cli(1), args.cli_steps, 200),
        ("rlpipe_cli_both", "`rlpipe collect` CLI, default options, --format both (whole process)", rlpipe_cli(None, "both"), fast, 200),
    ]
    # Minari's DataCollector needs jax (minari[create]); without it the peer cannot run.
    minari_missing = "" if importlib.util.find_spec("jax") else "jax is not installed (pip install 'minari[create]')"
    if minari_missing and not args.skip_minari:
        print(f"# Minari's DataCollector left out: {minari_missing}; rlpipe's side is measured alone")
    if not args.skip_minari and not minari_missing:
        contenders += [
            ("minari_hdf5", "Minari DataCollector, hdf5, + create_dataset", minari_collector("hdf5"), slow, warm_slow),
            (
                "minari_arrow",
                "Minari DataCollector, arrow, + create_dataset",
                minari_collector("arrow"),
                args.minari_arrow_steps,
                min(warm_slow, args.minari_arrow_steps),
            ),
        ]

    where = f"pinned to core {core}" if core is not None else "not pinned"
    print(f"# collection benchmark, {ENV_ID}, random policy -- {today()}")
    print(f"# machine: {machine_description()}")
    print("# core busy share before start: " + ", ".join(f"cpu{c} {v:.0%}" for c, v in loads.items()) + f"; this run {where}, 1 thread")
    print(f"# {versions('rlpipe', 'gymnasium', 'minari', 'jax', 'numpy', 'pyarrow', 'h5py')}")
    print(
        f"# steps: {args.cli_steps:,} (CLI default options, CLI 1 env), {fast:,} (raw gym.make, raw vec 64, rlpipe 64 envs, CLI 64 envs, CLI both), {slow:,} (raw vec 1, rlpipe 1 env, Minari HDF5), "
        f"{args.minari_arrow_steps:,} (Minari Arrow); median of {args.repeat}"
    )
    results: dict[str, dict] = {}
    try:
        with pinned(None if core is None else [core]):
            startup = cli_startup_seconds()
            for key, label, fn, steps, warmup in contenders:
                results[key] = measure(fn, steps, args.repeat, warmup)
                results[key]["label"] = label
                print(f"  {label}: {results[key]['rate']:,.0f} steps/s wall, {results[key]['cpu_rate']:,.0f} per CPU second", flush=True)
    finally:
        shutil.rmtree(minari_root, ignore_errors=True)

    rows = [[r["label"], f"{r['steps']:,}", f"{r['seconds']:.3f}", f"{r['rate']:,.0f}", f"{r['cpu_rate']:,.0f}"] for r in results.values()]
    print()
    print(table(["contender", "steps", "seconds", "steps/s (wall)", "steps per CPU second"], rows))
    print(f"\n`rlpipe collect --help` start-up (interpreter + imports): {startup:.2f} s (median of 3)")

    def ratio(a: str, b: str, key: str = "rate") -> float | None:
        return results[a][key] / results[b][key] if a in results and b in results else None

    short = {
        "raw_single": "raw 1 env",
        "raw_vec64": "raw vec 64",
        "raw_vec1": "raw vec 1",
        "rlpipe64": "rlpipe 64 envs",
        "rlpipe1": "rlpipe 1 env",
        "rlpipe_cli64": "rlpipe CLI 64 envs",
        "rlpipe_cli_auto": "rlpipe CLI defaults",
        "rlpipe_cli1": "rlpipe CLI 1 env",
        "rlpipe_cli_both": "rlpipe CLI defaults, both",
        "minari_hdf5": "Minari HDF5",
        "minari_arrow": "Minari Arrow",
    }
    ratio_rows = []
    for a, b in [
        ("rlpipe64", "minari_hdf5"),
        ("rlpipe64", "minari_arrow"),
        ("rlpipe64", "raw_vec64"),
        ("rlpipe64", "raw_single"),
        ("rlpipe1", "minari_hdf5"),
        ("rlpipe1", "minari_arrow"),
        ("rlpipe1", "raw_single"),
        ("rlpipe1", "raw_vec1"),
        ("rlpipe_cli64", "minari_hdf5"),
        ("rlpipe_cli_auto", "minari_hdf5"),
        ("rlpipe_cli_both", "minari_hdf5"),
        ("rlpipe_cli1", "raw_single"),
        ("rlpipe_cli_both", "rlpipe_cli_auto"),  # what also writing Minari's HDF5 layout costs
    ]:
        value = ratio(a, b)
        if value is not None:
            ratio_rows.append([f"{short[a]} / {short[b]}", f"{value:.2f}x", f"{ratio(a, b, 'cpu_rate'):.2f}x"])
    print()
    print(table(["ratio", "wall", "CPU time"], ratio_rows))

    print()
    goals = []
    vs_minari = ratio("rlpipe_cli_auto", "minari_hdf5")
    if vs_minari is not None:
        goals.append(("`rlpipe collect` defaults >= 30x Minari HDF5 DataCollector (wall, same run)", vs_minari >= 30, f"{vs_minari:.1f}x"))
    default = results["rlpipe_cli_auto"]
    goals.append(
        (
            f"`rlpipe collect` defaults >= 100k steps/s, whole process (wall{'' if core is not None else ', NOT pinned'})",
            default["rate"] >= 100_000,
            f"{default['rate']:,.0f} steps/s (per CPU second: {default['cpu_rate']:,.0f})",
        )
    )
    half = ratio("rlpipe_cli1", "raw_single")
    goals.append(("`rlpipe collect --num-envs 1` >= half of raw gym.make stepping (wall)", half >= 0.5, f"{half:.2f}x"))
    for text, ok, value in goals:
        print(f"goal {'MET   ' if ok else 'MISSED'} {text}: {value}")
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "date": today(),
                    "machine": machine_description(),
                    "core": core,
                    "cli_startup_s": startup,
                    "steps": fast,
                    "slow_steps": slow,
                    "minari_arrow_steps": args.minari_arrow_steps,
                    "repeat": args.repeat,
                    "results": results,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
