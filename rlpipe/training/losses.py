"""Losses shared by several algorithms: QR-DQN's quantile Huber loss (online QR-DQN and
discrete CQL on a QR-DQN base)."""

from __future__ import annotations

import torch


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
