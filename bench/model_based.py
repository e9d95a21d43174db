"""PETS planning speed on one CPU thread: milliseconds per planning step (one CEM-MPC action
for one Pendulum state) and the share of the core's matmul peak the model evaluation reaches.

Settings: the reference text's (5 members of 4x200 Swish, CEM 50 samples, 5 iterations,
horizon 25, one member per candidate), rlpipe's PETS default on Pendulum (horizon 15), and
mbrl-lib's (population 350 / 500, horizon 15, 20 particles, 5 members / 7 with 5 elites).
The peak is a 2048x2048 float32 matmul timed in the same run. "model" is the ensemble
forward alone at the planner's shapes (``model(obs, actions, layers)`` as the planner calls
it); "plan" counts the same model FLOPs over the whole planning step (sampling, rewards, CEM
updates included). Times are the process's CPU time (one thread), so a machine shared with
other jobs slows the figures less than wall time would (cache sharing still does).

    .venv/bin/python bench/model_based.py [--repeats 3]

``--learning`` instead measures where MBPO's model helps: MBPO at its defaults for ``--env``,
the same run without model data (``real_ratio=1.0``: SAC at MBPO's updates per env step)
and SAC at 1 update per env step (MBPO's nets and settings otherwise), on training seeds
that no setting was tuned on. Per run: the env steps at which the 10-episode evaluation
(every ``--eval-every`` env steps, default 250) first reached the target (Pendulum -200,
InvertedPendulum 1000, the maximum; Hopper 1000), its return at each budget, the 100-episode
held-out return at the last budget and the CPU seconds; then mean ± standard error over
seeds. Each run's figures are also printed as a JSON line as soon as it ends.

    .venv/bin/python bench/model_based.py --learning [--env Pendulum-v1] [--seeds 5-9] [--budgets 1000,2500] [--variants ...] [--eval-every 250]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import _common  # noqa: F401  (thread limits before numpy/torch)
import numpy as np
import torch
from _common import limit_threads, machine_description, median, table, today
from gymnasium import spaces

from rlpipe.algos import get_algo
from rlpipe.nets.dynamics import GaussianEnsemble
from rlpipe.nets.env_fns import never_terminates, pendulum_reward
from rlpipe.training.planning import CEMPlanner, CEMSettings, ModelEnv

# name, members, elites, hidden, CEM settings
SETTINGS = [
    ("text (Hands-on RL)", 5, 5, (200,) * 4, CEMSettings(horizon=25, population=50, iterations=5, particles=1)),
    ("rlpipe PETS default", 5, 5, (200,) * 4, CEMSettings(horizon=15, population=50, iterations=5, particles=1)),
    ("mbrl-lib-like, pop 350", 5, 5, (200,) * 4, CEMSettings(horizon=15, population=350, iterations=5, particles=20)),
    ("mbrl-lib-like, pop 500, 7 members", 7, 5, (200,) * 4, CEMSettings(horizon=15, population=500, iterations=5, particles=20)),
]


def timed(fn, repeats: int) -> float:
    """Median CPU seconds of ``fn()`` over ``repeats`` runs after one warm-up run."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return median(times)


def matmul_peak(repeats: int) -> float:
    """FLOP/s of a large float32 matmul on this thread."""
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    return 2 * 2048**3 / timed(lambda: a @ b, repeats)


def flops_per_row(model: GaussianEnsemble) -> int:
    return sum(2 * layer.weight.shape[1] * layer.weight.shape[2] for layer in model.layers)


def measure(members: int, elites: int, hidden: tuple[int, ...], settings: CEMSettings, repeats: int) -> tuple[float, float, float]:
    """Seconds per planning step, model FLOPs per step, seconds of the model evaluations alone."""
    torch.manual_seed(0)
    model = GaussianEnsemble(3, 1, members, hidden, elites)
    model.set_normalizer(torch.randn(1000, 4), torch.randn(1000, 4) * 0.1)
    box = spaces.Box(-2.0, 2.0, (1,), np.float32)
    env = ModelEnv(model, box, never_terminates, pendulum_reward, torch.Generator().manual_seed(0))
    planner = CEMPlanner(env, settings, 1, torch.Generator().manual_seed(1))
    obs = torch.tensor([[1.0, 0.0, 0.0]])
    plan_s = timed(lambda: planner.act(obs), repeats)
    rows = settings.population * settings.particles
    evaluations = settings.iterations * settings.horizon
    flops = evaluations * rows * flops_per_row(model)
    layers = model.member_layers(None if elites == members else model.elites)
    row_obs, row_actions = torch.randn(elites, rows // elites, 3), torch.randn(elites, rows // elites, 1)

    def model_only() -> None:
        with torch.no_grad():
            for _ in range(evaluations):
                model(row_obs, row_actions, layers)

    return plan_s, flops, timed(model_only, repeats)


# name -> MBPO settings over its defaults for the env
LEARNERS = {
    "mbpo": {},
    "no-model": {"real_ratio": 1.0},
    "sac-utd1": {"real_ratio": 1.0, "updates_per_step": 1.0},
}
TARGETS = {"Pendulum-v1": -200.0, "InvertedPendulum-v5": 1000.0, "Hopper-v5": 1000.0}


def learning_run(env_id: str, variant: str, seed: int, budgets: list[int], eval_every: int) -> dict[str, object]:
    """One MBPO-family run on ``env_id`` to the last budget: its curve's figures."""
    mbpo = get_algo("mbpo")
    config = mbpo.make_config(
        env_id, seed=seed, env_steps=budgets[-1], eval_every=eval_every, eval_episodes=10, heldout_eval_episodes=100, **LEARNERS[variant]
    )
    start = time.process_time()
    result = mbpo.train(config, progress=False)
    at = {p.done: p.mean for p in result.history}
    reached = next((p.done for p in result.history if p.mean >= TARGETS[env_id]), None)
    return {
        "variant": variant,
        "seed": seed,
        "steps_to_target": reached,
        "eval_at": {b: at.get(b) for b in budgets},
        "heldout": result.metrics["heldout_return_mean"],
        "cpu_s": round(time.process_time() - start, 1),
    }


def mean_se(values: list[float]) -> str:
    if not values:
        return "-"
    se = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else float("nan")
    return f"{statistics.mean(values):.1f} ± {se:.1f}"


def learning_table(runs: list[dict], budgets: list[int], target: float) -> str:
    rows = []
    for variant, settings in LEARNERS.items():
        mine = [r for r in runs if r["variant"] == variant]
        if not mine:
            continue
        steps = [r["steps_to_target"] for r in mine]
        reached = [s for s in steps if s is not None]
        rows.append(
            [
                variant,
                f"{settings or 'defaults'}",
                ", ".join(str(r["seed"]) for r in mine),
                f"{mean_se(reached)} ({len(reached)}/{len(mine)} reached)",
                *(mean_se([r["eval_at"][b] for r in mine]) for b in budgets),
                mean_se([r["heldout"] for r in mine]),
                mean_se([r["cpu_s"] for r in mine]),
            ]
        )
    return table(
        [
            "variant",
            "settings",
            "seeds",
            f"env steps to {target:.0f} (10-episode evals)",
            *(f"return at {b} (10 ep.)" for b in budgets),
            f"held-out at {budgets[-1]} (100 ep.)",
            "CPU-s",
        ],
        rows,
    )


def seeds_arg(text: str) -> list[int]:
    low, _, high = text.partition("-")
    return list(range(int(low), int(high or low) + 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--learning", action="store_true", help="the MBPO / no-model / SAC learning table instead")
    parser.add_argument("--env", default="Pendulum-v1", choices=sorted(TARGETS))
    parser.add_argument("--seeds", type=seeds_arg, default=seeds_arg("5-9"))
    parser.add_argument("--budgets", default="1000,2500", help="env steps, comma-separated; runs train to the last")
    parser.add_argument("--variants", default=",".join(LEARNERS))
    parser.add_argument("--eval-every", type=int, default=250, help="env steps between the 10-episode evaluations")
    args = parser.parse_args()
    limit_threads()
    if args.learning:
        budgets = sorted(int(b) for b in args.budgets.split(","))
        runs = []
        for variant in args.variants.split(","):
            for seed in args.seeds:
                runs.append(learning_run(args.env, variant, seed, budgets, args.eval_every))
                print(json.dumps(runs[-1]), flush=True)
        print(f"{today()}, {machine_description()}, torch {torch.__version__}, 1 thread; {args.env}, mean ± s.e. over seeds")
        print(learning_table(runs, budgets, TARGETS[args.env]))
        return
    peak = matmul_peak(args.repeats)
    rows = []
    for name, members, elites, hidden, s in SETTINGS:
        plan_s, flops, model_s = measure(members, elites, hidden, s, args.repeats)
        rows.append(
            [
                name,
                f"{members} ({elites} elites) x {len(hidden)}x{hidden[0]}",
                f"{s.population} x {s.particles} x H{s.horizon} x {s.iterations} it",
                f"{plan_s * 1e3:.1f}",
                f"{flops / model_s / 1e9:.1f}",
                f"{flops / model_s / peak:.2f}",
                f"{flops / plan_s / peak:.2f}",
            ]
        )
    print(f"{today()}, {machine_description()}, torch {torch.__version__}, 1 thread; matmul peak {peak / 1e9:.1f} GFLOP/s (2048^2 fp32)")
    print(
        table(
            [
                "setting",
                "ensemble",
                "population x particles x horizon x iterations",
                "ms / planning step",
                "model GFLOP/s",
                "model / peak",
                "plan / peak",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
