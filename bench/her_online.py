"""Online HER speed: `rlpipe train ddpg-her` vs Stable-Baselines3 DDPG + HerReplayBuffer on GoalWorld-v0.

Side by side in one process, one torch thread for both, pinned to the least busy core.
Both run the same settings: 128x128 actor and critic, batch 256, one gradient update per
env step (train_freq 1, gradient_steps 1) after 1000 uniform-random warm-up steps, Adam
lr 1e-3, gamma 0.98, tau 0.005, Gaussian noise sigma 0.1, HER future with k = 4, one env.

Measured per contender (alternating, `--repeats` times, median):
  - loop: env steps per second of the whole training run (collection, HER storage and
    sampling, updates), in wall time and in the process's CPU time (which other processes
    on the shared cores disturb less); then the trained policy's success rate over 100
    episodes (the same `rlpipe.training.evaluate` for both, outside the timing) as a check
    that both learn;
  - sample: microseconds per HER minibatch (`sample(256)`) from each library's buffer
    filled with the same random-policy episodes.

    .venv/bin/python bench/her_online.py                # 6000 env steps, 2 repeats
    .venv/bin/python bench/her_online.py --quick

Needs the `bench` extra:  pip install -c constraints.txt -e '.[dev,bench]'
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import _common
import gymnasium as gym
import numpy as np

from rlpipe.training import ActionScaler, evaluate, policy_fn
from rlpipe.training.run import EVAL_SEED_OFFSET

ENV_ID = "GoalWorld-v0"
HIDDEN = (128, 128)
BATCH = 256
WARMUP = 1_000
LR, GAMMA, TAU, SIGMA, K = 1e-3, 0.98, 0.005, 0.1, 4
EVAL_EPISODES = 100


class Clock:
    """Wall and process CPU seconds since construction."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def rates(self, steps: int) -> tuple[float, float]:
        """``steps`` per wall second and per CPU second."""
        return steps / (time.perf_counter() - self.wall), steps / (time.process_time() - self.cpu)


Outcome = tuple[float, float, float]
"""(env steps per wall second, env steps per CPU second, success rate after training)."""


def run_rlpipe(steps: int, seed: int) -> Outcome:
    """`rlpipe train ddpg-her` with the shared settings."""
    from rlpipe.algos import get_algo

    module = get_algo("ddpg-her")
    config = module.make_config(
        ENV_ID,
        env_steps=steps,
        seed=seed,
        hidden=HIDDEN,
        batch_size=BATCH,
        learning_starts=WARMUP,
        actor_lr=LR,
        critic_lr=LR,
        gamma=GAMMA,
        tau=TAU,
        noise_sigma=SIGMA,
        k=K,
        strategy="future",
        updates_per_step=1.0,
        eval_every=10 * steps,
        eval_episodes=1,
        heldout_eval_episodes=0,
        device="cpu",
    )
    clock = Clock()
    result = module.train(config, progress=False)
    rates = clock.rates(result.metrics["env_steps"])
    policy = policy_fn(result.policy, ActionScaler(gym.make(ENV_ID).action_space))
    return *rates, evaluate(policy, ENV_ID, EVAL_EPISODES, seed + EVAL_SEED_OFFSET).success_rate


def run_sb3(steps: int, seed: int) -> Outcome:
    """SB3 DDPG with HerReplayBuffer and the shared settings."""
    from stable_baselines3 import DDPG, HerReplayBuffer
    from stable_baselines3.common.noise import NormalActionNoise

    env = gym.make(ENV_ID)
    clock = Clock()
    model = DDPG(
        "MultiInputPolicy",
        env,
        learning_rate=LR,
        buffer_size=steps,
        learning_starts=WARMUP,
        batch_size=BATCH,
        tau=TAU,
        gamma=GAMMA,
        train_freq=1,
        gradient_steps=1,
        action_noise=NormalActionNoise(np.zeros(2), SIGMA * np.ones(2)),
        replay_buffer_class=HerReplayBuffer,
        replay_buffer_kwargs=dict(n_sampled_goal=K, goal_selection_strategy="future"),
        policy_kwargs=dict(net_arch=list(HIDDEN)),
        seed=seed,
        device="cpu",
    )
    model.learn(steps)
    rates = clock.rates(steps)
    policy = lambda obs: model.predict(obs, deterministic=True)[0]  # noqa: E731
    return *rates, evaluate(policy, ENV_ID, EVAL_EPISODES, seed + EVAL_SEED_OFFSET).success_rate


def random_episodes(steps: int, seed: int) -> list[tuple]:
    """(obs, action, reward, next_obs, terminated, truncated) of random-policy GoalWorld steps."""
    env = gym.make(ENV_ID)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    out = []
    for _ in range(steps):
        action = rng.uniform(-1, 1, 2).astype(np.float32)
        next_obs, reward, term, trunc, _ = env.step(action)
        out.append((obs, action, reward, next_obs, term, trunc))
        obs = env.reset()[0] if term or trunc else next_obs
    return out


def sample_rlpipe(data: list[tuple], draws: int) -> float:
    """Microseconds per `HerReplayBuffer.sample(BATCH)` of rlpipe's buffer."""
    from rlpipe.algos.her import HerReplayBuffer
    from rlpipe.datasets.her import goal_functions
    from rlpipe.training import StepBatch

    env = gym.make(ENV_ID)
    buffer = HerReplayBuffer(len(data), env.observation_space, 2, 1, *goal_functions(ENV_ID), k=K)
    batch = lambda obs: {key: value[None] for key, value in obs.items()}  # noqa: E731
    ret, length = 0.0, 0  # the running episode return and length a VecStepper reports
    for obs, action, reward, next_obs, term, trunc in data:
        a, ret, length = action[None], ret + reward, length + 1
        buffer.store(
            StepBatch(
                batch(obs),
                a,
                a,
                np.array([reward]),
                batch(next_obs),
                np.array([term]),
                np.array([trunc]),
                np.array([True]),
                np.array([ret]),
                np.array([length]),
            )
        )
        ret, length = (0.0, 0) if term or trunc else (ret, length)
    return _time_per_call(lambda: buffer.sample(BATCH), draws)


def sample_sb3(data: list[tuple], draws: int) -> float:
    """Microseconds per `HerReplayBuffer.sample(BATCH)` of SB3's buffer."""
    from stable_baselines3 import HerReplayBuffer
    from stable_baselines3.common.vec_env import DummyVecEnv

    venv = DummyVecEnv([lambda: gym.make(ENV_ID)])
    buffer = HerReplayBuffer(
        len(data), venv.observation_space, venv.action_space, venv, device="cpu", n_sampled_goal=K, goal_selection_strategy="future"
    )
    batch = lambda obs: {key: value[None] for key, value in obs.items()}  # noqa: E731
    for obs, action, reward, next_obs, term, trunc in data:
        buffer.add(
            batch(obs), batch(next_obs), action[None], np.array([reward]), np.array([term or trunc]), [{"TimeLimit.truncated": trunc}]
        )
    return _time_per_call(lambda: buffer.sample(BATCH), draws)


def _time_per_call(fn: Callable[[], object], draws: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(draws):
        fn()
    return (time.perf_counter() - start) / draws * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6_000, help="env steps per training run (incl. 1000 warm-up)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="1500 steps, 1 repeat")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.repeats = 1_500, 1
    _common.limit_threads()
    core = _common.least_busy_core()
    print(f"date: {_common.today()}")
    print(_common.pinned_setup(core, "torch", "gymnasium", "stable-baselines3", "rlpipe"))
    loops: dict[str, list[Outcome]] = {"SB3": [], "rlpipe": []}
    samples: dict[str, list[float]] = {"SB3": [], "rlpipe": []}
    data = random_episodes(20_000, args.seed)
    with _common.pinned([core]):
        for repeat in range(args.repeats):
            for name, runner in (("SB3", run_sb3), ("rlpipe", run_rlpipe)):
                loops[name].append(runner(args.steps, args.seed))
                wall, cpu, success = loops[name][-1]
                print(f"  run {repeat} {name}: {wall:.0f} env steps/s wall, {cpu:.0f} per CPU second, success {success:.2f}", flush=True)
            samples["SB3"].append(sample_sb3(data, 500))
            samples["rlpipe"].append(sample_rlpipe(data, 500))
    median = {name: [_common.median([run[i] for run in runs]) for i in range(2)] for name, runs in loops.items()}
    rows = [
        [
            f"{name} DDPG + HER",
            f"{median[name][0]:,.0f}",
            f"{median[name][1]:,.0f}",
            " / ".join(f"{run[2]:.2f}" for run in loops[name]),
            f"{_common.median(samples[name]):,.0f}",
        ]
        for name in loops
    ]
    print()
    print(f"{args.steps} env steps per run ({WARMUP} warm-up, then 1 update per step), median of {args.repeats}:")
    print(
        _common.table(["contender", "env steps/s (wall)", "env steps per CPU s", "success rate after training", "us per sample(256)"], rows)
    )
    print(
        f"\nrlpipe / SB3 env steps/s: {median['rlpipe'][0] / median['SB3'][0]:.2f}x wall, "
        f"{median['rlpipe'][1] / median['SB3'][1]:.2f}x CPU; HER sample(256): rlpipe "
        f"{_common.median(samples['SB3']) / _common.median(samples['rlpipe']):.1f}x faster"
    )


if __name__ == "__main__":
    main()
