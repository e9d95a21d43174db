"""Combat: ma-gym's 2-team grid battle (the reference text's IPPO task), as PettingZoo and batched numpy.

ma-gym (where Combat lives) needs gym <= 0.20, so this is a rewrite of its rules:

- a ``grid`` x ``grid`` board (15); every unit starts with 3 hp; the learning team has
  ``team_size`` agents, the scripted bots ``n_opponents`` units;
- actions ``Discrete(5 + n_opponents)``: 0 down, 1 left, 2 up, 3 right, 4 no-op, ``5 + j``
  attack opponent ``j``; an attack hits when the attacker is ready and the target is alive
  within the attacker's 3x3 neighbourhood, and costs the target 1 hp (the attacker gets +1
  reward, the hit agent -1); a unit that fired cannot fire on the next step (cooldown);
- both teams' attacks resolve on the pre-step state (within a team in index order, as ma-gym:
  a second shot at a unit just killed misses), then the survivors move in index order
  (agents first) into free cells of the board;
- bots share vision (a 5x5 window around each living bot): each attacks the nearest
  visible agent (Manhattan distance, lowest index on ties) when it is in range and the bot
  is ready, else steps toward it (a random one of the distance-reducing moves), else acts
  uniformly at random among the 5 non-attack actions;
- each agent observes a 5x5 window around itself x 6 channels (team +1 own / -1 opponent,
  id within its team, hp, cooldown +1 ready / -1 cooling, row / grid, column / grid),
  channel-major as ma-gym's ``(6, 5, 5).flatten()``; a dead agent observes zeros;
- each team starts in a 4x4 patch ``[c - 2, c + 2)^2`` around a random centre
  ``c`` in ``[2, grid - 3)^2`` (the bots' centre is redrawn while it is an agent's cell);
- an episode is terminated when a team is wiped out and truncated at ``max_steps`` (100);
  ``win`` means every bot died while an agent lives.

Departures from ma-gym: a dead bot no longer lends its vision to the others. The text's
variant (``cooldown=False, win_reward=100, step_reward=-0.1``) fires every step and adds
+100 on a winning step and -0.1 on every other step to each agent's reward.

All randomness comes from the env's ``np_random``. :class:`CombatVectorEnv` steps N games
as numpy arrays (next-step autoreset, like the Gymnasium vector envs); :class:`CombatEnv`
is the PettingZoo ``ParallelEnv`` over one game of the same engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding
from pettingzoo import ParallelEnv

from rlpipe.errors import RlpipeError

N_MOVES = 5  # down, left, up, right, no-op
NOOP = 4
MOVE_DELTAS = np.array([[1, 0], [0, -1], [-1, 0], [0, 1], [0, 0]], np.int64)
VIEW = 5  # observation window side (and the bots' vision)
CHANNELS = 6
INIT_HP = 3


@dataclass(frozen=True)
class CombatRules:
    """Board and rule options (defaults: the reference text's 2 vs 2 on a 15x15 grid, under ma-gym's
    Combat rules with cooldown; ma-gym's own default is 5 vs 5)."""

    team_size: int = 2
    n_opponents: int = 2
    grid: int = 15
    max_steps: int = 100
    cooldown: bool = True
    win_reward: float = 0.0  # added to every agent's reward on the step the team wins
    step_reward: float = 0.0  # added to every agent's reward on every other step

    def __post_init__(self) -> None:
        if self.team_size < 1 or self.n_opponents < 1:
            raise RlpipeError(f"Combat needs at least one unit per team, got {self.team_size} vs {self.n_opponents}")
        if self.grid < 6:
            raise RlpipeError(f"Combat needs a grid of at least 6x6, got {self.grid}")
        if self.team_size + self.n_opponents > 16:
            raise RlpipeError("Combat teams start in 4x4 patches: team_size + n_opponents must be <= 16")
        if self.max_steps < 1:
            raise RlpipeError(f"Combat needs max_steps >= 1, got {self.max_steps}")

    @property
    def n_actions(self) -> int:
        return N_MOVES + self.n_opponents

    @property
    def obs_dim(self) -> int:
        return CHANNELS * VIEW * VIEW

    def observation_space(self) -> spaces.Box:
        low = np.repeat(np.array([-1, 0, 0, -1, 0, 0], np.float32), VIEW * VIEW)
        top_id = max(self.team_size, self.n_opponents) - 1
        high = np.repeat(np.array([1, top_id, INIT_HP, 1, 1, 1], np.float32), VIEW * VIEW)
        return spaces.Box(low, high, dtype=np.float32)

    def action_space(self) -> spaces.Discrete:
        return spaces.Discrete(self.n_actions)


class CombatGames:
    """The rules over a batch of N games: positions, hp and cooldowns as [N, units] arrays.

    Units ``0 .. team_size - 1`` are the agents, the rest the bots. ``rng`` is the owning
    env's ``np_random`` (every random draw of the rules goes through it).
    """

    def __init__(self, rules: CombatRules, n: int) -> None:
        self.rules, self.n = rules, n
        units = rules.team_size + rules.n_opponents
        self.pos = np.zeros((n, units, 2), np.int64)
        self.hp = np.zeros((n, units), np.int64)
        self.cooling = np.zeros((n, units), bool)
        self.steps = np.zeros(n, np.int64)
        self.team = np.r_[np.ones(rules.team_size), -np.ones(rules.n_opponents)].astype(np.float32)
        self.unit_id = np.r_[np.arange(rules.team_size), np.arange(rules.n_opponents)].astype(np.float32)

    @property
    def agents(self) -> slice:
        return slice(0, self.rules.team_size)

    @property
    def bots(self) -> slice:
        return slice(self.rules.team_size, None)

    def reset(self, games: np.ndarray, rng: np.random.Generator) -> None:
        """Start new episodes in the games selected by the boolean mask ``games``."""
        idx = np.flatnonzero(games)
        if idx.size == 0:
            return
        r, k = self.rules, idx.size
        patch = np.stack(np.meshgrid(np.arange(-2, 2), np.arange(-2, 2), indexing="ij"), -1).reshape(16, 2)
        centre = rng.integers(2, r.grid - 3, size=(k, 2))
        # Distinct cells of the patch, uniformly: the first team_size cells of a random order.
        order = np.argsort(rng.random((k, 16)), axis=1)
        agents = centre[:, None] + patch[order[:, : r.team_size]]
        bot_centre = rng.integers(2, r.grid - 3, size=(k, 2))
        while (taken := (bot_centre[:, None] == agents).all(-1).any(-1)).any():
            bot_centre[taken] = rng.integers(2, r.grid - 3, size=(int(taken.sum()), 2))
        cells = bot_centre[:, None] + patch  # [k, 16, 2]
        free = ~(cells[:, :, None] == agents[:, None]).all(-1).any(-1)
        order = np.argsort(np.where(free, rng.random((k, 16)), np.inf), axis=1)
        bots = np.take_along_axis(cells, order[:, : r.n_opponents, None], axis=1)
        self.pos[idx] = np.concatenate([agents, bots], axis=1)
        self.hp[idx] = INIT_HP
        self.cooling[idx] = False
        self.steps[idx] = 0

    def observe(self) -> np.ndarray:
        """Each agent's 5x5x6 window, flattened channel-major: [N, team_size, 150] float32."""
        r = self.rules
        alive = self.hp > 0
        feat = np.stack(
            np.broadcast_arrays(
                self.team, self.unit_id, self.hp, np.where(self.cooling, -1.0, 1.0), self.pos[..., 0] / r.grid, self.pos[..., 1] / r.grid
            ),
            axis=-1,
        ).astype(np.float32)  # [N, U, 6]
        rel = self.pos[:, None, :, :] - self.pos[:, self.agents, None, :] + VIEW // 2  # [N, A, U, 2]
        seen = ((rel >= 0) & (rel < VIEW)).all(-1) & alive[:, None, :] & alive[:, self.agents, None]
        g, a, u = np.nonzero(seen)
        obs = np.zeros((self.n, r.team_size, CHANNELS, VIEW, VIEW), np.float32)
        obs[g, a, :, rel[g, a, u, 0], rel[g, a, u, 1]] = feat[g, u]
        return obs.reshape(self.n, r.team_size, -1)

    def bot_actions(self, rng: np.random.Generator) -> np.ndarray:
        """The scripted bots' actions from the current state: [N, n_opponents]."""
        alive = self.hp > 0
        a_pos, b_pos = self.pos[:, self.agents], self.pos[:, self.bots]
        diff = a_pos[:, None, :, :] - b_pos[:, :, None, :]  # [N, B, A, 2]: bot -> agent
        chebyshev, manhattan = np.abs(diff).max(-1), np.abs(diff).sum(-1)
        in_view = (chebyshev <= VIEW // 2) & alive[:, self.bots, None]
        visible = in_view.any(1) & alive[:, self.agents]  # shared vision: [N, A]
        dist = np.where(visible[:, None, :], manhattan, np.iinfo(np.int64).max)
        target = dist.argmin(-1)  # nearest visible agent (lowest index on ties), [N, B]
        has_target = visible.any(-1)[:, None]
        to_target = np.take_along_axis(diff, target[..., None, None], axis=2)[:, :, 0]  # [N, B, 2]
        in_range = np.take_along_axis(chebyshev, target[..., None], axis=2)[..., 0] <= 1
        fire = has_target & in_range & ~self.cooling[:, self.bots]
        vertical = np.where(to_target[..., 0] > 0, 0, 2)  # down / up
        horizontal = np.where(to_target[..., 1] > 0, 3, 1)  # right / left
        coin = rng.random(target.shape) < 0.5
        approach = np.where(
            to_target[..., 0] == 0, horizontal, np.where(to_target[..., 1] == 0, vertical, np.where(coin, vertical, horizontal))
        )
        wander = rng.integers(0, N_MOVES, size=target.shape)
        act = np.where(fire, N_MOVES + target, np.where(has_target, approach, wander))
        return np.where(alive[:, self.bots], act, NOOP)

    def _attacks(self, attackers: slice, targets: slice, actions: np.ndarray, hp_after: np.ndarray) -> np.ndarray:
        """Resolve one team's attacks on the pre-step state, lowering ``hp_after`` of the
        targets in place; returns the [N, attackers] mask of hits."""
        first_target = range(self.hp.shape[1])[targets].start
        hits = np.zeros(actions.shape, bool)
        rows = np.arange(self.n)
        for i in range(actions.shape[1]):
            unit = range(self.hp.shape[1])[attackers][i]
            aim = np.clip(actions[:, i] - N_MOVES, 0, None) + first_target
            near = np.abs(self.pos[rows, aim] - self.pos[:, unit]).max(-1) <= 1
            hit = (actions[:, i] >= N_MOVES) & (self.hp[:, unit] > 0) & ~self.cooling[:, unit] & near & (hp_after[rows, aim] > 0)
            hp_after[rows[hit], aim[hit]] -= 1
            hits[:, i] = hit
        return hits

    def _move(self, unit: int, action: np.ndarray) -> None:
        """Move ``unit`` by ``action`` where it lives, moves, and the cell is on the board and free."""
        nxt = self.pos[:, unit] + MOVE_DELTAS[np.minimum(action, NOOP)]
        on_board = ((nxt >= 0) & (nxt < self.rules.grid)).all(-1)
        occupied = ((self.pos == nxt[:, None]).all(-1) & (self.hp > 0)).any(-1)
        go = (action < NOOP) & (self.hp[:, unit] > 0) & on_board & ~occupied
        self.pos[go, unit] = nxt[go]

    def step(self, actions: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Advance every game by one step with the agents' ``actions`` [N, team_size].

        Returns (rewards [N, team_size], terminated [N], truncated [N], win [N]).
        """
        r = self.rules
        bot_actions = self.bot_actions(rng)
        hp_after = self.hp.copy()
        agent_hits = self._attacks(self.agents, self.bots, actions, hp_after)
        bot_hits = self._attacks(self.bots, self.agents, bot_actions, hp_after)
        was_hit = self.hp[:, self.agents] - hp_after[:, self.agents]
        fired = np.concatenate([agent_hits, bot_hits], axis=1)
        self.cooling = fired & r.cooldown  # cooling lasts exactly the step after a shot
        self.hp = hp_after
        for unit, action in enumerate(np.concatenate([actions, bot_actions], axis=1).T):
            self._move(unit, action)
        self.steps += 1
        agents_alive, bots_alive = (self.hp[:, self.agents] > 0).any(-1), (self.hp[:, self.bots] > 0).any(-1)
        terminated = ~agents_alive | ~bots_alive
        truncated = ~terminated & (self.steps >= r.max_steps)
        win = agents_alive & ~bots_alive
        rewards = agent_hits.astype(np.float32) - was_hit + np.where(win, r.win_reward, r.step_reward)[:, None]
        # `.any(-1)` over [N, team_size] arrays gives arrays (numpy types it as a scalar too)
        return rewards.astype(np.float32), cast(np.ndarray, terminated), truncated, cast(np.ndarray, win)


class CombatVectorEnv:
    """N Combat games stepped as numpy arrays, next-step autoreset.

    ``step(actions [N, team_size])`` returns (obs [N, team_size, 150], rewards [N, team_size],
    terminated [N], truncated [N], info) with ``info["win"]`` [N] and ``info["alive"]``
    [N, team_size] (agents alive in the returned state; only living agents' actions matter). After an
    episode ends, the next ``step`` starts a new one in that game (its actions are ignored,
    rewards 0, ``info["valid"]`` False) and returns its first observation.
    """

    def __init__(self, num_envs: int = 1, **rules: Any) -> None:
        self.num_envs = num_envs
        self.rules = CombatRules(**rules)
        self.single_observation_space = self.rules.observation_space()
        self.single_action_space = self.rules.action_space()
        self.games = CombatGames(self.rules, num_envs)
        self.np_random, _ = seeding.np_random(None)
        self._prev_done = np.zeros(num_envs, bool)

    def reset(self, *, seed: int | None = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        if seed is not None:
            self.np_random, _ = seeding.np_random(seed)
        self.games.reset(np.ones(self.num_envs, bool), self.np_random)
        self._prev_done[:] = False
        return self.games.observe(), {"alive": self.games.hp[:, self.games.agents] > 0}

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        actions = np.asarray(actions, np.int64).reshape(self.num_envs, self.rules.team_size)
        if ((actions < 0) | (actions >= self.rules.n_actions)).any():
            raise RlpipeError(f"Combat actions must be in [0, {self.rules.n_actions}), got {actions.min()}..{actions.max()}")
        reset = self._prev_done.copy()
        rewards, terminated, truncated, win = self.games.step(actions, self.np_random)
        self.games.reset(reset, self.np_random)
        rewards[reset] = 0.0
        terminated &= ~reset
        truncated &= ~reset
        win &= ~reset
        self._prev_done = terminated | truncated
        info = {"win": win, "alive": self.games.hp[:, self.games.agents] > 0, "valid": ~reset}
        return self.games.observe(), rewards, terminated, truncated, info

    def close(self) -> None:
        pass


class CombatEnv(ParallelEnv):
    """PettingZoo Parallel API over one Combat game; agents ``agent_0 .. agent_{team_size-1}``.

    Every agent stays in ``agents`` until the episode ends (a dead agent observes zeros and
    its actions are ignored, as in ma-gym); ``infos[agent]["win"]`` says whether the team won.
    """

    metadata = {"name": "combat_v0", "render_modes": [], "is_parallelizable": True}

    def __init__(self, render_mode: str | None = None, **rules: Any) -> None:
        self.render_mode = render_mode
        self.rules = CombatRules(**rules)
        self.possible_agents = [f"agent_{i}" for i in range(self.rules.team_size)]
        self.agents: list[str] = []
        self._obs_space, self._act_space = self.rules.observation_space(), self.rules.action_space()
        self.games = CombatGames(self.rules, 1)
        self.np_random, _ = seeding.np_random(None)

    def observation_space(self, agent: str) -> spaces.Box:
        return self._obs_space

    def action_space(self, agent: str) -> spaces.Discrete:
        return self._act_space

    def _obs_dict(self) -> dict[str, np.ndarray]:
        obs = self.games.observe()[0]
        return {agent: obs[i] for i, agent in enumerate(self.possible_agents)}

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict[str, np.ndarray], dict[str, dict]]:
        if seed is not None:
            self.np_random, _ = seeding.np_random(seed)
        self.games.reset(np.ones(1, bool), self.np_random)
        self.agents = list(self.possible_agents)
        return self._obs_dict(), {agent: {} for agent in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        unknown = sorted(set(actions) - set(self.agents))
        if unknown:
            raise RlpipeError(f"unknown agent(s) {', '.join(unknown)}; this Combat game has {', '.join(self.agents) or 'no live episode'}")
        batch = np.full((1, self.rules.team_size), NOOP, np.int64)
        for i, agent in enumerate(self.possible_agents):
            if agent in actions:
                if not self._act_space.contains(np.int64(actions[agent])):
                    raise RlpipeError(f"action {actions[agent]!r} of {agent} is outside {self._act_space}")
                batch[0, i] = int(actions[agent])
        rewards, terminated, truncated, win = self.games.step(batch, self.np_random)
        obs = self._obs_dict()
        names = self.agents
        result = (
            obs,
            {a: float(rewards[0, i]) for i, a in enumerate(names)},
            {a: bool(terminated[0]) for a in names},
            {a: bool(truncated[0]) for a in names},
            {a: {"win": bool(win[0])} for a in names},
        )
        if terminated[0] or truncated[0]:
            self.agents = []
        return result

    def close(self) -> None:
        pass


def parallel_env(**kwargs: Any) -> CombatEnv:
    """PettingZoo-style constructor (``combat.parallel_env(team_size=2)``)."""
    return CombatEnv(**kwargs)
