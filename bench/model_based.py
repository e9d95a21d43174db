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
"""

from __future__ import annotations

import _common  # noqa: F401  (thread limits before numpy/torch)

import argparse
import time

import numpy as np
import torch
from _common import limit_threads, machine_description, median, table, today
from gymnasium import spaces

from rlpipe.models.dynamics import GaussianEnsemble
from rlpipe.models.env_fns import never_terminates, pendulum_reward
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    limit_threads()
    peak = matmul_peak(args.repeats)
    rows = []
    for name, members, elites, hidden, s in SETTINGS:
        plan_s, flops, model_s = measure(members, elites, hidden, s, args.repeats)
        rows.append([
            name, f"{members} ({elites} elites) x {len(hidden)}x{hidden[0]}",
            f"{s.population} x {s.particles} x H{s.horizon} x {s.iterations} it",
            f"{plan_s * 1e3:.1f}", f"{flops / model_s / 1e9:.1f}", f"{flops / model_s / peak:.2f}", f"{flops / plan_s / peak:.2f}",
        ])
    print(f"{today()}, {machine_description()}, torch {torch.__version__}, 1 thread; matmul peak {peak / 1e9:.1f} GFLOP/s (2048^2 fp32)")
    print(table(["setting", "ensemble", "population x particles x horizon x iterations", "ms / planning step",
                 "model GFLOP/s", "model / peak", "plan / peak"], rows))


if __name__ == "__main__":
    main()
