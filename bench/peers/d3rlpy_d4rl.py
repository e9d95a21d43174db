"""Peer side of bench/d4rl_peer.py, run inside the d3rlpy virtualenv (d3rlpy pins gymnasium 1.0.0).

Reads a Minari dataset's ``data/main_data.hdf5`` (what `rlpipe datasets export --to minari`
writes) episode by episode, as d3rlpy's own Minari loader does, into an MDPDataset; trains
d3rlpy's BC, TD3+BC or IQL at its reproduction settings for ``--updates`` gradient updates
(``--time-only``: just times them); then evaluates the deterministic policy on the
dataset's env with rlpipe's held-out protocol: ``--episodes`` episodes on at most 32 envs,
env ``i`` reset with seed ``--seed + i`` first and then unseeded, each running a fixed
quota of episodes. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import gymnasium as gym
import h5py
import numpy as np
import torch


def read_minari(path: Path) -> tuple[dict[str, np.ndarray], str]:
    """Flat transition arrays (D4RL's names) and the env id of a Minari dataset directory."""
    columns: dict[str, list[np.ndarray]] = {"observations": [], "actions": [], "rewards": [], "terminals": [], "timeouts": []}
    with h5py.File(path / "data" / "main_data.hdf5", "r") as f:
        for name in sorted(f, key=lambda key: int(key.split("_")[1])):
            episode = f[name]
            terminations = episode["terminations"][()].astype(bool)
            truncations = episode["truncations"][()].astype(bool)
            columns["observations"].append(episode["observations"][()][:-1])  # the final observation is appended
            columns["actions"].append(episode["actions"][()])
            columns["rewards"].append(episode["rewards"][()])
            columns["terminals"].append(terminations)
            # d3rlpy needs every episode to end: an episode cut short by the dataset's end is a timeout
            timeouts = truncations & ~terminations
            timeouts[-1] |= not terminations[-1]
            columns["timeouts"].append(timeouts)
    metadata = json.loads((path / "data" / "metadata.json").read_text())
    env_spec = json.loads(metadata["env_spec"]) if isinstance(metadata.get("env_spec"), str) else metadata.get("env_spec", {})
    return {key: np.concatenate(values) for key, values in columns.items()}, env_spec["id"]


def make_algo(algo: str, updates: int):
    import d3rlpy

    scaler = d3rlpy.preprocessing.StandardObservationScaler()
    if algo == "bc":  # rlpipe's BC settings: deterministic MSE policy, 256x256, Adam 3e-4, batch 256
        return d3rlpy.algos.BCConfig(batch_size=256, learning_rate=3e-4, policy_type="deterministic")
    if algo == "td3bc":  # d3rlpy's reproduction settings (reproductions/offline/td3_plus_bc.py)
        return d3rlpy.algos.TD3PlusBCConfig(
            actor_learning_rate=3e-4,
            critic_learning_rate=3e-4,
            batch_size=256,
            target_smoothing_sigma=0.2,
            target_smoothing_clip=0.5,
            alpha=2.5,
            update_actor_interval=2,
            observation_scaler=scaler,
        )
    if algo == "iql":  # d3rlpy's reproduction settings (reproductions/offline/iql.py), its cosine schedule over this budget
        schedule = d3rlpy.optimizers.CosineAnnealingLRFactory(T_max=updates)
        return d3rlpy.algos.IQLConfig(
            actor_learning_rate=3e-4,
            critic_learning_rate=3e-4,
            batch_size=256,
            weight_temp=3.0,
            max_weight=100.0,
            expectile=0.7,
            reward_scaler=d3rlpy.preprocessing.ReturnBasedRewardScaler(multiplier=1000.0),
            observation_scaler=scaler,
            actor_optim_factory=d3rlpy.optimizers.AdamFactory(lr_scheduler_factory=schedule),
        )
    raise SystemExit(f"unknown algo {algo!r}")


def evaluate(policy, env_id: str, episodes: int, seed: int, max_envs: int = 32) -> list[float]:
    """rlpipe's evaluation protocol (rlpipe.training.evaluation.evaluate), one env per slot."""
    n = max(1, min(episodes, max_envs))
    quota = [episodes // n + (i < episodes % n) for i in range(n)]
    envs = [gym.make(env_id) for _ in range(n)]
    obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)]).astype(np.float32)
    returns: list[list[float]] = [[] for _ in range(n)]
    running = np.zeros(n)
    active = np.array([q > 0 for q in quota])
    while active.any():
        slots = np.flatnonzero(active)
        actions = policy.predict(obs[slots])
        for action, i in zip(actions, slots):
            next_obs, reward, terminated, truncated, _ = envs[i].step(action)
            running[i] += reward
            if terminated or truncated:
                returns[i].append(float(running[i]))
                running[i] = 0.0
                active[i] = len(returns[i]) < quota[i]
                next_obs, _ = envs[i].reset()
            obs[i] = next_obs
    return [r for slot in returns for r in slot]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dataset", type=Path, help="a Minari dataset directory (holding data/main_data.hdf5)")
    parser.add_argument("--algo", choices=["bc", "td3bc", "iql"], required=True)
    parser.add_argument("--updates", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0, help="training seed")
    parser.add_argument(
        "--eval-seed", type=int, default=20_000, help="first env seed of the evaluation (rlpipe's held-out seeds: seed + 20000)"
    )
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--time-only", action="store_true", help="only time the updates (no evaluation)")
    args = parser.parse_args()
    torch.set_num_threads(1)

    import d3rlpy

    d3rlpy.seed(args.seed)
    arrays, env_id = read_minari(args.dataset)
    dataset = d3rlpy.dataset.MDPDataset(**arrays)
    algo = make_algo(args.algo, args.updates).create(device="cpu:0")
    start, cpu_start = time.perf_counter(), time.process_time()
    algo.fit(
        dataset,
        n_steps=args.updates,
        n_steps_per_epoch=args.updates,
        show_progress=False,
        save_interval=args.updates + 1,
        logger_adapter=d3rlpy.logging.NoopAdapterFactory(),
    )
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    result = {"algo": args.algo, "updates": args.updates, "seconds": seconds, "cpu_seconds": cpu_seconds, "env_id": env_id}
    if not args.time_only:
        start = time.perf_counter()
        returns = evaluate(algo, env_id, args.episodes, args.eval_seed)
        result.update(return_mean=float(np.mean(returns)), return_std=float(np.std(returns)), episodes=len(returns))
        result["eval_seconds"] = time.perf_counter() - start
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
