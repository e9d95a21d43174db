"""What an offline run's critic believes along its own policy's episodes.

Plays each run's saved policy in its env (held-out seeds) and, at every step, compares the
critics' value of the action taken, min_i Q_i(s, pi(s)), with the discounted return that
actually followed (in the critic's reward units: IQL's ``scale_rewards`` applied). A critic
that overestimates where the policy is about to fail is extrapolating; one that foresees the
failure but undervalues the states before it has not converged.

    .venv/bin/python bench/critic_along_episodes.py 'suites/d4rl-cpu/sweeps/td3bc/runs/dataset=hopper-medium/seed-*' \
        --store suites/d4rl-cpu/datasets --episodes 5 --out bench/results/critic-along-episodes.json
"""

from __future__ import annotations

import argparse
import glob
import json
from pathlib import Path
from typing import Any

import _common  # noqa: F401  (sets thread limits before numpy/torch are imported)
import gymnasium as gym
import numpy as np
import torch
from _common import machine_description, today
from safetensors.torch import load_file

import rlpipe
from rlpipe.envs.spaces import ActionScaler
from rlpipe.nets.networks import EnsembleQ, ObsNormalizer

POINTS = {"start": 0.0, "quarter": 0.25, "half": 0.5, "three quarters": 0.75}  # fractions of an episode
BEFORE_END = (50, 10, 1)  # steps before the episode's last


def load_critic(run: Path, obs_dim: int, act_dim: int) -> EnsembleQ:
    """The run's ``critic`` module (an EnsembleQ: TD3+BC, IQL, AWAC, ReBRAC, CQL's SAC twins)."""
    weights = {key[len("critic.") :]: value for key, value in load_file(run / "model.safetensors").items() if key.startswith("critic.")}
    if "net.layers.0.weight" not in weights:
        raise SystemExit(f"{run}: no EnsembleQ critic in its checkpoint")
    first, hidden = weights["net.layers.0.weight"], []
    index = 0
    while f"net.layers.{index + 1}.weight" in weights:
        hidden.append(int(weights[f"net.layers.{index}.weight"].shape[-1]))
        index += 1
    norm = ObsNormalizer(obs_dim) if "obs_norm.mean" in weights else None
    layer_norm = any(".norms." in key or "layer_norm" in key for key in weights)
    critic = EnsembleQ(obs_dim, act_dim, hidden, n=int(first.shape[0]), obs_norm=norm, layer_norm=layer_norm)
    critic.load_state_dict(weights)
    return critic.eval()


def reward_scale(policy: Any, store: str | None) -> float:
    """The factor the run's critic saw rewards multiplied by (IQL's returns-range scaling)."""
    if not policy.config.get("scale_rewards"):
        return float(policy.config.get("reward_scale", 1.0))
    data = rlpipe.load_dataset(policy.config["dataset"], store)
    returns = data.episode_returns()
    return float(1000.0 / (returns.max() - returns.min()))


def episodes_of(run: Path, episodes: int, seed: int, store: str | None) -> dict[str, Any]:
    policy = rlpipe.load_policy(run)
    env = gym.make(policy.env_id)
    obs_dim, act_dim = int(np.prod(env.observation_space.shape or ())), int(np.prod(env.action_space.shape or ()))
    critic, scaler = load_critic(run, obs_dim, act_dim), ActionScaler(env.action_space)
    gamma, scale = float(policy.config.get("gamma", 0.99)), reward_scale(policy, store)
    played = []
    for k in range(episodes):
        obs, _ = env.reset(seed=seed + k)
        states, actions, rewards, terminated, truncated = [], [], [], False, False
        while not (terminated or truncated):
            action = policy(np.asarray(obs, np.float32)[None])[0]
            states.append(np.asarray(obs, np.float32))
            actions.append(scaler.from_env(action[None])[0])
            obs, reward, terminated, truncated, _ = env.step(action)
            rewards.append(scale * float(reward))
        with torch.no_grad():
            q = critic(torch.as_tensor(np.array(states)), torch.as_tensor(np.array(actions), dtype=torch.float32)).min(0).values.numpy()
        followed = np.zeros(len(rewards))
        for t in reversed(range(len(rewards))):
            followed[t] = rewards[t] + gamma * (followed[t + 1] if t + 1 < len(rewards) else 0.0)
        n = len(rewards)
        steps = {name: int(fraction * (n - 1)) for name, fraction in POINTS.items()}
        steps |= {f"{back} before the end": max(n - back, 0) for back in BEFORE_END}
        played.append(
            {
                "length": n,
                "fell": bool(terminated),
                "points": {name: {"step": t, "q": float(q[t]), "return_followed": float(followed[t])} for name, t in steps.items()},
                "first_half_ratio": float(np.mean(q[: n // 2]) / np.mean(followed[: n // 2])),
            }
        )
    env.close()
    return {"run": str(run), "algo": policy.algo, "reward_scale": scale, "episodes": played}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run directories or quoted globs")
    parser.add_argument("--episodes", type=int, default=5)
    parser.add_argument("--seed", type=int, default=2_000, help="episode k resets with seed + k (not a training or eval seed)")
    parser.add_argument("--store", default=None, help="the runs' dataset store (for IQL's reward scale)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    runs = [Path(p) for pattern in args.runs for p in sorted(glob.glob(pattern))]
    results = [episodes_of(run, args.episodes, args.seed, args.store) for run in runs]
    for result in results:
        print(f"{result['run']} ({result['algo']}, rewards x {result['reward_scale']:.3f})")
        for ep in result["episodes"]:
            cells = ", ".join(f"{name} {p['q']:.1f} vs {p['return_followed']:.1f}" for name, p in ep["points"].items())
            print(f"  length {ep['length']}{' (fell)' if ep['fell'] else ''}; Q vs return followed: {cells}")
    if args.out:
        args.out.write_text(json.dumps({"date": today(), "machine": machine_description(), "runs": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
