"""Choosing a checkpoint without an environment, measured where the truth is known.

The pipeline's `pendulum-mixed` (every transition of a 20k-step SAC run, seed 0) is exported
and imported again with no environment, as a user's logs would be. CQL, IQL and TD3+BC train on
it with Pendulum's tuned settings (what `rlpipe train ALGO --dataset` gives a dataset that names
Pendulum-v1), scored on held-out episodes at every evaluation point; each kept copy of the
actor is then played in the real Pendulum-v1 (held-out seeds, ``--episodes`` each). For each
selection rule (``last``, ``val_loss``: the lowest held-out action error, ``fqe``: the highest
FQE estimate) it reports the regret of the copy the rule keeps: the best copy's true return
minus the kept copy's, mean ± standard error over seeds.

    .venv/bin/python bench/selection.py --seeds 0-4 --workers 2
    .venv/bin/python bench/selection.py --quick      # tiny budgets: checks it runs
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import _common  # noqa: F401  (sets thread limits before numpy/torch are imported)
from _common import machine_description, table, today

ALGOS = ("cql", "iql", "td3bc")
RULES = ("last", "val_loss", "fqe")
ENV = "Pendulum-v1"
HELDOUT_SEED = 20_000  # the runs' held-out evaluation seeds (rlpipe.training.run.HELDOUT_SEED_OFFSET)


def build_dataset(store: Path, expert_steps: int) -> str:
    """pendulum-mixed as the pipeline collects it, then imported with no environment."""
    import numpy as np

    from rlpipe.commands.collect import collect_dataset
    from rlpipe.datasets.d4rl import d4rl_arrays
    from rlpipe.datasets.imports import import_file
    from rlpipe.datasets.loader import load_dataset

    collect_dataset(
        ENV,
        expert="sac",
        from_training=True,
        expert_run=store.parent / "sac",
        expert_steps=expert_steps,
        seed=0,
        name="mixed",
        store=store,
        progress=False,
    )
    npz = store.parent / "mixed.npz"
    np.savez(npz, **d4rl_arrays(load_dataset("mixed", store)))
    import_file(npz, "mixed-noenv", source_format="npz", action_space="box:-2,2", store=store)
    return "mixed-noenv"


def one_run(algo: str, seed: int, store: Path, out: Path, episodes: int, quick: bool) -> dict:
    """Train ``algo`` on the data with no environment, then play every kept copy in the env."""
    import torch

    from rlpipe.algos import get_algo
    from rlpipe.commands.runs import prepare_run, train_run
    from rlpipe.datasets.store import open_dataset
    from rlpipe.training.env import ActionScaler
    from rlpipe.training.evaluation import evaluate, policy_fn

    spec = get_algo(algo)
    settings = {**spec.tuned[ENV], "seed": seed, "device": "cpu"}
    settings.setdefault("eval_every", 1000)
    if quick:
        settings |= {"updates": 200, "eval_every": 100, "fqe_updates": 200}
    run = prepare_run(algo, dataset="mixed-noenv", store=store, settings=settings, run_dir=out / f"{algo}-{seed}")
    result = train_run(run, progress=False)
    scaler = ActionScaler(open_dataset("mixed-noenv", store).action_space)
    copies = []
    for snapshot in result.extras["snapshots"]:
        result.policy.load_state_dict(snapshot.state)
        played = evaluate(policy_fn(result.policy, scaler, torch.device("cpu")), ENV, episodes, seed + HELDOUT_SEED)
        copies.append({**snapshot.record(), "true_return": played.mean})
    best = max(copy["true_return"] for copy in copies)
    picked = {"last": copies[-1], "val_loss": min(copies, key=lambda c: c["val_action_error"])}
    if "fqe_estimate" in copies[0]:
        picked["fqe"] = max(copies, key=lambda c: c["fqe_estimate"])
    return {
        "algo": algo,
        "seed": seed,
        "checkpoints": copies,
        "best_return": best,
        "regret": {rule: best - copy["true_return"] for rule, copy in picked.items()},
        "kept_updates": {rule: copy["updates"] for rule, copy in picked.items()},
    }


def seeds_of(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0-4")
    parser.add_argument("--episodes", type=int, default=20, help="true-return episodes per kept copy")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "selection.json")
    args = parser.parse_args()
    seeds = seeds_of(args.seeds)
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "datasets"
        build_dataset(store, 1000 if args.quick else 20_000)
        jobs = [(algo, seed, store, Path(tmp) / "runs", 2 if args.quick else args.episodes, args.quick) for algo in ALGOS for seed in seeds]
        with ProcessPoolExecutor(args.workers) as pool:
            runs = list(pool.map(one_run, *zip(*jobs, strict=True)))
    rows = []
    for algo in ALGOS:
        mine = [run for run in runs if run["algo"] == algo]
        for rule in RULES:
            regrets = [run["regret"][rule] for run in mine if rule in run["regret"]]
            mean = statistics.fmean(regrets)
            se = statistics.stdev(regrets) / math.sqrt(len(regrets)) if len(regrets) > 1 else float("nan")
            rows.append([algo, rule, f"{mean:.1f} ± {se:.1f}", " ".join(f"{r:.0f}" for r in regrets)])
    print(table(["algorithm", "selected by", "regret (mean ± s.e.)", "per seed"], rows))
    if not args.quick:
        record = {"date": today(), "machine": machine_description(), "seeds": seeds, "episodes": args.episodes, "runs": runs}
        args.out.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
