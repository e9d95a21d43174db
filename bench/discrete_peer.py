"""Discrete CQL on MinAtar Breakout's DQN replay, rlpipe vs d3rlpy: held-out return and wall time.

The data is the pipeline's ``minatar-breakout-replay`` (every frame of a 100k-frame DQN run,
10 x 10 x 4 bool boards; ``make repro`` writes it to ./datasets, or ``rlpipe collect --env
MinAtar/Breakout-v1 --expert dqn --from-training --expert-steps 100000 --seed 0 --name
minatar-breakout-replay``), exported once to an .npz (boards as uint8, an episode's last row
a timeout unless it terminated) for d3rlpy (bench/peers/d3rlpy_discrete.py, in d3rlpy's own
virtualenv: see bench/offline.py). For each seed, pinned to one core, one torch thread:

- rlpipe: ``rlpipe train cql --dataset minatar-breakout-replay --seed S --set updates=N`` (its
  defaults otherwise: MinAtar's CNN and 256x256, batch 256, Adam 3e-4, beta 5, Polyak 0.005,
  DQN target, MSE), one 10-episode evaluation at the end;
- d3rlpy's ``DiscreteCQL`` (double-DQN target, Huber loss, target copied every
  ``target_update_interval`` updates) on the same network, in two configurations: "rlpipe's
  settings" (batch 256, Adam 3e-4, alpha 5, a copy every 200 updates: Polyak 0.005's time
  scale) and "d3rlpy defaults" (its ``DiscreteCQLConfig``: batch 32, Adam 6.25e-5, alpha 1,
  a copy every 8000 updates).

Each policy then plays ``--episodes`` episodes with rlpipe's held-out protocol (env seeds
S + 20000 + i): d3rlpy's through the TorchScript greedy policy it saves, so one piece of code
scores both sides. Wall time: rlpipe's ``wall_seconds`` (its training loop, the final
10-episode evaluation included), d3rlpy's ``fit``.

    .venv/bin/python bench/discrete_peer.py --seeds 0-2          # ~25 min on one core
    .venv/bin/python bench/discrete_peer.py --quick              # 100 updates, 5 episodes: checks it runs
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import _common  # noqa: F401  (sets thread limits before numpy/torch are imported)
import numpy as np
from _common import least_busy_core, limit_threads, pinned, pinned_setup, table, today
from offline import PEER_PYTHON, ROOT, ensure_peer_venv

PEER_SCRIPT = ROOT / "bench" / "peers" / "d3rlpy_discrete.py"
PEER_CONFIGS: dict[str, list[str]] = {
    "rlpipe's settings": ["--batch-size", "256", "--learning-rate", "3e-4", "--alpha", "5", "--target-update-interval", "200"],
    "d3rlpy defaults": ["--batch-size", "32", "--learning-rate", "6.25e-5", "--alpha", "1", "--target-update-interval", "8000"],
}


def export_npz(name: str, store: Path, path: Path) -> str:
    """The dataset's transitions as d3rlpy's MDPDataset columns in ``path``; returns its env id."""
    from rlpipe.datasets.loader import load_shards
    from rlpipe.datasets.store import open_dataset

    info = open_dataset(name, store)
    arrays = load_shards(info)
    last = np.append(arrays.episode_id[1:] != arrays.episode_id[:-1], True)  # rows are sorted by episode, step
    terminals = np.asarray(arrays.terminated, bool)
    np.savez(
        path,
        observations=np.asarray(arrays.obs).astype(np.uint8),
        actions=np.asarray(arrays.action).astype(np.int64),
        rewards=np.asarray(arrays.reward, np.float32),
        terminals=terminals,
        timeouts=last & ~terminals,
        action_size=info.action_space.n,
    )
    return str(info.env_id)


def heldout(policy_file: Path, env_id: str, seed: int, episodes: int) -> tuple[float, float]:
    """Mean and standard error of a TorchScript greedy policy's returns under rlpipe's held-out protocol."""
    import torch

    from rlpipe.training.evaluation import evaluate
    from rlpipe.training.run import HELDOUT_SEED_OFFSET

    policy = torch.jit.load(str(policy_file))

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return policy(torch.as_tensor(obs, dtype=torch.float32)).numpy()

    result = evaluate(act, env_id, episodes, seed + HELDOUT_SEED_OFFSET)
    return result.mean, float(result.std / np.sqrt(episodes))


def run_rlpipe(name: str, store: Path, seed: int, updates: int, episodes: int, out: Path) -> dict[str, Any]:
    settings = [f"updates={updates}", f"eval_every={updates}", f"heldout_eval_episodes={episodes}"]
    cmd = ["rlpipe", "train", "cql", "--dataset", name, "--store", str(store), "--seed", str(seed), "--device", "cpu"]
    cmd += [arg for setting in settings for arg in ("--set", setting)] + ["--out", str(out), "--no-progress"]
    subprocess.run([str(ROOT / ".venv" / "bin" / cmd[0]), *cmd[1:]], check=True, capture_output=True)
    metrics = json.loads((out / "metrics.json").read_text())
    error = float(metrics["heldout_return_std"] / np.sqrt(metrics["heldout_episodes"]))
    return {"return": metrics["heldout_return_mean"], "error": error, "seconds": metrics["wall_seconds"]}


def run_d3rlpy(npz: Path, env_id: str, seed: int, updates: int, episodes: int, config: list[str], policy: Path) -> dict[str, Any]:
    cmd = [
        str(PEER_PYTHON),
        str(PEER_SCRIPT),
        str(npz),
        "--policy-out",
        str(policy),
        "--seed",
        str(seed),
        "--updates",
        str(updates),
        *config,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"d3rlpy peer failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    mean, error = heldout(policy, env_id, seed, episodes)
    return {"return": mean, "error": error, "seconds": json.loads(lines[-1])["seconds"]}


def seeds_of(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def mean_error(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.2f}"
    return f"{np.mean(values):.2f} ± {np.std(values, ddof=1) / np.sqrt(len(values)):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="minatar-breakout-replay")
    parser.add_argument("--store", type=Path, default=ROOT / "datasets")
    parser.add_argument("--seeds", default="0-2", help="a seed or a range, e.g. 0-2")
    parser.add_argument("--updates", type=int, default=5000, help="the pipeline's budget")
    parser.add_argument("--episodes", type=int, default=100, help="held-out episodes per run")
    parser.add_argument("--peer-configs", default=",".join(PEER_CONFIGS), help="d3rlpy configurations, comma-separated")
    parser.add_argument("--quick", action="store_true", help="100 updates and 5 episodes a run")
    parser.add_argument("--core", type=int, help="the core to pin both sides to (default: the least busy)")
    parser.add_argument("--json", type=Path, help="also write the raw results to this file")
    args = parser.parse_args()
    limit_threads()
    ensure_peer_venv()
    updates, episodes = (100, 5) if args.quick else (args.updates, args.episodes)
    configs = args.peer_configs.split(",")
    core = least_busy_core() if args.core is None else args.core
    print(pinned_setup(core, "torch", "gymnasium", "minatar"), flush=True)
    results: dict[str, dict[int, dict[str, Any]]] = {"rlpipe": {}, **{config: {} for config in configs}}
    with tempfile.TemporaryDirectory() as tmp, pinned([core]):
        npz = Path(tmp) / "replay.npz"
        env_id = export_npz(args.dataset, args.store, npz)
        for seed in seeds_of(args.seeds):
            results["rlpipe"][seed] = run_rlpipe(args.dataset, args.store, seed, updates, episodes, Path(tmp) / f"rlpipe-{seed}")
            print(f"seed {seed}: rlpipe {results['rlpipe'][seed]}", flush=True)
            for config in configs:
                policy = Path(tmp) / f"d3rlpy-{seed}.pt"
                results[config][seed] = run_d3rlpy(npz, env_id, seed, updates, episodes, PEER_CONFIGS[config], policy)
                print(f"seed {seed}: d3rlpy ({config}) {results[config][seed]}", flush=True)
    print(f"\n{today()}  discrete CQL on {args.dataset}, {updates} updates, held-out return over {episodes} episodes\n")
    rows = []
    for side, runs in results.items():
        returns = [run["return"] for run in runs.values()]
        seconds = [run["seconds"] for run in runs.values()]
        per_seed = ", ".join(f"{run['return']:.2f} ± {run['error']:.2f}" for run in runs.values())
        speed = np.mean(seconds) / np.mean([run["seconds"] for run in results["rlpipe"].values()])
        label = side if side == "rlpipe" else f"d3rlpy, {side}"
        rows.append([label, mean_error(returns), per_seed, f"{np.mean(seconds):.0f}", f"{speed:.2f}x"])
    print(
        table(
            [
                "contender",
                "held-out return, mean ± s.e. over seeds",
                "per seed (± s.e. over episodes)",
                "wall s per run",
                "wall time / rlpipe's",
            ],
            rows,
        )
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
