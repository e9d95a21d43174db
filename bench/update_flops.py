"""Where an update's time goes: BC, TD3+BC, IQL, CQL and SAC updates at the D4RL sizes, against their own matmuls.

Each algorithm's update is the one `rlpipe train` runs (captured as bench/offline.py
captures it; SAC's from its agent, on a replay buffer of random transitions), at the
papers' sizes: 256x256 networks, batch 256, Hopper's 11-d observations and 3-d actions,
CQL with 10 sampled actions per proposal. For each it prints:

- updates/s (minibatch sampling included, one torch thread, median of the repeats);
- GFLOP/s achieved: the update's float32 FLOPs (torch.utils.flop_counter, forward and
  backward) times updates/s;
- the matmul bound: the same update's matrix products (every mm/addmm/bmm/baddbmm it
  dispatches, with their shapes and strides, recorded once) run back to back alone, so
  the GFLOP/s this machine reaches on exactly those shapes;
- the fraction of that bound the update reaches. An update far below it spends its time
  outside the matrix products (elementwise kernels, autograd, the optimiser, Python).

    .venv/bin/python bench/update_flops.py            # all five, 3 repeats
    .venv/bin/python bench/update_flops.py --algos iql,cql --updates 100
    .venv/bin/python bench/update_flops.py --quick     # a few updates: checks it runs
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import _common  # noqa: F401  (sets thread limits before numpy/torch are imported)
import numpy as np
import torch
from _common import limit_threads, machine_description, median, random_dataset, table, today, versions
from offline import captured_update
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

ENV_ID, NAME = "Hopper-v5", "hopper-random"
OBS_DIM, ACT_DIM = 11, 3
HIDDEN, BATCH = (256, 256), 256
OFFLINE: dict[str, dict[str, Any]] = {
    "bc": dict(hidden=HIDDEN, batch_size=BATCH),
    "td3bc": dict(hidden=HIDDEN, batch_size=BATCH),
    "iql": dict(hidden=HIDDEN, batch_size=BATCH),
    "cql": dict(hidden=HIDDEN, batch_size=BATCH, num_sampled_actions=10),
}
MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default, torch.ops.aten.baddbmm.default}

Step = Callable[[int], None]


class MatmulRecorder(TorchDispatchMode):
    """Records each matrix product dispatched: its op and its arguments' shapes and strides."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, list[tuple[tuple[int, ...], tuple[int, ...]]]]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        if func in MATMULS:
            self.calls.append((func, [(tuple(a.shape), tuple(a.stride())) for a in args if isinstance(a, torch.Tensor)]))
        return func(*args, **(kwargs or {}))


def offline_step(algo: str, store: Path) -> Step:
    sampler, update, batch_size = captured_update(algo, store, "cpu", OFFLINE[algo], ENV_ID, NAME)
    return lambda i: update(sampler.sample(batch_size), i)


def sac_step() -> Step:
    from rlpipe.algos import get_algo
    from rlpipe.algos.sac import make_agent
    from rlpipe.training.buffer import ReplayBuffer

    config = get_algo("sac").make_config(ENV_ID, device="cpu", hidden=HIDDEN, batch_size=BATCH)
    env = SimpleNamespace(obs_dim=OBS_DIM, act_dim=ACT_DIM, device=torch.device("cpu"))
    rng, steps = np.random.default_rng(0), 20_000
    buffer = ReplayBuffer(steps, OBS_DIM, ACT_DIM, "cpu", seed=0)
    buffer.add(
        rng.normal(size=(steps, OBS_DIM)),
        rng.uniform(-1, 1, (steps, ACT_DIM)),
        rng.normal(size=steps),
        rng.normal(size=(steps, OBS_DIM)),
        np.zeros(steps),
    )
    update = make_agent(config, env).update
    return lambda i: update(buffer.sample(BATCH), i)


def algorithm_steps(algos: list[str], store: Path) -> Iterator[tuple[str, Step]]:
    """Each of ``algos``' update steps in turn; the offline ones train on a random Hopper
    dataset written to ``store`` first."""
    if set(algos) & set(OFFLINE):
        random_dataset(store, ENV_ID, NAME, 20_000)
    for algo in algos:
        yield algo, sac_step() if algo == "sac" else offline_step(algo, store)


def update_flops(step: Step, index: int) -> int:
    with FlopCounterMode(display=False) as counter:
        step(index)
    return int(counter.get_total_flops())


def strided_random(shape: tuple[int, ...], stride: tuple[int, ...]) -> torch.Tensor:
    """Random values laid out with ``stride`` (broadcast dimensions, stride 0, included)."""
    storage = 1 + sum((size - 1) * step for size, step in zip(shape, stride))
    return torch.randn(storage).as_strided(shape, stride)


def recorded_matmuls(step: Step, index: int) -> Callable[[], None]:
    """A function running the matrix products of one update (same ops, shapes, strides) on random data."""
    recorder = MatmulRecorder()
    with recorder:
        step(index)
    calls = [(func, [strided_random(shape, stride) for shape, stride in specs]) for func, specs in recorder.calls]

    def run() -> None:
        for func, tensors in calls:
            func(*tensors)

    return run


def seconds(fn: Callable[[], None], repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def measure(step: Step, updates: int, repeats: int) -> dict[str, float]:
    """Per-update seconds of the update and of its matmuls alone, and its FLOPs."""
    for i in range(10):  # warm-up (CQL's and TD3's delayed actor updates alternate: even count)
        step(i)
    flops = (update_flops(step, 10) + update_flops(step, 11)) / 2
    matmuls = [recorded_matmuls(step, 12), recorded_matmuls(step, 13)]
    update_times, matmul_times = [], []
    counter = iter(range(14, 10**9))
    for _ in range(repeats):
        update_times.append(seconds(lambda: step(next(counter)), updates))
        matmul_times.append(sum(seconds(run, updates // 2) for run in matmuls) / 2)
    return {"flops": flops, "update_s": median(update_times), "matmul_s": median(matmul_times)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", default="bc,td3bc,iql,cql,sac", help="comma-separated: bc, td3bc, iql, cql, sac")
    parser.add_argument("--updates", type=int, default=200, help="timed updates per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="10 updates, one repeat")
    parser.add_argument("--json", help="also write the raw results to this file")
    args = parser.parse_args()
    if args.quick:
        args.updates, args.repeats = 10, 1
    algos = args.algos.split(",")
    if unknown := set(algos) - {*OFFLINE, "sac"}:
        parser.error(f"--algos: unknown {sorted(unknown)}")
    limit_threads()
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for algo, step in algorithm_steps(algos, Path(tmp)):
            results[algo] = measure(step, args.updates, args.repeats)
            print(f"{algo}: {1 / results[algo]['update_s']:.0f} updates/s", flush=True)
    print(f"\n{today()}  {machine_description()}  {versions()}  one torch thread, 256x256, batch 256, Hopper sizes\n")
    rows = []
    for algo, r in results.items():
        achieved, bound = r["flops"] / r["update_s"] / 1e9, r["flops"] / r["matmul_s"] / 1e9
        rows.append(
            [
                algo,
                f"{1 / r['update_s']:.0f}",
                f"{r['update_s'] * 1e3:.2f}",
                f"{r['flops'] / 1e6:.0f}",
                f"{achieved:.1f}",
                f"{bound:.1f}",
                f"{achieved / bound:.0%}",
            ]
        )
    print(table(["update", "updates/s", "ms/update", "MFLOP/update", "GFLOP/s", "matmul bound GFLOP/s", "of bound"], rows))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
