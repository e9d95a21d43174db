"""Multi-agent speed: Combat env steps/s (PettingZoo single game vs the batched numpy
games) and IPPO's training throughput in agent steps/s.

There is no runnable peer: ma-gym (Combat's home) needs gym <= 0.20, which does not
install on Python 3.11. Measured in wall time and process CPU time (other processes on
the shared cores disturb the latter less), one torch thread, uniformly random actions
for the env figures.

    .venv/bin/python bench/multi_agent.py            # 3 repeats
    .venv/bin/python bench/multi_agent.py --quick
"""

from __future__ import annotations

import argparse
import time

import _common
import numpy as np

from rlpipe.envs.combat import CombatEnv, CombatVectorEnv


def rates(fn, units: int) -> tuple[float, float]:
    """``units`` / wall second and / CPU second of one call of ``fn``."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return units / (time.perf_counter() - wall), units / (time.process_time() - cpu)


def single_game(steps: int) -> None:
    env = CombatEnv()
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        if not env.agents:
            env.reset()
        a = rng.integers(0, 7, size=2)
        env.step({"agent_0": a[0], "agent_1": a[1]})


def batched_games(n: int, steps: int) -> None:
    env = CombatVectorEnv(n)
    env.reset(seed=0)
    actions = np.random.default_rng(0).integers(0, 7, size=(steps, n, 2))
    for t in range(steps):
        env.step(actions[t])


def ippo(game_steps: int) -> int:
    from rlpipe.algos import get_algo

    algo = get_algo("ippo")

    config = algo.make_config("Combat-v0", env_steps=game_steps, eval_every=10**9, eval_episodes=10, heldout_eval_episodes=0)
    return algo.train(config, None, progress=False).metrics["agent_steps"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    _common.limit_threads()
    repeats = 1 if args.quick else args.repeats
    scale = 0.2 if args.quick else 1.0
    rows = []
    single = int(5000 * scale)
    r = [rates(lambda: single_game(single), single) for _ in range(repeats)]
    rows.append(["CombatEnv (PettingZoo, 1 game)", "game steps/s", *(f"{_common.median(x):,.0f}" for x in zip(*r))])
    for n in (16, 64, 256):
        steps = int(max(200, 40_000 // n) * scale)
        r = [rates(lambda: batched_games(n, steps), n * steps) for _ in range(repeats)]
        rows.append([f"CombatVectorEnv ({n} games)", "game steps/s", *(f"{_common.median(x):,.0f}" for x in zip(*r))])
    game_steps = int(200_000 * scale)
    r = []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        agent_steps = ippo(game_steps)
        r.append((agent_steps / (time.perf_counter() - wall), agent_steps / (time.process_time() - cpu)))
    rows.append([f"IPPO training (64 games, {game_steps:,} game steps)", "agent steps/s", *(f"{_common.median(x):,.0f}" for x in zip(*r))])
    print(_common.machine_description())
    print(_common.versions("numpy", "torch", "pettingzoo"), f"- median of {repeats}")
    print(_common.table(["what", "unit", "per wall s", "per CPU s"], rows))


if __name__ == "__main__":
    main()
