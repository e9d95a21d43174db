"""Loss pieces shared by several algorithms: the taken actions' outputs of a Q-network over
discrete actions (DQN, QR-DQN, discrete CQL), QR-DQN's quantile Huber loss (online QR-DQN
and discrete CQL on a QR-DQN base) and the per-row squared TD errors that measure a critic on
held-out data (`rlpipe.training.validation`)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlpipe.training.buffer import Batch

# A value method's squared TD errors of a batch's rows [B] (mean over its critics), against its own target.
TDErrors = Callable[[Batch], torch.Tensor]


def of_actions(values: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Each row's entry for its action: [B, A] -> [B], or [B, A, N] -> [B, N] (``actions``:
    B indices, as [B] or [B, 1])."""
    index = actions.long().view(-1, 1, *([1] * (values.dim() - 2)))
    return values.gather(1, index.expand(-1, 1, *values.shape[2:])).squeeze(1)


def squared_td_errors(q: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Each row's squared TD error [B]: ``(q - target)^2`` for one critic's ``q`` [B], averaged
    over the critics for an ensemble's [N, B]."""
    errors = (q - target).square()
    return errors.mean(0) if errors.dim() > 1 else errors


def quantile_huber_loss(quantiles: torch.Tensor, target: torch.Tensor, kappa: float = 1.0) -> torch.Tensor:
    """QR-DQN's loss (Dabney et al. 2018) of ``quantiles`` [B, N], estimates of the return at
    the midpoint fractions tau_i = (2i + 1) / 2N, against samples of it ``target`` [B, M]
    (no gradient flows into them): for every pair u = target_j - quantile_i,
    |tau_i - 1{u < 0}| * Huber_kappa(u) / kappa, averaged over the targets, summed over the
    quantiles, averaged over the batch."""
    n = quantiles.shape[-1]
    tau = (torch.arange(n, device=quantiles.device, dtype=quantiles.dtype) + 0.5) / n
    u = target.detach().unsqueeze(-2) - quantiles.unsqueeze(-1)  # [B, N, M]
    huber = torch.where(u.abs() <= kappa, 0.5 * u.square(), kappa * (u.abs() - 0.5 * kappa))
    weight = (tau.unsqueeze(-1) - (u < 0).to(u.dtype)).abs()
    return (weight * huber / kappa).mean(-1).sum(-1).mean()
