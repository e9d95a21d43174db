"""The CUDA code path, checked on a machine with a GPU (CI and the target machine have none).

1. Every algorithm trains a short budget with ``device="cuda"`` and saves its checkpoint;
   the saved policy loads on CPU and on CUDA with the same weights and gives the same
   actions on both (BCQ, whose policy samples candidates, compares weights only). Offline
   algorithms train through CUDA graphs (a failed capture is an error).
2. tests/test_graphs.py and tests/test_seedstack.py, whose CUDA tests are skipped elsewhere
   (graph replays equal eager updates; the index period of TD3-style updates; batched
   seeds on CUDA, eager and replayed as a graph, equal separate updates).
3. Learning on CUDA: SAC on Pendulum-v1 with its usual 10k env steps (>= -200); CQL with
   its tuned settings on ``pendulum-mixed`` from ``--store`` (>= -180), through graphs.
4. Gradient updates per second of CQL and BC, with and without CUDA graphs, at
   bench/offline.py's equal-work settings (256x256 networks, batch 256, 10 sampled actions
   per proposal).

    python bench/cuda_check.py [--store datasets] [--learn sac cql] [--json OUT.json]
    .venv/bin/python bench/cuda_check.py --device cpu   # the same checks on CPU (a dry run)

Prints one line per check and exits non-zero if any failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import random_dataset


def stub_dvclive_if_missing() -> None:
    """Let runs write their checkpoints where DVCLive is not installed (a bare GPU machine):
    its curve files are not what this script checks. The stand-in is bench/device/stub's,
    which the test subprocesses of bench/device/remote.sh get too."""
    try:
        import dvclive  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(Path(__file__).resolve().parent / "device" / "stub"))


# name, env or dataset, overrides: a few hundred updates each, enough to run every code path
SHORT = dict(eval_every=250, eval_episodes=2)
RUNS: list[tuple[str, str, dict[str, Any]]] = [
    ("ppo", "CartPole-v1", dict(env_steps=2_048, eval_every=1_024)),
    ("sac", "Pendulum-v1", dict(env_steps=600, learning_starts=300, **SHORT)),
    ("ddpg", "Pendulum-v1", dict(env_steps=600, learning_starts=300, **SHORT)),
    ("td3", "Pendulum-v1", dict(env_steps=600, learning_starts=300, **SHORT)),
    ("ddpg-her", "GoalWorld-v0", dict(env_steps=600, learning_starts=300, **SHORT)),
    ("sac-her", "GoalWorld-v0", dict(env_steps=600, learning_starts=300, **SHORT)),
    ("bc", "cartpole-random", dict(updates=300, **SHORT)),
    ("bc", "pendulum-random", dict(updates=300, **SHORT)),
    ("gail", "cartpole-random", dict(env_steps=2_048, eval_every=1_024, eval_episodes=2)),
    ("cql", "cartpole-random", dict(updates=300, **SHORT)),
    ("cql", "pendulum-random", dict(updates=300, **SHORT)),
    ("bcq", "pendulum-random", dict(updates=300, **SHORT)),
    ("td3bc", "pendulum-random", dict(updates=300, **SHORT)),
    ("iql", "pendulum-random", dict(updates=300, **SHORT)),
    ("awac", "pendulum-random", dict(updates=300, **SHORT)),
    ("rebrac", "pendulum-random", dict(updates=300, **SHORT)),
    ("edac", "pendulum-random", dict(updates=300, **SHORT)),
    ("calql", "pendulum-random", dict(updates=300, **SHORT)),
    ("dt", "pendulum-random", dict(updates=300, **SHORT)),
    ("bcq", "cartpole-random", dict(updates=300, **SHORT)),
    ("dqn", "CartPole-v1", dict(env_steps=600, learning_starts=300, **SHORT)),
    ("qrdqn", "CartPole-v1", dict(env_steps=600, learning_starts=300, **SHORT)),
]


def check_run(algo: str, source: str, overrides: dict[str, Any], store: Path, out: Path, device: str) -> dict[str, Any]:
    """Train on ``device``, then load the checkpoint on CPU and on ``device`` and compare actions."""
    import gymnasium as gym

    from rlpipe.algos import get_algo, load_policy
    from rlpipe.training.offline import dataset_env_id

    module = get_algo(algo)
    offline = "-random" in source
    env_id = dataset_env_id(source, store) if offline else source
    extra = dict(dataset=source, store=str(store)) if offline else {}
    config = module.make_config(env_id, device=device, seed=0, **extra, **overrides)
    start = time.perf_counter()
    result = module.train(config, out, progress=False)
    seconds = time.perf_counter() - start
    on_device = {p.device.type for p in result.policy.parameters()}
    assert on_device == {device}, f"policy parameters on {on_device}"
    assert np.isfinite(result.metrics["eval_return_mean"]), result.metrics
    cpu, other = load_policy(out, device="cpu"), load_policy(out, device=device)
    env = gym.make(env_id)
    obs_space = env.observation_space
    obs_space.seed(1)
    batch = [obs_space.sample() for _ in range(16)]
    obs = {k: np.stack([o[k] for o in batch]) for k in batch[0]} if isinstance(batch[0], dict) else np.stack(batch)
    for name, value in other.actor.state_dict().items():
        torch.testing.assert_close(value.cpu(), cpu.actor.state_dict()[name], rtol=0, atol=0)
    if cpu.actor.kind != "bcq":  # BCQ samples its candidate actions, so its actions differ per call
        np.testing.assert_allclose(np.asarray(cpu(obs)), np.asarray(other(obs)), rtol=1e-4, atol=1e-4)
    return dict(eval_return=round(float(result.metrics["eval_return_mean"]), 1), seconds=round(seconds, 1))


def check_sac_learns(out: Path, device: str) -> dict[str, Any]:
    from rlpipe.algos import get_algo

    module = get_algo("sac")
    result = module.train(module.make_config("Pendulum-v1", device=device, seed=0), out, progress=False)
    ret = float(result.metrics["eval_return_mean"])
    assert ret >= -200, f"SAC on {device} reached only {ret:.1f}"
    return dict(eval_return=round(ret, 1), seconds=result.metrics["wall_seconds"])


def check_cql_learns(store: Path, out: Path, device: str) -> dict[str, Any]:
    from rlpipe.algos import get_algo

    module = get_algo("cql")
    config = module.make_config("Pendulum-v1", dataset="pendulum-mixed", store=str(store), device=device, seed=0)
    result = module.train(config, out, progress=False)
    ret = float(result.metrics["eval_return_mean"])
    assert ret >= -180, f"CQL on {device} reached only {ret:.1f}"
    return dict(eval_return=round(ret, 1), updates=result.metrics["gradient_updates"], seconds=result.metrics["wall_seconds"])


def run_graph_tests() -> dict[str, Any]:
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_graphs.py", "tests/test_seedstack.py"],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr.strip()[-500:]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return dict(summary=summary)


def update_rates(store: Path, device: str) -> dict[str, Any]:
    import offline  # bench/offline.py: the update and the stepping exactly as `rlpipe train` runs them

    rates: dict[str, dict[str, float]] = {}
    before = os.environ.get("RLPIPE_CUDA_GRAPHS")
    try:
        for graphs in ("1", "0") if device == "cuda" else ("0",):
            os.environ["RLPIPE_CUDA_GRAPHS"] = graphs
            label = "graphs" if graphs == "1" else "eager"
            for algo, n in (("cql", 1_000), ("bc", 3_000)) if device == "cuda" else (("cql", 30), ("bc", 300)):
                wall, _ = offline.time_rlpipe(algo, store, n, device)
                rates.setdefault(algo, {})[label] = round(n / wall, 1)
    finally:  # leave the caller's setting as it was
        if before is None:
            os.environ.pop("RLPIPE_CUDA_GRAPHS", None)
        else:
            os.environ["RLPIPE_CUDA_GRAPHS"] = before
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    return dict(updates_per_s=rates, device=name, torch=torch.__version__)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a dry run of the same checks")
    parser.add_argument("--store", type=Path, help="a store holding pendulum-mixed (for the CQL learning check)")
    parser.add_argument("--learn", nargs="*", choices=("sac", "cql"), default=["sac", "cql"], help="learning checks to run")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this script checks the CUDA code path")
    stub_dvclive_if_missing()
    results: dict[str, Any] = {}
    failed = 0

    def check(name: str, fn: Callable[[], dict[str, Any]]) -> None:
        nonlocal failed
        try:
            results[name] = fn()
            print(f"ok    {name}: {results[name]}", flush=True)
        except Exception as exc:  # report every check, then fail at the end
            failed += 1
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"FAIL  {name}: {type(exc).__name__}: {exc}", flush=True)
            traceback.print_exc()

    with tempfile.TemporaryDirectory(prefix="rlpipe-cuda-") as tmp:
        store = Path(tmp) / "datasets"
        random_dataset(store, "CartPole-v1", "cartpole-random", 5_000)
        random_dataset(store, "Pendulum-v1", "pendulum-random", 20_000)
        for i, (algo, source, overrides) in enumerate(RUNS):
            check(f"{algo} {source}", lambda: check_run(algo, source, overrides, store, Path(tmp) / f"run{i}", args.device))
        check("tests/test_graphs.py", run_graph_tests)
        if "sac" in args.learn:
            check(f"sac learns Pendulum-v1 on {args.device}", lambda: check_sac_learns(Path(tmp) / "sac-learn", args.device))
        if "cql" in args.learn:
            if args.store is None:
                print("skip  cql learning: no --store with pendulum-mixed")
            else:
                check(
                    f"cql learns pendulum-mixed on {args.device}",
                    lambda: check_cql_learns(args.store, Path(tmp) / "cql-learn", args.device),
                )
        check("update rates", lambda: update_rates(store, args.device))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    print(f"{len(results) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
