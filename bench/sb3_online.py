"""Online RL speed: wall time to reach a return threshold, rlpipe vs Stable-Baselines3.

In one process, one torch thread for both, pinned to the least busy core:

  PPO  CartPole-v1  threshold 475  SB3 with the rl-zoo hyperparameters (8 envs, n_steps 32,
                                   batch 256, 20 epochs, gamma 0.98, lambda 0.8, lr lin 1e-3,
                                   clip lin 0.2, 100k steps) vs `rlpipe train ppo` defaults
  SAC  Pendulum-v1  threshold -200 SB3 with the rl-zoo hyperparameters (lr 1e-3, otherwise
                                   SB3 defaults: 256x256, batch 256, 1 update per step)
                                   vs `rlpipe train sac` defaults

Both are evaluated on the same schedule with the same function
(`rlpipe.training.evaluate`: 10 deterministic episodes, same eval seeds) and stop at the
first evaluation whose mean return reaches the threshold. The time includes model
construction, training and the evaluations; the ratio is rlpipe / SB3.

    .venv/bin/python bench/sb3_online.py                 # seed 0, both algorithms
    .venv/bin/python bench/sb3_online.py --seeds 0 1 --only ppo

Needs the `bench` extra:  pip install -c constraints.txt -e '.[dev,bench]'
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import _common
import numpy as np

from rlpipe.training import evaluate
from rlpipe.training.run import EVAL_SEED_OFFSET

EVAL_EPISODES = 10


@dataclass
class Task:
    algo: str
    env_id: str
    threshold: float
    budget: int
    eval_every: int


TASKS = {
    "ppo": Task("ppo", "CartPole-v1", 475.0, 100_000, 5_000),
    "sac": Task("sac", "Pendulum-v1", -200.0, 10_000, 1_000),
}


@dataclass
class Outcome:
    seconds: float
    env_steps: int | None  # None: never reached the threshold within the budget
    final_return: float


def run_sb3(task: Task, seed: int) -> Outcome:
    from stable_baselines3 import PPO, SAC
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    class StopAtThreshold(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.next_eval, self.reached, self.last = task.eval_every, None, float("nan")

        def _on_step(self) -> bool:
            if self.num_timesteps < self.next_eval:
                return True
            while self.next_eval <= self.num_timesteps:
                self.next_eval += task.eval_every
            policy = lambda obs: self.model.predict(obs, deterministic=True)[0]  # noqa: E731
            self.last = evaluate(policy, task.env_id, EVAL_EPISODES, seed + EVAL_SEED_OFFSET).mean
            if self.last >= task.threshold:
                self.reached = self.num_timesteps
                return False
            return True

    start = time.perf_counter()
    if task.algo == "ppo":
        linear = lambda v: lambda progress: progress * v  # noqa: E731  (zoo's lin_<v>)
        env = make_vec_env(task.env_id, n_envs=8, seed=seed)
        model = PPO(
            "MlpPolicy",
            env,
            n_steps=32,
            batch_size=256,
            gae_lambda=0.8,
            gamma=0.98,
            n_epochs=20,
            ent_coef=0.0,
            learning_rate=linear(1e-3),
            clip_range=linear(0.2),
            seed=seed,
            device="cpu",
        )
    else:
        env = make_vec_env(task.env_id, n_envs=1, seed=seed)
        model = SAC("MlpPolicy", env, learning_rate=1e-3, seed=seed, device="cpu")
    callback = StopAtThreshold()
    model.learn(task.budget, callback=callback)
    return Outcome(time.perf_counter() - start, callback.reached, callback.last)


def run_rlpipe(task: Task, seed: int) -> Outcome:
    from rlpipe.algos import get_algo

    module = get_algo(task.algo)
    config = module.make_config(
        task.env_id,
        env_steps=task.budget,
        seed=seed,
        device="cpu",
        eval_every=task.eval_every,
        eval_episodes=EVAL_EPISODES,
        stop_at_return=task.threshold,
        heldout_eval_episodes=0,
    )  # timed: no final held-out evaluation
    start = time.perf_counter()
    result = module.train(config, progress=False)
    seconds = time.perf_counter() - start
    point = result.first_reaching(task.threshold)
    return Outcome(seconds, point.done if point else None, result.history[-1].mean)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--only", choices=sorted(TASKS), nargs="+", default=sorted(TASKS, reverse=True))
    parser.add_argument("--json", help="also write the raw results to this file")
    args = parser.parse_args()
    _common.limit_threads()
    core = _common.least_busy_core()
    print(_common.pinned_setup(core, "torch", "gymnasium", "stable-baselines3", "rlpipe"))
    runners: dict[str, Callable[[Task, int], Outcome]] = {"SB3": run_sb3, "rlpipe": run_rlpipe}
    rows, raw = [], []
    with _common.pinned([core]):
        for name in args.only:
            task = TASKS[name]
            for seed in args.seeds:
                out = {lib: runner(task, seed) for lib, runner in runners.items()}
                for lib, o in out.items():
                    raw.append({"algo": name, "env": task.env_id, "seed": seed, "library": lib, **o.__dict__})
                    print(
                        f"  {name} seed {seed} {lib}: {o.seconds:.1f} s, reached at {o.env_steps} steps, last eval {o.final_return:.1f}",
                        flush=True,
                    )
                ok = all(o.env_steps is not None for o in out.values())
                ratio = out["rlpipe"].seconds / out["SB3"].seconds if ok else float("nan")
                rows.append(
                    [
                        f"{name.upper()} {task.env_id} to {task.threshold:g}",
                        seed,
                        f"{out['SB3'].seconds:.1f} s ({out['SB3'].env_steps} steps)",
                        f"{out['rlpipe'].seconds:.1f} s ({out['rlpipe'].env_steps} steps)",
                        f"{ratio:.2f}",
                    ]
                )
    print()
    print(_common.table(["task", "seed", "SB3", "rlpipe", "rlpipe / SB3"], rows))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(raw, fh, indent=2)


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
