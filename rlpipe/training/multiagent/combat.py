"""The Combat env family (``Combat-v0``, :mod:`rlpipe.envs.combat`) as a plug-in: batched
games as on-policy rows of a shared team policy (IPPO), IPPO's policy head, evaluation by
win rate, the evaluator of policies learnt from Combat datasets, and collection of those
datasets (one row per living agent per step).

Combat datasets carry the dataset schema's ``agent`` column (``agent_0``, ``agent_1``, ...);
rows of an episode are sorted by (step, agent). An agent's row holds its own observation,
action and reward; ``terminated`` / ``truncated`` are the game's. Dead agents (who observe
zeros and whose actions are ignored) get no rows. The rules a dataset was collected under
are its producer's ``rules``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from rlpipe.datasets.store import DatasetInfo
from rlpipe.envs.combat import CHANNELS, CombatRules, CombatVectorEnv
from rlpipe.errors import RlpipeError
from rlpipe.nets.networks import ActorCritic, init_spec, register_policy_class
from rlpipe.training.evaluation import EvalResult
from rlpipe.training.multiagent import FamilyPlugin, RowSink, SavedActor
from rlpipe.training.multiagent.teams import RowStep, TeamPolicy, team_policy, with_agent_ids


def combat_rules(config: Mapping[str, Any]) -> dict[str, Any]:
    """The Combat keyword arguments among a config's fields (IPPO's; also a checkpoint's saved config)."""
    return {k: v for k, v in config.items() if k in CombatRules.__dataclass_fields__}


@register_policy_class
class CombatActorCritic(ActorCritic):
    """IPPO's Combat policy: an :class:`ActorCritic` over one agent's observation (6 channels
    x ``view`` x ``view``, channel-major: ``obs_dim`` floats), then ``extra_dim`` features
    (its one-hot id).

    ``mask_attacks`` sets the logit of "attack opponent j" to a large negative number when
    the observation says the attack cannot hit: opponent j is not in the agent's 3x3
    neighbourhood, or the agent is cooling down. The mask is read from the observation
    itself, so training, evaluation and a reloaded checkpoint all apply the same one.
    """

    kind = "combat_actor_critic"

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        n_opponents: int,
        hidden: Sequence[int] = (64, 64),
        extra_dim: int = 0,
        mask_attacks: bool = False,
        activation: str = "tanh",
    ) -> None:
        super().__init__(obs_dim + extra_dim, act_dim, True, hidden, activation)
        self.spec = init_spec(CombatActorCritic.__init__, locals())  # its own arguments, not ActorCritic's
        self.obs_dim, self.view = obs_dim, math.isqrt(obs_dim // CHANNELS)
        self.n_opponents, self.mask_attacks = n_opponents, mask_attacks

    def attack_mask(self, obs: torch.Tensor) -> torch.Tensor:
        """[B, n_opponents] True where attacking opponent j can hit, per the observation."""
        window = obs[:, : self.obs_dim].view(-1, CHANNELS, self.view, self.view)
        c = self.view // 2
        near = window[:, :, c - 1 : c + 2, c - 1 : c + 2].flatten(2)  # the 3x3 neighbourhood
        ids = torch.arange(self.n_opponents, device=obs.device, dtype=obs.dtype)
        # team -1 marks an opponent (only living units show); channel 1 is its id within its team
        present = ((near[:, 0, None, :] == -1) & (near[:, 1, None, :] == ids[:, None])).any(-1)
        ready = window[:, 3, c, c] == 1  # the agent's own cell: cooldown +1 ready, -1 cooling (0: dead)
        return present & ready[:, None]

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        head, value = super().forward(obs)
        if self.mask_attacks:
            # A large finite number, not -inf: the entropy's p * log p stays 0 instead of nan.
            blocked = ~self.attack_mask(obs)
            head = torch.cat([head[:, : -self.n_opponents], head[:, -self.n_opponents :].masked_fill(blocked, -1e9)], -1)
        return head, value


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
        "eval_episode_length_mean": final.length_mean,
    }


class CombatDatasetEvaluator:
    """A ``Run`` evaluator for a policy learnt from a Combat dataset's rows: every agent acts
    with the same row policy ([rows, obs_dim] -> [rows]) on its own observation, under the
    rules the dataset was collected with. Keeps the latest result for the metrics.
    A :class:`rlpipe.training.multiagent.DatasetEvaluator`."""

    def __init__(self, info: DatasetInfo) -> None:
        self.env_kwargs = dict(info.metadata.get("producer", {}).get("rules", {}))  # the producer's record
        self.latest: CombatEval | None = None

    def spaces(self) -> tuple[spaces.Space, spaces.Space]:
        rules = CombatRules(**self.env_kwargs)
        return rules.observation_space(), rules.action_space()

    def __call__(self, policy: Callable[[np.ndarray], np.ndarray], episodes: int, seed: int) -> CombatEval:
        team = lambda obs: policy(obs.reshape(-1, obs.shape[-1])).reshape(obs.shape[:2])  # noqa: E731
        self.latest = evaluate_combat(team, episodes, seed, self.env_kwargs)
        return self.latest

    def metrics(self) -> dict[str, Any]:
        return {} if self.latest is None else combat_metrics(self.latest)


def random_team_policy(n_actions: int, seed: int) -> TeamPolicy:
    rng = np.random.default_rng(seed)
    return lambda obs: rng.integers(0, n_actions, size=obs.shape[:2])


def collect_combat(
    sink: RowSink,
    make_policy: Callable[[CombatVectorEnv], TeamPolicy],
    episodes: int,
    num_envs: int,
    seed: int,
    rules: dict[str, Any] | None = None,
) -> None:
    """Play ``episodes`` whole Combat episodes on ``num_envs`` batched games and pass each
    finished episode's rows to ``sink`` (episode ids in order of completion)."""
    envs = CombatVectorEnv(num_envs, **(rules or {}))
    policy = make_policy(envs)
    names = np.array([f"agent_{i}" for i in range(envs.rules.team_size)])
    obs, info = envs.reset(seed=seed)
    alive = info["alive"]
    history: list[dict[str, np.ndarray]] = []  # one entry per batched step
    start = np.zeros(num_envs, np.int64)  # index in history where each game's episode began
    next_id = 0
    while next_id < episodes:
        action = policy(obs)
        next_obs, reward, term, trunc, info = envs.step(action)
        history.append(
            {
                "obs": obs,
                "action": action,
                "reward": reward,
                "next_obs": next_obs,
                "terminated": term,
                "truncated": trunc,
                "acting": alive & info["valid"][:, None],
            }
        )
        for g in np.flatnonzero(term | trunc):
            if next_id < episodes:
                sink(_episode_rows(history[start[g] :], int(g), next_id, names))
                next_id += 1
            start[g] = len(history) + 1  # the next step is the autoreset step
        first = min(int(start.min()), len(history))  # drop steps no unfinished episode needs (start may point past the end)
        if first > 0:
            history, start = history[first:], start - first
        obs, alive = next_obs, info["alive"]


def _episode_rows(steps: list[dict[str, np.ndarray]], game: int, episode_id: int, names: np.ndarray) -> dict[str, Any]:
    """The rows of game ``game``'s episode from its per-step batched records."""
    acting = np.stack([s["acting"][game] for s in steps])  # [T, A]
    t, a = np.nonzero(acting)
    pick = lambda key: np.stack([s[key][game] for s in steps])  # noqa: E731
    return {
        "episode_id": np.full(t.size, episode_id, np.int64),
        "step": t.astype(np.int32),
        "agent": names[a],
        "obs": pick("obs")[t, a],
        "action": pick("action")[t, a].astype(np.int64),
        "reward": pick("reward")[t, a].astype(np.float32),
        "next_obs": pick("next_obs")[t, a],
        "terminated": pick("terminated")[t],
        "truncated": pick("truncated")[t],
    }


def evaluate_run(
    saved: SavedActor, episodes: int, seed: int, deterministic: bool, device: Any, adversary: Callable[[], SavedActor] | None
) -> dict[str, Any]:
    """Win rate and returns of a saved Combat run: IPPO, or a policy learnt from a Combat
    dataset. An IPPO run trained with sampled evaluation actions is evaluated the same way."""
    if adversary is not None:  # the opponents are the env's scripted bots
        raise RlpipeError("--adversary-run applies to MPE runs only: Combat-v0's opponents are its bots")
    config = saved.meta.get("config", {})
    deterministic = deterministic and config.get("eval_deterministic", True)
    # IPPO's rules are config fields; a policy learnt from a dataset keeps the dataset's in its meta.
    rules = saved.meta.get("env_kwargs") or combat_rules(config)
    res = evaluate_combat(team_policy(saved.actor, config.get("agent_ids", False), device, deterministic, seed), episodes, seed, rules)
    return {
        "deterministic": deterministic,
        "win_rate": res.win_rate,
        "team_return_mean": res.mean,
        "team_return_std": res.std,
        "agent_returns": list(res.agent_returns),
        "episode_length_mean": float(np.mean(res.lengths)),
    }


class CombatCollection:
    """A Combat dataset's episodes: random actions, or a trained IPPO team's (under the rules it
    was trained with; without ``stochastic`` it acts as in its own evaluation, ``eval_deterministic``)."""

    def __init__(self, expert: SavedActor | None, stochastic: bool, seed: int) -> None:
        self.rules: dict[str, Any] = {}
        self.producer: dict[str, Any] = {"algorithm": "random", "checkpoint_sha256": None}
        self.team: TeamPolicy | None = None
        if expert is not None:
            if expert.meta["policy"]["kind"] not in ("actor_critic", CombatActorCritic.kind):
                raise RlpipeError(f"{expert.run_dir} is not an IPPO run on Combat-v0")
            config = expert.meta["config"]
            greedy = False if stochastic else config.get("eval_deterministic", True)
            self.team = team_policy(expert.actor, config.get("agent_ids", False), "cpu", greedy, seed)
            self.rules = combat_rules(config)
            self.producer = {
                "algorithm": expert.meta["algo"],
                "checkpoint_sha256": expert.sha256,
                "run_dir": str(expert.run_dir),
                "deterministic": greedy,
            }
            torch.set_num_threads(1)
        game = CombatRules(**self.rules)
        self.observation_space: spaces.Space = game.observation_space()
        self.action_space: spaces.Space = game.action_space()
        self.producer["rules"] = self.rules

    def play(self, sink: RowSink, episodes: int, num_envs: int, seed: int) -> None:
        team = self.team
        make_policy = (lambda envs: team) if team is not None else (lambda envs: random_team_policy(envs.rules.n_actions, seed))
        collect_combat(sink, make_policy, episodes, num_envs, seed, self.rules)


PLUGIN = FamilyPlugin(
    evaluate_run=evaluate_run,
    headline=("win_rate",),
    dataset_evaluator=CombatDatasetEvaluator,
    experts=("ippo",),
    collection=CombatCollection,
)
