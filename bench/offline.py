"""Offline RL speed: gradient updates per second, rlpipe vs d3rlpy, for CQL and BC.

Equal work on both sides: 256x256 networks (actor and both critics for CQL, the policy
for BC), batch size 256, CQL with 10 sampled actions per state for each of its three
proposals (uniform, policy at s, policy at s'; d3rlpy's default), one torch thread, the
same transitions (a Pendulum-v1 dataset exported to .npz for d3rlpy). Each timed update
includes sampling the minibatch, as in training.

rlpipe's update is the one `rlpipe train` runs: `train` builds the networks and hands its
update function to the shared offline loop, where this script catches it instead of
starting the loop. d3rlpy pins gymnasium 1.0.0, so it runs in its own virtualenv
(`.bench-venvs/d3rlpy`, created on first use with
`python3 -m venv .bench-venvs/d3rlpy && .bench-venvs/d3rlpy/bin/pip install d3rlpy==2.8.1 "$(grep '^torch==' constraints.txt)"`:
only constraints.txt's torch pin, as its other pins hold gymnasium 1.4)
through `bench/peers/d3rlpy_offline.py`, which prints one JSON line. Both are pinned to
the least busy core; rlpipe and d3rlpy alternate, median of the repeats. Rates are given
per wall second and per second of the timing process's CPU time (less disturbed when
other processes share the core).

    .venv/bin/python bench/offline.py              # 3 repeats
    .venv/bin/python bench/offline.py --quick      # a few updates, one repeat
    python3 bench/offline.py --device cuda --peer-python PY   # both on a GPU; PY runs d3rlpy

On CUDA d3rlpy runs twice by default: eager (its default) and with its own
``compile_graph=True`` (torch.compile + CUDA graphs, its best configuration);
``--peer-configs`` chooses.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import subprocess
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any
from unittest import mock

import _common  # noqa: F401  (sets thread limits before numpy/torch are imported)
import numpy as np
from _common import (
    core_loads,
    least_busy_core,
    limit_threads,
    machine_description,
    median,
    pinned,
    random_dataset,
    table,
    today,
    versions,
)

ROOT = Path(__file__).resolve().parent.parent
PEER_VENV = ROOT / ".bench-venvs" / "d3rlpy"
PEER_PYTHON = PEER_VENV / "bin" / "python"
PEER_SCRIPT = ROOT / "bench" / "peers" / "d3rlpy_offline.py"
ENV_ID, NAME = "Pendulum-v1", "pendulum-random"
HIDDEN, BATCH, SAMPLED_ACTIONS = 256, 256, 10
# rlpipe config overrides giving the same work as the peer's settings above.
RLPIPE_CONFIGS: dict[str, dict[str, Any]] = {
    "cql": dict(hidden=(HIDDEN, HIDDEN), batch_size=BATCH, num_sampled_actions=SAMPLED_ACTIONS),
    "bc": dict(hidden=(HIDDEN, HIDDEN), batch_size=BATCH, continuous_loss="mse"),
}


def ensure_peer_venv() -> None:
    """Create d3rlpy's virtualenv the documented way if it is missing."""
    if PEER_PYTHON.exists():
        return
    print(f"creating {PEER_VENV} (d3rlpy 2.8.1) ...", flush=True)
    subprocess.run(["python3", "-m", "venv", str(PEER_VENV)], check=True)
    pins = [line for line in (ROOT / "constraints.txt").read_text().splitlines() if line.startswith(("torch==", "mujoco=="))]
    # as the Makefile's bench target: MuJoCo (and imageio, which gymnasium's MuJoCo envs import) for bench/d4rl_peer.py
    subprocess.run([str(PEER_VENV / "bin" / "pip"), "install", "-q", "d3rlpy==2.8.1", *pins, "imageio==2.38.2"], check=True, cwd=ROOT)


def build_dataset(store: Path, steps: int) -> Path:
    """A random-policy Pendulum dataset in `store` and its .npz export for the peer."""
    from rlpipe.datasets.d4rl import d4rl_arrays
    from rlpipe.datasets.loader import load_dataset

    random_dataset(store, ENV_ID, NAME, steps)
    data = load_dataset(NAME, store)
    npz = store / f"{NAME}.npz"
    np.savez(npz, **d4rl_arrays(data))  # timeouts = truncated & ~terminated, as d3rlpy requires
    return npz


class _Caught(Exception):
    """Raised by the stand-in training loop once it holds the update function."""


def captured_update(
    algo: str, store: Path, device: str = "cpu", overrides: dict[str, Any] | None = None, env_id: str = ENV_ID, name: str = NAME
) -> tuple[Any, Any, int]:
    """(sampler, update, batch_size) exactly as `rlpipe train ALGO` would run them on dataset
    `name` of `env_id` (config: `RLPIPE_CONFIGS[algo]`, or `overrides`)."""
    from rlpipe.algos import get_algo

    spec = get_algo(algo)
    module: ModuleType = importlib.import_module(spec.train.__module__)
    config = spec.make_config(
        env_id, dataset=name, store=str(store), device=device, **(RLPIPE_CONFIGS[algo] if overrides is None else overrides)
    )
    caught: dict[str, Any] = {}

    def stand_in(_algo: str, _config: Any, data: Any, learner: Any, *_: Any) -> None:
        caught.update(sampler=data.sampler if learner.sampler is None else learner.sampler, update=learner.update)
        raise _Caught

    with mock.patch.object(module, "train_offline", stand_in), contextlib.suppress(_Caught):
        module.train(config, progress=False)
    return caught["sampler"], caught["update"], config.batch_size


def time_rlpipe(algo: str, store: Path, updates: int, device: str = "cpu", overrides: dict[str, Any] | None = None) -> tuple[float, float]:
    """Wall and CPU seconds for `updates` rlpipe updates (sampling included), stepped as
    `rlpipe train` steps them, after an untimed start: one update on CPU; on CUDA the
    eager warm-up and the capture of the CUDA graph that the timed updates replay."""
    import torch

    from rlpipe.training.graphs import UpdateStepper, graphs_enabled

    sampler, update, batch_size = captured_update(algo, store, device, overrides)
    step = UpdateStepper(update, sampler, batch_size, total=10**9, graph=graphs_enabled(torch.device(device)))
    done = step(0)
    sync = torch.cuda.synchronize if device == "cuda" else lambda: None
    sync()
    start, cpu_start, end = time.perf_counter(), time.process_time(), done + updates
    while done < end:
        done += step(done)
    sync()
    return time.perf_counter() - start, time.process_time() - cpu_start


def time_d3rlpy(
    algo: str, npz: Path, updates: int, device: str = "cpu", python: Path = PEER_PYTHON, compiled: bool = False
) -> tuple[float, float]:
    """Wall and CPU seconds for `updates` d3rlpy updates, run in its own virtualenv
    (``compiled``: with d3rlpy's ``compile_graph=True``)."""
    cmd = [
        str(python),
        str(PEER_SCRIPT),
        str(npz),
        "--algo",
        algo,
        "--updates",
        str(updates),
        "--batch-size",
        str(BATCH),
        "--hidden",
        str(HIDDEN),
        "--action-samples",
        str(SAMPLED_ACTIONS),
        "--device",
        "cuda:0" if device == "cuda" else "cpu:0",
        *(["--compile-graph"] if compiled else []),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"d3rlpy peer failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    result = json.loads(lines[-1])
    return result["seconds"], result["cpu_seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cql-updates", type=int, default=50)
    parser.add_argument("--bc-updates", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=20_000, help="transitions in the dataset")
    parser.add_argument("--quick", action="store_true", help="5 CQL / 100 BC updates, one repeat")
    parser.add_argument("--json", help="also write the raw results to this file")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where both sides train")
    parser.add_argument("--peer-python", type=Path, help="an interpreter with d3rlpy 2.8.1 (default: its own venv, created if missing)")
    parser.add_argument(
        "--peer-configs",
        help="d3rlpy configurations, comma-separated from eager,compiled "
        "(compiled: compile_graph=True; default: eager on cpu, both on cuda)",
    )
    args = parser.parse_args()
    peer_configs = (args.peer_configs or ("eager,compiled" if args.device == "cuda" else "eager")).split(",")
    if not set(peer_configs) <= {"eager", "compiled"}:
        parser.error(f"--peer-configs: expected eager and/or compiled, got {args.peer_configs!r}")
    if args.quick:
        args.repeats, args.cql_updates, args.bc_updates, args.steps = 1, 5, 100, 2_000
    limit_threads()
    peer_python = args.peer_python or PEER_PYTHON
    if args.peer_python is None:
        ensure_peer_venv()
    peer_versions = subprocess.run(
        [
            str(peer_python),
            "-c",
            "import d3rlpy, torch, gymnasium; "
            "print(f'd3rlpy {d3rlpy.__version__}, torch {torch.__version__}, gymnasium {gymnasium.__version__}')",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    updates = {"cql": args.cql_updates, "bc": args.bc_updates}
    with tempfile.TemporaryDirectory(prefix="rlpipe-bench-offline-") as tmp:
        store = Path(tmp)
        npz = build_dataset(store, args.steps)
        core = least_busy_core()
        print(f"date: {today()}; machine: {machine_description()}")
        print(f"rlpipe side: {versions('torch', 'gymnasium', 'rlpipe')}; peer side: {peer_versions}")
        print(
            f"device: {args.device}; dataset: {NAME}, {args.steps} transitions; nets {HIDDEN}x{HIDDEN}, batch {BATCH}, "
            f"CQL sampled actions {SAMPLED_ACTIONS} per proposal; torch threads 1 for both, pinned to core {core}; "
            "core loads before start: " + ", ".join(f"{c}: {load:.0%}" for c, load in core_loads().items()),
            flush=True,
        )
        # algo -> library -> per repeat: (updates per wall second, updates per CPU second)
        peers = {("d3rlpy" if name == "eager" else "d3rlpy compile_graph"): name == "compiled" for name in peer_configs}
        raw: dict[str, dict[str, list[tuple[float, float]]]] = {algo: {"rlpipe": [], **{p: [] for p in peers}} for algo in updates}
        runners = {
            "rlpipe": lambda algo, n: time_rlpipe(algo, store, n, args.device),
            **{
                peer: (lambda algo, n, c=compiled: time_d3rlpy(algo, npz, n, args.device, peer_python, c))
                for peer, compiled in peers.items()
            },
        }
        with pinned([core]):
            for repeat in range(args.repeats):
                for algo, n in updates.items():
                    for library, runner in runners.items():
                        wall, cpu = runner(algo, n)
                        raw[algo][library].append((n / wall, n / cpu))
                        print(
                            f"  repeat {repeat} {algo} {library}: {n / wall:.2f} updates/s wall, {n / cpu:.2f} per CPU second", flush=True
                        )
    rows = []
    for algo, n in updates.items():
        rates = {library: [median([rate[i] for rate in raw[algo][library]]) for i in (0, 1)] for library in runners}
        ours, ours_cpu = rates["rlpipe"]
        for peer in peers:
            theirs, theirs_cpu = rates[peer]
            rows.append(
                [
                    algo.upper(),
                    n,
                    peer,
                    f"{theirs:.2f} ({theirs_cpu:.2f})",
                    f"{ours:.2f} ({ours_cpu:.2f})",
                    f"{ours / theirs:.2f}x ({ours_cpu / theirs_cpu:.2f}x)",
                ]
            )
    print()
    print(
        table(
            [
                "algorithm",
                "updates timed",
                "peer configuration",
                "peer updates/s (per CPU s)",
                "rlpipe updates/s (per CPU s)",
                "rlpipe / peer",
            ],
            rows,
        )
    )
    print("\ncore loads after: " + ", ".join(f"{c}: {load:.0%}" for c, load in core_loads().items()))
    if args.json:
        Path(args.json).write_text(json.dumps(raw, indent=2) + "\n")


if __name__ == "__main__":
    main()
