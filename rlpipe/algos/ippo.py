"""IPPO: independent PPO with one policy shared by the agents of a team, on batched Combat.

Each agent acts on its own observation (optionally with its one-hot id appended); the value
function is per agent too (no centralised critic: that is what makes it *independent*;
``central_critic`` swaps in a MAPPO-style one). The agents of all ``num_envs`` games form
one batch of ``num_envs x team_size`` PPO rows (:class:`rlpipe.training.multiagent.combat.CombatRows`):
the shared on-policy pieces (:mod:`rlpipe.training.onpolicy`: rollout storage, GAE, the
clipped update) run on them with a per-agent episode end (the game's end, or the agent's
death; with ``carry_dead`` only the game's end), and only living agents' actions are
trained on. Read top to bottom: config, ``train``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlpipe.algos.ppo import ppo_update
from rlpipe.algos.registry import REGISTRY
from rlpipe.envs.combat import CombatVectorEnv
from rlpipe.errors import RlpipeError
from rlpipe.nets.networks import mlp
from rlpipe.training import OnlineConfig, Run, TrainResult, resolve_device, seed_everything
from rlpipe.training.config import layer_sizes, positive
from rlpipe.training.env import DISCRETE
from rlpipe.training.multiagent.combat import CombatActorCritic, CombatEval, CombatRows, combat_metrics, combat_rules, evaluate_combat
from rlpipe.training.multiagent.teams import TeamPolicy, team_policy
from rlpipe.training.onpolicy import RolloutStorage
from rlpipe.training.optim import adam

ACTION_SPACES = (DISCRETE,)
SPEC = REGISTRY["ippo"]


@dataclass
class Config(OnlineConfig):
    env_steps: int = positive(2_000_000)  # game steps (each moves the whole team)
    num_envs: int = positive(64)  # games played side by side
    eval_every: int = positive(200_000)
    eval_episodes: int = positive(200)
    num_steps: int = positive(64)  # rollout length per game
    num_epochs: int = positive(4)
    minibatch_size: int = positive(1024)  # agent steps
    learning_rate: float = positive(1e-3)
    anneal: bool = True  # linearly decay learning rate and clip range to 0
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_coef: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    normalize_advantages: bool = True
    target_kl: float | None = None  # stop an update's epochs early above this KL
    hidden: tuple[int, ...] = layer_sizes((128, 128))
    agent_ids: bool = True  # append each agent's one-hot id to its observation
    mask_attacks: bool = False  # rule out the attacks an agent's own observation says cannot hit
    # Training-only shaping: added to each agent's reward on the step its team wins. The env's
    # reward (ma-gym's: hits only) stays that of the rules below, so the evaluation's returns
    # and the data `collect --expert ippo` writes are the rules' own. 0 trains on ma-gym's reward.
    win_bonus: float = 0.0
    # Credit assignment (training only). A dead agent's row ends at its death unless
    # carry_dead: then it runs on to the game's end as value-only steps, so the team's later
    # rewards (a win's bonus) reach the agent's last actions through GAE.
    carry_dead: bool = False
    team_reward: bool = False  # each agent trains on its team's mean reward (hits dealt and taken)
    # MAPPO-style critic: the value also reads the teammates' observations (the policy still
    # acts on the agent's own); about 1.4x the CPU per game step.
    central_critic: bool = False
    # Combat rules (defaults: the text's 2 vs 2 on 15x15 under ma-gym's rules with cooldown, where
    # ma-gym's default is 5 vs 5; the text's variant is cooldown=False, win_reward=100, step_reward=-0.1)
    team_size: int = 2
    n_opponents: int = 2
    grid: int = 15
    max_steps: int = 100
    cooldown: bool = True
    win_reward: float = 0.0
    step_reward: float = 0.0
    # Sampled actions: the argmax policy can stall (a blocked move repeats); the 2.5M-step
    # run wins 0.515 sampled vs 0.43 greedy (200 episodes, seed 0).
    eval_deterministic: bool = False
    # (stop_at_return, if set, applies to the team's return)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.env_id not in TUNED:
            raise RlpipeError(f"ippo trains on {', '.join(TUNED)}; got {self.env_id!r}")


# Combat-v0: the settings behind docs/algorithms/multi-agent.md's IPPO figures (win rate >= 0.80
# from 9M game steps on seeds 0-2), so `rlpipe train ippo --env Combat-v0` reproduces them.
TUNED: dict[str, dict[str, Any]] = {
    "Combat-v0": dict(
        win_bonus=10.0, carry_dead=True, team_reward=True, mask_attacks=True, hidden=(64, 64), env_steps=21_000_000, eval_every=3_000_000
    )
}


class CentralCriticActorCritic(nn.Module):
    """A MAPPO-style actor-critic over rows ``[own input | teammates' observations]``: the
    policy (an :class:`CombatActorCritic` whose own value head goes unused) reads the first
    ``policy_dim`` features, the value MLP all of them."""

    def __init__(self, policy: CombatActorCritic, policy_dim: int, row_dim: int, hidden: tuple[int, ...]) -> None:
        super().__init__()
        self.policy, self.policy_dim = policy, policy_dim
        self.value = mlp(row_dim, 1, hidden, "tanh", out_gain=1.0, orthogonal=True)

    def forward(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.policy(rows[:, : self.policy_dim])[0], self.value(rows)[:, 0]

    def sample(self, head: torch.Tensor) -> torch.Tensor:
        return self.policy.sample(head)

    def log_prob_entropy(self, head: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.policy.log_prob_entropy(head, action)


def train(config: Config, out_dir: str | Path | None = None, *, progress: bool = True) -> TrainResult:
    """Train the team's shared policy; with ``out_dir`` also write checkpoint, metrics.json and DVCLive curve."""
    rules = combat_rules(asdict(config))
    envs = CombatVectorEnv(config.num_envs, **rules)
    device = resolve_device(config.device)
    rng = seed_everything(config.seed, config.torch_threads)
    n_agents, obs_dim = envs.rules.team_size, envs.rules.obs_dim
    in_dim = obs_dim + (n_agents if config.agent_ids else 0)
    actor = CombatActorCritic(
        obs_dim, envs.rules.n_actions, envs.rules.n_opponents, config.hidden, n_agents if config.agent_ids else 0, config.mask_attacks
    ).to(device)
    row_dim = in_dim + ((n_agents - 1) * obs_dim if config.central_critic else 0)
    learner = CentralCriticActorCritic(actor, in_dim, row_dim, config.hidden).to(device) if config.central_critic else actor
    params = list(learner.parameters())
    optimizer = adam(params, config.learning_rate, eps=1e-5)
    eval_policy = team_policy(actor, config.agent_ids, device, config.eval_deterministic, config.seed)
    evals: list[CombatEval] = []

    curve: list[dict[str, float]] = []  # win rate against wall and CPU time: IPPO's budget is in minutes

    def evaluator(policy: TeamPolicy, episodes: int, seed: int) -> CombatEval:
        evals.append(evaluate_combat(policy, episodes, seed, rules))
        curve.append(
            {
                "env_steps": game_steps,
                "wall_seconds": round(run.elapsed(), 2),
                "cpu_seconds": round(time.process_time() - cpu_start, 2),
                "win_rate": evals[-1].win_rate,
            }
        )
        return evals[-1]

    run = Run(SPEC.name, config, out_dir, progress, evaluator=evaluator)
    rows = CombatRows(envs, config.agent_ids, config.seed, config.win_bonus, config.team_reward, config.carry_dead, config.central_critic)
    storage = RolloutStorage(config.num_steps, config.num_envs * n_agents, row_dim, 1, True, device)
    perm_gen = torch.Generator(device=device).manual_seed(int(rng.integers(2**31)))
    cpu_start = time.process_time()
    game_steps = agent_steps = updates = 0
    try:
        while True:
            frac = max(0.0, 1.0 - game_steps / config.env_steps) if config.anneal else 1.0
            for group in optimizer.param_groups:
                group["lr"] = frac * config.learning_rate
            clip = frac * config.clip_coef if config.anneal else config.clip_coef

            # 1. Rollout: every agent of every game acts with the shared policy.
            storage.collect(learner, rows)  # type: ignore[arg-type]  # CentralCriticActorCritic: ActorCritic's interface
            game_steps += config.num_steps * config.num_envs
            # 2. Minibatch epochs over the living agents' steps.
            batch = storage.batch(storage.rewards, config.gamma, config.gae_lambda)
            agent_steps += batch.obs.shape[0]
            updates += ppo_update(learner, optimizer, batch, clip, config, perm_gen, run.diagnostics)  # type: ignore[arg-type]  # as above

            run.show(game_steps)
            if run.maybe_evaluate(eval_policy, game_steps):
                break
        run.evaluate_final(eval_policy, game_steps)
        final = evals[-1]
        return run.finish(
            eval_policy,
            actor,
            {"policy": actor},
            envs.single_action_space,
            game_steps,
            updates,
            {
                **combat_metrics(final),
                "agent_steps": agent_steps,  # living agents' steps trained on
                "train_episodes": rows.episodes,
                "train_win_rate": rows.wins / max(rows.episodes, 1),
                "eval_curve": curve,
            },
        )
    finally:
        run.close()
        envs.close()
