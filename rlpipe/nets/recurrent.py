"""Recurrent policies for partially observed envs: an LSTM or GRU core, whose hidden state
carries what one observation does not show (CartPole's velocities), then MLP heads.

Sequences are batch-first ``[B, T, obs_dim]``. A policy's hidden state is one tensor,
``[B, n, hidden_size]``: its cores' states one after the other (2 rows for an LSTM's
``(h, c)``, 1 for a GRU's h), so it is indexed, stored and exported like any other batch. ``starts`` ``[B, T]`` (bool) marks the steps whose
observation begins an episode: the state is zeroed before them, as RecurrentPPO
(SB3-contrib) and CleanRL's ``ppo_atari_lstm.py`` do. A policy acts one step at a time with
``step(obs, state, deterministic) -> (action, state)``; the caller zeroes the state of rows
that start an episode (:meth:`RecurrentPolicy.initial_state` gives the zero state).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, cast

import torch
from torch import nn

from rlpipe.nets.networks import ActorCritic, ObsNormalizer, init_spec, mlp, register_policy_class

Cell = Literal["lstm", "gru"]
CELLS: tuple[Cell, ...] = ("lstm", "gru")


class RecurrentCore(nn.Module):
    """An LSTM or GRU of ``hidden_size`` units: ``[B, T, in_dim]`` -> ``[B, T, hidden_size]``."""

    def __init__(self, in_dim: int, cell: Cell, hidden_size: int) -> None:
        super().__init__()
        if cell not in CELLS:
            raise ValueError(f"unknown recurrent cell {cell!r}; choose from {list(CELLS)}")
        self.rnn = (nn.LSTM if cell == "lstm" else nn.GRU)(in_dim, hidden_size, batch_first=True)
        for name, param in self.rnn.named_parameters():  # CleanRL's LSTM init
            if name.startswith("weight"):
                nn.init.orthogonal_(param, 1.0)
            else:
                nn.init.zeros_(param)
        self.parts = 2 if cell == "lstm" else 1
        self.hidden_size = hidden_size

    def initial_state(self, batch: int, device: torch.device | str) -> torch.Tensor:
        """The zero state of ``batch`` rows, ``[batch, n, hidden_size]``."""
        return torch.zeros(batch, self.parts, self.hidden_size, device=device)

    def _run(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        parts = state.transpose(0, 1).contiguous()  # [n, B, H]: one layer's (h, c) or h
        out, new = self.rnn(x, (parts[0:1], parts[1:2]) if self.parts == 2 else parts)
        new = torch.cat(new, 0) if self.parts == 2 else new
        return out, new.transpose(0, 1)

    def forward(self, x: torch.Tensor, state: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Features ``[B, T, hidden_size]`` and the state after the last step, the state zeroed
        before each step flagged in ``starts``. The core runs over the stretches between the
        steps where some row starts an episode, one call each (the whole sequence when only the
        first step may reset), rather than step by step."""
        keep = (~starts).to(x.dtype)[..., None, None]  # [B, T, 1, 1]
        # One step (acting) has no cut inside it; skipping the data-dependent search keeps the
        # graph static, which torch.export's saved programs need.
        inner = [] if x.shape[1] == 1 else (starts[:, 1:].any(0).nonzero().flatten() + 1).tolist()
        cuts = [0, *inner, x.shape[1]]
        outs = []
        for begin, end in zip(cuts[:-1], cuts[1:]):
            out, state = self._run(x[:, begin:end], state * keep[:, begin])
            outs.append(out)
        return torch.cat(outs, 1), state


class RecurrentPolicy(nn.Module):
    """What recurrent actors share: their ``cores`` (each with its slice of the state) and
    the one-step acting interface."""

    cores: nn.ModuleList  # of RecurrentCore

    def _cores(self) -> list[RecurrentCore]:
        return cast(list[RecurrentCore], list(self.cores))

    def initial_state(self, batch: int) -> torch.Tensor:
        """The zero state of ``batch`` rows (on the module's device)."""
        device = next(self.parameters()).device
        return torch.cat([core.initial_state(batch, device) for core in self._cores()], 1)

    def run_cores(self, obs: torch.Tensor, state: torch.Tensor, starts: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Each core's features ``[B, T, hidden_size]`` and the state after the last step."""
        features, states, at = [], [], 0
        for core in self._cores():
            out, part = core(obs, state[:, at : at + core.parts], starts)
            features.append(out)
            states.append(part)
            at += core.parts
        return features, torch.cat(states, 1)

    def step(self, obs: torch.Tensor, state: torch.Tensor, deterministic: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """One step: observations ``[B, obs_dim]`` and states -> actions ``[B, ...]`` and the next states."""
        raise NotImplementedError


def _no_start(obs: torch.Tensor) -> torch.Tensor:
    return torch.zeros(obs.shape[0], 1, dtype=torch.bool, device=obs.device)


@register_policy_class
class RecurrentActorCritic(RecurrentPolicy):
    """Recurrent PPO's policy: a core before the policy's MLP head and another before the
    value's (SB3-contrib's RecurrentPPO default; state ``[B, 2n, hidden_size]``). The heads are
    an :class:`ActorCritic` whose two members read their own core's features, so sampling,
    log-probabilities and entropies are the feedforward policy's."""

    kind = "recurrent_actor_critic"

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        discrete: bool,
        cell: Cell = "lstm",
        hidden_size: int = 64,
        hidden: Sequence[int] = (64,),
        activation: str = "tanh",
        normalize_obs: bool = False,
        init_log_std: float = 0.0,
    ) -> None:
        super().__init__()
        self.spec = init_spec(RecurrentActorCritic.__init__, locals())
        self.discrete = discrete
        self.obs_norm = ObsNormalizer(obs_dim) if normalize_obs else nn.Identity()
        self.cores = nn.ModuleList(RecurrentCore(obs_dim, cell, hidden_size) for _ in ("policy", "value"))
        self.heads = ActorCritic(hidden_size, act_dim, discrete, hidden, activation, init_log_std=init_log_std)

    def forward(self, obs: torch.Tensor, state: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(policy head ``[B, T, act_dim]``, value ``[B, T]``, state after the last step)."""
        features, state = self.run_cores(self.obs_norm(obs), state, starts)
        head, value = self.heads(torch.stack(features).flatten(1, 2))  # [2, B * T, H]: a member per core
        return head.unflatten(0, obs.shape[:2]), value.unflatten(0, obs.shape[:2]), state

    def sample(self, head: torch.Tensor) -> torch.Tensor:
        return self.heads.sample(head)

    def log_prob_entropy(self, head: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.heads.log_prob_entropy(head, action)

    @torch.no_grad()
    def step(self, obs: torch.Tensor, state: torch.Tensor, deterministic: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        head, _, state = self(obs[:, None], state, _no_start(obs))
        head = head[:, 0]
        if deterministic:
            return (head.argmax(-1) if self.discrete else head), state
        return self.sample(head), state


@register_policy_class
class RecurrentCategoricalActor(RecurrentPolicy):
    """Recurrent BC's policy over ``n_actions`` discrete actions: a core, then an MLP to logits."""

    kind = "recurrent_categorical"

    def __init__(
        self,
        obs_dim: int,
        n_actions: int,
        cell: Cell = "lstm",
        hidden_size: int = 64,
        hidden: Sequence[int] = (64,),
        activation: str = "relu",
    ) -> None:
        super().__init__()
        self.spec = init_spec(RecurrentCategoricalActor.__init__, locals())
        self.cores = nn.ModuleList([RecurrentCore(obs_dim, cell, hidden_size)])
        self.head = mlp(hidden_size, n_actions, hidden, activation, out_gain=0.01, orthogonal=True)

    def forward(self, obs: torch.Tensor, state: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits ``[B, T, n_actions]``, state after the last step)."""
        features, state = self.run_cores(obs, state, starts)
        return self.head(features[0]), state

    @torch.no_grad()
    def step(self, obs: torch.Tensor, state: torch.Tensor, deterministic: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        logits, state = self(obs[:, None], state, _no_start(obs))
        if deterministic:
            return logits[:, 0].argmax(-1), state
        return torch.multinomial(logits[:, 0].softmax(-1), 1).squeeze(-1), state
