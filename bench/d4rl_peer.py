"""The D4RL CPU profile's datasets, rlpipe vs d3rlpy: update speed side by side, and d3rlpy's scores on the same data.

The datasets are suites/d4rl-cpu's (`make d4rl PROFILE=cpu` builds them), exported with
`rlpipe datasets export --to minari` and read by d3rlpy from that export
(bench/peers/d3rlpy_d4rl.py, in d3rlpy's own virtualenv: see bench/offline.py). Both sides:
256x256 networks, batch 256, one torch thread, seed 0; d3rlpy at its reproduction settings
(TD3+BC and IQL with observation standardisation, IQL with its return-based reward scale
x1000 and cosine actor schedule; BC as rlpipe's: deterministic MSE, Adam 3e-4).

1. Speed: ``--speed-updates`` updates of each algorithm on ``hopper-medium``, rlpipe's update
   (as `rlpipe train` runs it) and d3rlpy's ``fit`` alternating, pinned to one core: updates/s
   and the ratio.
2. Scores (unless ``--speed-only``): d3rlpy trains each algorithm on each dataset for the
   profile's budget (its params.yaml), then plays 100 episodes with rlpipe's held-out protocol
   (env seeds 20000 + i); its D4RL-normalised score and wall time print beside rlpipe's
   seed-0 run and its mean ± s.e. over seeds, read from the profile's committed
   results/scores.json.

    .venv/bin/python bench/d4rl_peer.py                     # speed, then d3rlpy's 6 runs (~30 min)
    .venv/bin/python bench/d4rl_peer.py --speed-only
    .venv/bin/python bench/d4rl_peer.py --quick             # 200 updates a side, 5 episodes: checks it runs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import _common  # noqa: F401  (sets thread limits before numpy/torch are imported)
import yaml
from _common import least_busy_core, limit_threads, pinned, pinned_setup, table, today
from offline import PEER_PYTHON, ROOT, captured_update, ensure_peer_venv

PROFILE = ROOT / "suites" / "d4rl-cpu"
PEER_SCRIPT = ROOT / "bench" / "peers" / "d3rlpy_d4rl.py"
SPEED_DATASET = "hopper-medium"


def export(store: Path, names: list[str], root: Path) -> dict[str, Path]:
    """Each dataset exported to a Minari root at ``root``: name -> its Minari directory."""
    from rlpipe.datasets.minari_io import export_to_minari
    from rlpipe.datasets.store import open_dataset

    os.environ["MINARI_DATASETS_PATH"] = str(root)
    return {name: export_to_minari(open_dataset(name, store), f"rlpipe/{name}-v0") for name in names}


def run_peer(minari_dir: Path, algo: str, updates: int, episodes: int, time_only: bool = False) -> dict[str, Any]:
    cmd = [str(PEER_PYTHON), str(PEER_SCRIPT), str(minari_dir), "--algo", algo, "--updates", str(updates), "--episodes", str(episodes)]
    proc = subprocess.run([*cmd, *(["--time-only"] if time_only else [])], capture_output=True, text=True, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"d3rlpy peer failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return json.loads(lines[-1])


def time_rlpipe(algo: str, store: Path, updates: int, settings: dict[str, Any]) -> float:
    """Wall seconds of ``updates`` rlpipe updates (sampling included) after one untimed update."""
    overrides = {
        key: value for key, value in settings.items() if key not in ("updates", "eval_every", "eval_episodes", "heldout_eval_episodes")
    }
    sampler, update, batch_size = captured_update(algo, store, "cpu", overrides, "Hopper-v5", SPEED_DATASET)
    update(sampler.sample(batch_size), 0)
    start = time.perf_counter()
    for i in range(1, updates + 1):
        update(sampler.sample(batch_size), i)
    return time.perf_counter() - start


def ours(scores: dict[str, Any], algo: str, dataset: str) -> tuple[str, str, str]:
    """rlpipe's seed-0 score and wall seconds, and mean ± s.e. over seeds, from the profile's scoreboard."""
    from rlpipe.commands.scoreboard import mean_and_error, run_score

    runs = [run for run in scores["runs"] if run["algo"] == algo and run["dataset"] == dataset]
    if not runs:
        return "", "", ""
    seed0 = next((run for run in runs if run["seed"] == 0), runs[0])
    mean, error = mean_and_error([run_score(scores, run) for run in runs])
    return f"{run_score(scores, seed0):.1f}", f"{seed0['metrics']['wall_seconds']:.0f}", f"{mean:.1f} ± {error:.1f} ({len(runs)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", default="bc,td3bc,iql")
    parser.add_argument("--datasets", default="hopper-medium,hopper-medium-replay")
    parser.add_argument("--speed-updates", type=int, default=2000)
    parser.add_argument("--speed-only", action="store_true")
    parser.add_argument("--quick", action="store_true", help="200 updates a side and 5 episodes")
    parser.add_argument("--core", type=int, help="the core to pin both sides to (default: the least busy)")
    parser.add_argument("--json", help="also write the raw results to this file")
    args = parser.parse_args()
    limit_threads()
    ensure_peer_venv()
    algos, datasets = args.algos.split(","), args.datasets.split(",")
    store = PROFILE / "datasets"
    params = yaml.safe_load((PROFILE / "params.yaml").read_text())["train_offline"]
    core = least_busy_core() if args.core is None else args.core
    print(pinned_setup(core, "torch", "gymnasium"), flush=True)
    results: dict[str, Any] = {"speed": {}, "scores": {}}
    with tempfile.TemporaryDirectory() as tmp, pinned([core]):
        exported = export(store, sorted({*datasets, SPEED_DATASET}), Path(tmp))
        speed_updates = 200 if args.quick else args.speed_updates
        for algo in algos:
            rlpipe_s = time_rlpipe(algo, store, speed_updates, params[algo]["set"])
            peer_s = run_peer(exported[SPEED_DATASET], algo, speed_updates, 0, time_only=True)["seconds"]
            results["speed"][algo] = {"rlpipe": speed_updates / rlpipe_s, "d3rlpy": speed_updates / peer_s}
            print(f"{algo}: rlpipe {speed_updates / rlpipe_s:.0f} updates/s, d3rlpy {speed_updates / peer_s:.0f}", flush=True)
        if not args.speed_only:
            from rlpipe.datasets.scores import normalized_score
            from rlpipe.datasets.store import open_dataset

            for dataset in datasets:
                metadata = open_dataset(dataset, store).metadata
                for algo in algos:
                    updates = 200 if args.quick else int(params[algo]["set"]["updates"])
                    peer = run_peer(exported[dataset], algo, updates, 5 if args.quick else 100)
                    peer["score"] = 100 * float(normalized_score(metadata, peer["return_mean"]))
                    results["scores"][f"{algo}/{dataset}"] = peer
                    print(f"{algo} on {dataset}: d3rlpy {peer['score']:.1f} in {peer['seconds']:.0f} s", flush=True)
    print(f"\n{today()}  speed: {speed_updates} updates of each on {SPEED_DATASET}, one core\n")
    rows = [[algo, f"{s['rlpipe']:.0f}", f"{s['d3rlpy']:.0f}", f"{s['rlpipe'] / s['d3rlpy']:.2f}x"] for algo, s in results["speed"].items()]
    print(table(["algorithm", "rlpipe updates/s", "d3rlpy updates/s", "rlpipe / d3rlpy"], rows))
    if results["scores"]:
        scoreboard = PROFILE / "results" / "scores.json"
        scores = json.loads(scoreboard.read_text()) if scoreboard.is_file() else {"runs": [], "datasets": {}}
        rows = []
        for key, peer in results["scores"].items():
            algo, dataset = key.split("/")
            seed0, wall, over_seeds = ours(scores, algo, dataset)
            rows.append([dataset, algo, peer["updates"], f"{peer['score']:.1f}", f"{peer['seconds']:.0f}", seed0, wall, over_seeds])
        print()
        print(
            table(
                [
                    "dataset",
                    "algorithm",
                    "updates",
                    "d3rlpy score (seed 0)",
                    "d3rlpy fit s",
                    "rlpipe score (seed 0)",
                    "rlpipe run s",
                    "rlpipe mean ± s.e. (seeds)",
                ],
                rows,
            )
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
