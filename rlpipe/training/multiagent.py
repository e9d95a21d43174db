"""Multi-agent pieces: a team's shared-policy inputs, batched Combat games as on-policy rows
(one per game x agent), and evaluation on Combat and on any PettingZoo Parallel env
(per-agent returns)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from rlpipe.envs.combat import CombatRules, CombatVectorEnv
from rlpipe.envs.multiagent import make_parallel_env
from rlpipe.errors import RlpipeError
from rlpipe.training.evaluation import EvalResult

TeamPolicy = Callable[[np.ndarray], np.ndarray]
"""Observations of a batch of teams [B, n_agents, obs_dim] -> their actions [B, n_agents]."""


def with_agent_ids(obs: np.ndarray) -> np.ndarray:
    """Append each agent's one-hot id: [B, A, D] -> [B, A, D + A] float32 (lets a shared policy
    specialise). Training rows and the evaluation's team policy both build their input with it."""
    batch, n_agents = obs.shape[:2]
    ids = np.broadcast_to(np.eye(n_agents, dtype=np.float32), (batch, n_agents, n_agents))
    return np.concatenate([obs.astype(np.float32, copy=False), ids], axis=-1)


@dataclass(frozen=True)
class RowStep:
    """One step of every (game, agent) row: what :class:`rlpipe.training.onpolicy.RolloutStorage` stores."""

    rewards: np.ndarray
    terminated: np.ndarray  # the game ended, or this agent died
    truncated: np.ndarray
    valid: np.ndarray  # False for the games' autoreset steps (and dead agents unless carried): not trained on
    acting: np.ndarray | None = None  # with carried dead agents: False for them (value-only rows)


class CombatRows:
    """Batched Combat games as rows of a shared team policy (a ``RowStepper``): row
    ``g * team_size + i`` is agent ``i`` of game ``g``; its observation has the agent's one-hot
    id appended when ``agent_ids``; each agent's reward is the env's plus ``win_bonus`` on the
    step its team wins (training-only shaping: the env's rules, its evaluation and collected
    data keep their own reward). Counts the finished games and the team's wins."""

    def __init__(
        self,
        envs: CombatVectorEnv,
        agent_ids: bool,
        seed: int,
        win_bonus: float = 0.0,
        team_reward: bool = False,
        carry_dead: bool = False,
        teammates_obs: bool = False,
    ) -> None:
        self.envs, self.n_agents, self.win_bonus = envs, envs.rules.team_size, win_bonus
        self.agent_ids, self.team_reward, self.carry_dead, self.teammates_obs = agent_ids, team_reward, carry_dead, teammates_obs
        obs, info = envs.reset(seed=seed)
        self.alive: np.ndarray = info["alive"]  # [games, agents]
        self.obs = self._rows(obs)
        self.episodes = self.wins = 0

    def _rows(self, obs: np.ndarray) -> np.ndarray:
        x = obs.astype(np.float32, copy=False)
        rows = with_agent_ids(x) if self.agent_ids else x
        if self.teammates_obs:  # then the other agents' observations, in index order
            others = [np.concatenate([x[:, j] for j in range(self.n_agents) if j != i], -1) for i in range(self.n_agents)]
            rows = np.concatenate([rows, np.stack(others, 1)], axis=-1)
        return rows.reshape(-1, rows.shape[-1])

    def step(self, actions: np.ndarray) -> RowStep:
        obs, reward, term, trunc, info = self.envs.step(actions.reshape(-1, self.n_agents))
        if self.team_reward:
            reward = np.broadcast_to(reward.mean(1, keepdims=True), reward.shape)
        reward = reward + self.win_bonus * info["win"][:, None]
        game = np.broadcast_to(info["valid"][:, None], reward.shape)
        living = game & self.alive
        if self.carry_dead:  # a dead agent's row runs on to the game's end, value-only
            ended, valid, acting = np.repeat(term, self.n_agents), game.reshape(-1), living.reshape(-1)
        else:  # an agent's episode ends with its death
            ended, valid, acting = (term[:, None] | (self.alive & ~info["alive"])).reshape(-1), living.reshape(-1), None
        step = RowStep(reward.reshape(-1), ended, np.repeat(trunc, self.n_agents), valid, acting)
        self.alive, self.obs = info["alive"], self._rows(obs)
        self.episodes += int((term | trunc).sum())
        self.wins += int(info["win"].sum())
        return step


def action_logits(actor: nn.Module, obs: torch.Tensor) -> torch.Tensor:
    """Action logits of a shared Combat policy: IPPO's ``ActorCritic`` or a ``CategoricalActor``
    learnt from a Combat dataset (BC)."""
    return actor.dist(obs).logits if actor.kind == "categorical" else actor(obs)[0]


def team_policy(
    actor: nn.Module, agent_ids: bool, device: torch.device | str = "cpu", deterministic: bool = True, seed: int = 0
) -> TeamPolicy:
    """Wrap a shared policy (see :func:`action_logits`) as a numpy team policy: greedy, or
    sampled from a generator seeded with ``seed`` (so a stochastic evaluation is reproducible too)."""
    device = torch.device(device)
    generator = torch.Generator(device=device).manual_seed(seed)

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            x = torch.as_tensor(with_agent_ids(obs) if agent_ids else obs, dtype=torch.float32, device=device)
            logits = action_logits(actor, x.flatten(0, 1))
            action = logits.argmax(-1) if deterministic else torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)
            return action.view(obs.shape[:2]).cpu().numpy()

    return act


@dataclass(frozen=True)
class CombatEval(EvalResult):
    """EvalResult with ``mean``/``returns`` = team return (sum over agents) per episode and
    ``success_rate`` = win rate, plus the mean return of each agent."""

    agent_returns: tuple[float, ...] = ()

    @property
    def win_rate(self) -> float:
        return float(self.success_rate or 0.0)


def evaluate_combat(
    policy: TeamPolicy, episodes: int, seed: int, rules: Mapping[str, Any] | None = None, max_envs: int = 100
) -> CombatEval:
    """Play ``episodes`` Combat games with ``policy``; each batched game plays a fixed quota,
    so the result depends only on (policy, episodes, seed, rules)."""
    n = max(1, min(episodes, max_envs))
    quota = np.array([episodes // n + (i < episodes % n) for i in range(n)])
    envs = CombatVectorEnv(n, **(rules or {}))
    obs, _ = envs.reset(seed=seed)
    ep_ret = np.zeros((n, envs.rules.team_size))
    ep_len = np.zeros(n, np.int64)
    played = np.zeros(n, np.int64)
    returns, lengths, wins = [], [], []
    while (played < quota).any():
        obs, reward, term, trunc, info = envs.step(policy(obs))
        ep_ret += reward
        ep_len += info["valid"]
        for i in np.flatnonzero((term | trunc) & (played < quota)):
            returns.append(ep_ret[i].copy())
            lengths.append(int(ep_len[i]))
            wins.append(bool(info["win"][i]))
            played[i] += 1
        ep_ret[term | trunc], ep_len[term | trunc] = 0.0, 0
    per_agent = np.array(returns)
    team = per_agent.sum(1)
    return CombatEval(
        float(team.mean()), float(team.std()), team.tolist(), lengths, float(np.mean(wins)), tuple(float(r) for r in per_agent.mean(0))
    )


def combat_metrics(final: CombatEval) -> dict[str, Any]:
    """The fixed Combat keys of ``metrics.json`` (IPPO and policies learnt from Combat data)."""
    return {
        "eval_win_rate": final.win_rate,
        "eval_team_return_mean": final.mean,
        **{f"eval_return_agent_{i}": r for i, r in enumerate(final.agent_returns)},
        "eval_episode_length_mean": float(np.mean(final.lengths)),
    }


def dataset_combat_rules(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The Combat rules a multi-agent dataset was collected under (its producer's record)."""
    return dict(metadata.get("producer", {}).get("rules", {}))


class CombatDatasetEvaluator:
    """A ``Run`` evaluator for a policy learnt from a Combat dataset's rows: every agent acts
    with the same row policy ([rows, obs_dim] -> [rows]) on its own observation, under the
    rules the dataset was collected with. Keeps the latest result for the metrics."""

    def __init__(self, rules: Mapping[str, Any]) -> None:
        self.rules = dict(rules)
        self.latest: CombatEval | None = None

    def __call__(self, policy: Callable[[np.ndarray], np.ndarray], episodes: int, seed: int) -> CombatEval:
        team = lambda obs: policy(obs.reshape(-1, obs.shape[-1])).reshape(obs.shape[:2])  # noqa: E731
        self.latest = evaluate_combat(team, episodes, seed, self.rules)
        return self.latest

    def metrics(self) -> dict[str, Any]:
        return {} if self.latest is None else combat_metrics(self.latest)


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

    def __init__(self, actors: nn.Module, i: int, device: torch.device, deterministic: bool = True, seed: int = 0) -> None:
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


def _load_actor(run_dir: str | Path, device: torch.device) -> tuple[nn.Module, dict[str, Any], str]:
    """(actor, checkpoint meta, weights hash) of a saved run."""
    from rlpipe.models.checkpoint import load_checkpoint
    from rlpipe.models.networks import build_policy

    ckpt = load_checkpoint(run_dir, device)
    actor = build_policy(ckpt.meta["policy"]["kind"], ckpt.meta["policy"]["spec"]).to(device)
    actor.load_state_dict(ckpt.state_dict("policy"))
    return actor.eval(), ckpt.meta, ckpt.sha256


def load_team_policy(
    run_dir: str | Path, deterministic: bool | None = None, seed: int = 0, device: str = "cpu"
) -> tuple[TeamPolicy, bool, dict[str, Any], str]:
    """(team policy, whether it acts greedily, checkpoint meta, weights hash) of a saved IPPO
    run; ``deterministic=None`` acts as the run's own evaluation did (``eval_deterministic``)."""
    dev = torch.device(device)
    actor, meta, sha = _load_actor(run_dir, dev)
    if meta["policy"]["kind"] not in ("actor_critic", "combat_actor_critic") or meta["env_id"] != "Combat-v0":
        raise RlpipeError(f"{run_dir} is not an IPPO run on Combat-v0")
    config = meta["config"]
    greedy = config.get("eval_deterministic", True) if deterministic is None else deterministic
    return team_policy(actor, config.get("agent_ids", False), dev, greedy, seed), greedy, meta, sha


def evaluate_run(
    run_dir: str | Path, episodes: int, seed: int, deterministic: bool = True, device: str = "cpu", adversary_run: str | Path | None = None
) -> dict[str, Any]:
    """Evaluate a saved multi-agent run (on Combat: ippo, or a policy learnt from a Combat
    dataset; on MPE: maddpg): the fixed metric keys (``win_rate``, or
    ``adversary_return_mean`` / ``good_return_mean``) plus returns.

    ``adversary_run`` (MPE) takes the ``adversary_*`` agents' actors from another run of the
    same env: cross-play, e.g. MADDPG's good agents against an independent DDPG adversary.
    """
    from rlpipe.training.env import resolve_device

    dev = resolve_device(device)
    actor, meta, sha = _load_actor(run_dir, dev)
    config = meta.get("config", {})
    head = {
        "run_dir": str(run_dir),
        "algo": meta["algo"],
        "env_id": meta["env_id"],
        "episodes": episodes,
        "seed": seed,
        "deterministic": deterministic,
        "checkpoint_sha256": sha,
    }
    if meta["env_id"] == "Combat-v0":
        if adversary_run is not None:  # the opponents are the env's scripted bots
            raise RlpipeError("--adversary-run applies to MPE runs only: Combat-v0's opponents are its bots")
        # An IPPO run trained with sampled evaluation actions is evaluated the same way.
        deterministic = head["deterministic"] = deterministic and config.get("eval_deterministic", True)
        # IPPO's rules are config fields; a policy learnt from a dataset keeps the dataset's in its meta.
        rules = meta.get("env_kwargs") or {k: v for k, v in config.items() if k in CombatRules.__dataclass_fields__}
        res = evaluate_combat(team_policy(actor, config.get("agent_ids", False), dev, deterministic, seed), episodes, seed, rules)
        return {
            **head,
            "win_rate": res.win_rate,
            "team_return_mean": res.mean,
            "team_return_std": res.std,
            "agent_returns": list(res.agent_returns),
            "episode_length_mean": float(np.mean(res.lengths)),
        }

    policies = {a: AgentPolicy(actor, i, dev, deterministic, seed) for i, a in enumerate(actor.agents)}
    if adversary_run is not None:
        other, other_meta, _ = _load_actor(adversary_run, dev)
        if other_meta["env_id"] != meta["env_id"] or getattr(other, "agents", None) != actor.agents:
            raise RlpipeError(f"--adversary-run {adversary_run} is not a run of {meta['env_id']} with the same agents")
        policies.update(
            {a: AgentPolicy(other, i, dev, deterministic, seed) for i, a in enumerate(other.agents) if a.startswith("adversary")}
        )
        head["adversary_run"] = str(adversary_run)
    sides = evaluate_sides(policies, meta["env_id"], episodes, seed)
    return {
        **head,
        "adversary_return_mean": sides.adversary_return_mean,
        "good_return_mean": sides.good_return_mean,
        "agent_returns": sides.agent_returns,
    }
