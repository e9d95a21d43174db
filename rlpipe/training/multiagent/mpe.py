"""The MPE env family (``mpe2``'s multi-particle envs with discrete actions, the reference
text's MADDPG tasks) as a plug-in: observations next to their change (the velocities MPE
observes only as differences), per-agent policies of a saved run, and evaluation of two
sides, the ``adversary_*`` agents and the good ones, with cross-play against another run's
adversaries.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rlpipe.envs.multiagent import make_parallel_env
from rlpipe.errors import RlpipeError
from rlpipe.training.evaluation import EvalResult
from rlpipe.training.multiagent import FamilyPlugin, SavedActor

AgentPolicies = Mapping[str, Callable[[np.ndarray], int]]
"""agent name -> (its observation -> its action); :func:`evaluate_sides` calls a policy's
``reset()``, if it has one, at every episode start."""


def with_obs_delta(obs: np.ndarray, prev: np.ndarray) -> np.ndarray:
    """``[o_t, o_t - o_{t-1}]`` (``prev = obs`` at an episode's first step). MPE observations
    are relative positions only; their change is the (relative) velocities times dt, without
    which a memoryless actor cannot brake on a target (it overshoots and circles it)."""
    return np.concatenate([obs, obs - prev]).astype(np.float32, copy=False)


class AgentPolicy:
    """Agent ``i``'s action from its observation by ``actors`` (an ``AgentActors``); an actor
    with ``obs_deltas`` reads :func:`with_obs_delta`, so the policy keeps the previous
    observation until ``reset()``. With a policy ensemble every ``reset()`` (episode) draws
    the member that acts, uniformly, from a stream seeded by ``(seed, i)``."""

    def __init__(self, actors: Any, i: int, device: torch.device, deterministic: bool = True, seed: int = 0) -> None:
        self.actors, self.i, self.device, self.deterministic = actors, i, device, deterministic
        self.prev: np.ndarray | None = None
        self.member, self.member_rng = 0, np.random.default_rng([seed, i])

    def reset(self) -> None:
        self.prev = None
        if self.actors.ensemble > 1:
            self.member = int(self.member_rng.integers(self.actors.ensemble))

    def __call__(self, obs: np.ndarray) -> int:
        x = obs
        if self.actors.obs_deltas:
            x = with_obs_delta(obs, obs if self.prev is None else self.prev)
            self.prev = obs
        return int(
            self.actors.act(self.i, torch.as_tensor(x, dtype=torch.float32, device=self.device)[None], self.deterministic, self.member)[0]
        )


@dataclass(frozen=True)
class SideEval(EvalResult):
    """EvalResult of a PettingZoo env with two sides: agents named ``adversary_*`` and the
    good ones. ``mean``/``returns`` are the good agents' (per agent, per episode); also the
    mean return of each agent and of each side (None for a side with no agents)."""

    agent_returns: dict[str, float] | None = None
    adversary_return_mean: float | None = None
    good_return_mean: float | None = None


def evaluate_sides(policies: AgentPolicies, env_id: str, episodes: int, seed: int, **env_kwargs: Any) -> SideEval:
    """Play ``episodes`` episodes of a PettingZoo Parallel env (episode ``k`` reset with
    ``seed + k``) and average each agent's and each side's episode return."""
    env = make_parallel_env(env_id, **env_kwargs)
    agents = list(env.possible_agents)
    returns = np.zeros((episodes, len(agents)))
    lengths = []
    for k in range(episodes):
        obs, _ = env.reset(seed=seed + k)
        for policy in policies.values():
            getattr(policy, "reset", lambda: None)()
        length = 0
        while env.agents:
            obs, rewards, *_ = env.step({agent: policies[agent](obs[agent]) for agent in env.agents})
            returns[k] += [rewards.get(agent, 0.0) for agent in agents]
            length += 1
        lengths.append(length)
    env.close()
    adversary = np.array([a.startswith("adversary") for a in agents])
    good = returns[:, ~adversary].mean(1)
    return SideEval(
        float(good.mean()),
        float(good.std()),
        good.tolist(),
        lengths,
        None,
        {a: float(r) for a, r in zip(agents, returns.mean(0))},
        float(returns[:, adversary].mean()) if adversary.any() else None,
        float(good.mean()),
    )


def evaluate_run(
    saved: SavedActor, episodes: int, seed: int, deterministic: bool, device: Any, adversary: Callable[[], SavedActor] | None
) -> dict[str, Any]:
    """Side returns of a saved MPE run (MADDPG). ``adversary`` takes the ``adversary_*``
    agents' actors from another run of the same env: cross-play, e.g. MADDPG's good agents
    against an independent DDPG adversary."""
    actor: Any = saved.actor  # an AgentActors (rlpipe.algos.maddpg)
    env_id = saved.meta["env_id"]
    policies = {a: AgentPolicy(actor, i, device, deterministic, seed) for i, a in enumerate(actor.agents)}
    report: dict[str, Any] = {}
    if adversary is not None:
        other = adversary()
        others: Any = other.actor
        if other.meta["env_id"] != env_id or getattr(others, "agents", None) != actor.agents:
            raise RlpipeError(f"--adversary-run {other.run_dir} is not a run of {env_id} with the same agents")
        policies.update(
            {a: AgentPolicy(others, i, device, deterministic, seed) for i, a in enumerate(others.agents) if a.startswith("adversary")}
        )
        report["adversary_run"] = str(other.run_dir)
    sides = evaluate_sides(policies, env_id, episodes, seed)
    return {
        **report,
        "adversary_return_mean": sides.adversary_return_mean,
        "good_return_mean": sides.good_return_mean,
        "agent_returns": sides.agent_returns,
    }


PLUGIN = FamilyPlugin(evaluate_run=evaluate_run, headline=("adversary_return_mean", "good_return_mean"))
