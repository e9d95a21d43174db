"""EDAC and SAC-N (An et al., 2021): SAC on a fixed dataset with N critics, whose minimum
is pessimistic where the data is thin, and a term that keeps the critics' action gradients
diverse so a small N suffices.

Read top to bottom: config and tuned defaults, the diversity term, the critic loss, the
update (the critics' step, then SAC's actor, temperature and target steps,
:class:`rlpipe.algos.sac.SoftActorCritic`, with ``n_critics`` fused critics: one batched
network, :class:`rlpipe.nets.networks.EnsembleQ`), the networks' build (optionally with the
paper's initialisation), then ``train``: the shared offline loop. The soft target and the
actor both use the minimum over the N critics. With ``eta = 0`` this is SAC-N, the paper's
ensemble without the diversity term (``rlpipe train edac --set eta=0``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlpipe.algos.registry import REGISTRY
from rlpipe.algos.sac import SACFields, SoftActorCritic
from rlpipe.errors import RlpipeError
from rlpipe.nets.networks import EnsembleQ, edac_init_
from rlpipe.training import Batch, OfflineConfig, TrainResult, Update
from rlpipe.training.config import positive
from rlpipe.training.diagnostics import Diagnosed
from rlpipe.training.env import BOX
from rlpipe.training.offline import Learner, load_offline, train_offline

ACTION_SPACES = (BOX,)
SPEC = REGISTRY["edac"]


@dataclass
class Config(SACFields, OfflineConfig):
    updates: int = positive(100_000)
    eval_every: int = positive(5_000)
    n_critics: int = positive(10)  # N (CORL: 10; 50 on Hopper)
    eta: float = 1.0  # weight of the diversity term; 0: SAC-N
    edac_init: bool = False  # the paper's and CORL's: hidden biases 0.1, last layers uniform in +-1e-3 (actor) / +-3e-3 (critics)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.eta < 0:
            raise RlpipeError(f"setting eta={self.eta!r}: expected a number >= 0 (the diversity weight)")
        if self.eta > 0 and self.n_critics < 2:
            raise RlpipeError(f"setting n_critics={self.n_critics!r}: the diversity term (eta > 0) needs at least 2 critics")


TUNED: dict[str, dict[str, Any]] = {
    # Small nets and 1e-3 learning rates as for SAC and CQL: 10 critics at eta 1 (CORL's
    # defaults) settle by 4k updates on the mixed replay (seeds 0-4).
    "Pendulum-v1": dict(updates=6_000, eval_every=1_000, hidden=(64, 64), actor_lr=1e-3, critic_lr=1e-3, alpha_lr=1e-3),
}


def diversity_loss(action_grads: torch.Tensor) -> torch.Tensor:
    """EDAC's ensemble-similarity term, ``1/(N-1) * sum over i != j of cos(g_i, g_j)`` averaged
    over the batch, for the critics' action gradients ``g_i = grad_a Q_i(s, a)`` ([N, B, A]).

    The off-diagonal sum of the Gram matrix of the unit gradients u_i is ``|sum_i u_i|^2 -
    sum_i |u_i|^2``: O(N) per state instead of the N x N matrix, the same value."""
    unit = action_grads / (action_grads.norm(dim=-1, keepdim=True) + 1e-10)
    off_diagonal = unit.sum(0).square().sum(-1) - unit.square().sum((0, -1))
    return off_diagonal.mean() / (action_grads.shape[0] - 1)


def q_and_action_grads(critic: EnsembleQ, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q_i(s, a) of every critic [N, B] and its gradient in the action [N, B, A], from one
    batched pass; the gradients keep their graph, so a loss on them trains the critics."""
    n = critic.n
    actions = actions.expand(n, *actions.shape).detach().requires_grad_()  # each critic its own copy
    q = critic(obs.expand(n, *obs.shape), actions)
    (grads,) = torch.autograd.grad(q.sum(), actions, create_graph=True)
    return q, grads


def critic_loss(config: Config, sac: SoftActorCritic, b: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """The critics' loss on ``b``: the squared soft TD error of each critic (target from the
    min over the N target critics) summed over critics, plus ``eta`` times the diversity
    term; and the diversity term."""
    target = sac.soft_target(b, b.rewards, config.gamma)
    if config.eta == 0:  # SAC-N: no action gradients to compute
        q, diversity = sac.critic(b.obs, b.actions), torch.zeros((), device=b.obs.device)
    else:
        q, grads = q_and_action_grads(sac.critic, b.obs, b.actions)
        diversity = diversity_loss(grads)
    # No 1/2 on the squared error (SAC's has one): eta weighs against CORL's TD loss, as there.
    return (q - target).square().mean(1).sum() + config.eta * diversity, diversity.detach()


def make_update(config: Config, sac: SoftActorCritic) -> tuple[Update, dict[str, torch.Tensor]]:
    """EDAC's update: the critics' step, then SAC's actor, temperature and target-critic
    steps; and the dict where it leaves the latest diversity term."""
    stats: dict[str, torch.Tensor] = {}

    def update(b: Batch, _: int) -> Diagnosed:
        loss, stats["diversity"] = critic_loss(config, sac, b)
        return {**sac.critic_step(loss), **sac.policy_step(b.obs, config.tau), "diversity": stats["diversity"]}

    return update, stats


def build(config: Config, obs_dim: int, act_dim: int, device: torch.device) -> SoftActorCritic:
    """SAC's networks with ``config.n_critics`` fused critics; with ``edac_init`` initialised as
    the paper's, the target critics copied after that."""
    sac = SoftActorCritic.build(config, obs_dim, act_dim, device, n_critics=config.n_critics)
    if config.edac_init:
        edac_init_(sac.actor, 1e-3)  # its last layer holds both heads, mean and log-std
        edac_init_(sac.critic, 3e-3)
        sac.critic_target.load_state_dict(sac.critic.state_dict())
    return sac


def train(config: Config, out_dir: str | Path | None = None, *, progress: bool = True) -> TrainResult:
    """Train EDAC (SAC-N at ``eta = 0``) on ``config.dataset``; with ``out_dir`` also write
    checkpoint, metrics and curve."""
    data = load_offline(SPEC.name, config, ACTION_SPACES)
    sac = build(config, data.obs_dim, data.act_dim, data.device)
    update, stats = make_update(config, sac)

    def extra() -> dict[str, Any]:
        return {"alpha": sac.alpha(), "diversity": float(stats.get("diversity", math.nan))}

    modules = {"policy": sac.actor, "critic": sac.critic, "critic_target": sac.critic_target}
    learner = Learner(modules, update, extra_metrics=extra, td_errors=lambda b: sac.td_errors(b, b.rewards, config.gamma))
    return train_offline(SPEC.name, config, data, learner, out_dir, progress)
