"""A probabilistic dynamics ensemble (PETS, MBPO, MOPO): E Gaussian MLPs that map
(observation, action) to a Gaussian over (Δobservation, reward), evaluated as one batched
computation over members, and its fitting with a holdout split and early stopping.

As in the reference implementations (jannerm/mbpo's ``bnn.py``, mbrl-lib's
``one_dim_tr_model.py``), inputs are normalised with the training data's mean and std (kept
as buffers, so a checkpoint carries them) and targets are fitted raw; each member predicts a
mean and a log-variance that is softly bounded between two learned limits (Chua et al.
2018, appendix A.1), and the weights (not biases or limits) carry a per-layer L2 penalty.
One departure, measured: the limits are learned relative to each target's variance in the
data (the references start them at -10 and 0.5 in data units). On InvertedPendulum, whose
Δobs are ~0.01, a lower limit of -10 is a noise floor (std 0.0067) four times the fitted
error, and the sampled model terminated wrongly twice as often as its mean.
Members whose holdout error is lowest are the *elites* that planning and model rollouts use.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from rlpipe.nets.networks import EnsembleLinear, init_spec

Layers = list[tuple[torch.Tensor, torch.Tensor]]
"""(weight [K, in, out], bias [K, 1, out]) per layer, for K chosen members."""

# jannerm/mbpo's L2 coefficients on the hidden layers' weights (deeper layers: the last of
# these) and on the output layer's.
HIDDEN_WEIGHT_DECAY = (2.5e-5, 5e-5, 7.5e-5)
OUTPUT_WEIGHT_DECAY = 1e-4


class GaussianEnsemble(nn.Module):
    """E Gaussian MLPs over ``concat(obs, action) -> (Δobs, reward)`` with Swish (SiLU) hidden
    units; every layer is one ``baddbmm`` over members ([E, N, in] -> [E, N, out])."""

    kind = "gaussian-ensemble"
    in_mean: torch.Tensor  # buffers (register_buffer)
    in_std: torch.Tensor
    target_logvar: torch.Tensor
    elites: torch.Tensor

    def __init__(
        self, obs_dim: int, act_dim: int, members: int = 5, hidden: Sequence[int] = (200, 200, 200, 200), elites: int | None = None
    ) -> None:
        super().__init__()
        self.obs_dim, self.act_dim, self.members = obs_dim, act_dim, members
        self.num_elites = members if elites is None else elites
        if not 1 <= self.num_elites <= members:
            raise ValueError(f"elites must be between 1 and members ({members}), got {elites}")
        self.spec = init_spec(GaussianEnsemble.__init__, {**locals(), "elites": self.num_elites})  # the elites, resolved
        in_dim, self.out_dim = obs_dim + act_dim, obs_dim + 1
        dims = [in_dim, *hidden, 2 * self.out_dim]
        self.layers = nn.ModuleList(EnsembleLinear(members, a, b) for a, b in zip(dims[:-1], dims[1:]))
        # Soft log-variance limits, learned (pushed apart only by the data, see fit_ensemble).
        self.max_logvar = nn.Parameter(torch.full((self.out_dim,), 0.5))
        self.min_logvar = nn.Parameter(torch.full((self.out_dim,), -10.0))
        self.register_buffer("in_mean", torch.zeros(in_dim))
        self.register_buffer("in_std", torch.ones(in_dim))
        self.register_buffer("target_logvar", torch.zeros(self.out_dim))
        self.register_buffer("elites", torch.arange(self.num_elites))
        hidden_decay = [HIDDEN_WEIGHT_DECAY[min(i, len(HIDDEN_WEIGHT_DECAY) - 1)] for i in range(len(hidden))]
        self.weight_decay = [*hidden_decay, OUTPUT_WEIGHT_DECAY]

    def set_normalizer(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        """Normalise inputs with these inputs' mean and std (constant columns: std 1), and
        set the targets' log-variance that the log-variance limits are relative to."""
        std = inputs.std(0)
        self.in_mean.copy_(inputs.mean(0)), self.in_std.copy_(torch.where(std < 1e-6, torch.ones_like(std), std))
        self.target_logvar.copy_(targets.var(0).clamp_min(1e-12).log())

    def weight_penalty(self) -> torch.Tensor:
        """The L2 penalty of the fit: sum over layers of decay * ||weight||^2 / 2, every member."""
        layers = cast("list[EnsembleLinear]", self.layers)
        return sum(decay * 0.5 * layer.weight.square().sum() for decay, layer in zip(self.weight_decay, layers))  # type: ignore[return-value]

    def member_layers(self, members: torch.Tensor | None = None) -> Layers:
        """The layers' parameters of ``members`` (None: all), with the input normalisation
        folded into the first layer, so they map raw ``concat(obs, action)``: one op per
        layer on the planner's path instead of a separate subtract and divide per step."""
        linear = cast("list[EnsembleLinear]", self.layers)
        layers = [(layer.weight, layer.bias) if members is None else (layer.weight[members], layer.bias[members]) for layer in linear]
        weight, bias = layers[0]
        scaled = weight / self.in_std[:, None]
        layers[0] = (scaled, bias - (self.in_mean @ scaled).unsqueeze(1))
        return layers

    def _mlp(self, x: torch.Tensor, layers: Layers) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs [K, N, in] -> mean and bounded log-variance [K, N, out]."""
        last = len(layers) - 1
        for i, (weight, bias) in enumerate(layers):
            x = torch.baddbmm(bias, x, weight)
            if i < last:
                # In place only without autograd: SiLU's backward needs its input.
                x = F.silu(x, inplace=not torch.is_grad_enabled())
        mean, logvar = x.split(self.out_dim, dim=-1)
        logvar = self.max_logvar - F.softplus(self.max_logvar - logvar)
        return mean, self.target_logvar + self.min_logvar + F.softplus(logvar - self.min_logvar)

    def normalized(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalised inputs [E, N, in] -> mean and bounded log-variance [E, N, out] of every
        member (what the fit trains)."""
        return self._mlp(x, [(layer.weight, layer.bias) for layer in cast("list[EnsembleLinear]", self.layers)])

    def forward(self, obs: torch.Tensor, actions: torch.Tensor, layers: Layers | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and std of (Δobs, reward) in data units, [K, N, obs_dim + 1], for inputs
        [K, N, .] (one batch per member) or [N, .] (the same batch for every member);
        ``layers`` from :meth:`member_layers` (default: all E members)."""
        layers = self.member_layers() if layers is None else layers
        x = torch.cat([obs, actions], dim=-1)
        if x.dim() == 2:
            x = x.unsqueeze(0).expand(layers[0][0].shape[0], -1, -1)
        mean, logvar = self._mlp(x, layers)
        return mean, (0.5 * logvar).exp()

    def sample(
        self, obs: torch.Tensor, actions: torch.Tensor, layers: Layers | None = None, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One draw of (next observation, reward) per row: [K, N, obs_dim] and [K, N]."""
        mean, std = self(obs, actions, layers)
        draw = mean + std * torch.randn(mean.shape, generator=generator, device=mean.device)
        return obs + draw[..., :-1], draw[..., -1]


@dataclass(frozen=True)
class FitReport:
    """How a fit went: epochs and gradient updates run, the elites' holdout MSE per output
    (Δobs dims, then reward; data units) and its mean, and the wall time."""

    epochs: int
    updates: int
    holdout_mse: list[float]
    holdout_loss: float
    seconds: float


def transitions_to_xy(
    obs: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor, next_obs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Training pairs: inputs concat(obs, action), targets concat(next_obs - obs, reward)."""
    return torch.cat([obs, actions], -1), torch.cat([next_obs - obs, rewards.reshape(-1, 1)], -1)


def _holdout_mse(model: GaussianEnsemble, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per member and output, the holdout MSE of the mean in data units: [E, out]."""
    with torch.no_grad():
        mean, _ = model.normalized(((x - model.in_mean) / model.in_std).expand(model.members, -1, -1))
        return (mean - y).square().mean(1)


def fit_ensemble(
    model: GaussianEnsemble,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    *,
    holdout_fraction: float = 0.2,
    max_holdout: int = 5000,
    batch_size: int = 256,
    max_epochs: float | None = None,
    patience: int = 5,
    max_updates: float | None = None,
    scored_outputs: slice = slice(None),
    generator: torch.Generator | None = None,
) -> FitReport:
    """Fit ``model`` to ``inputs -> targets`` (see :func:`transitions_to_xy`) by Gaussian
    negative log-likelihood plus the model's weight penalty; refit the input normaliser first.

    A random ``holdout_fraction`` (at most ``max_holdout`` rows) is held out. Each member
    trains on its own bootstrap of the rest, drawn once per fit (as PETS and mbrl-lib: the
    members' disagreement, which trajectory sampling and MOPO's penalty use, comes from
    it) and visited in a new order each epoch. A member's score is its holdout MSE
    averaged over ``scored_outputs`` (the outputs its user reads: Δobs only when the env's
    known reward replaces the model's). An epoch that improves no member's score by 1%
    counts towards ``patience``; each member ends at its best epoch, and the
    ``model.num_elites`` members with the lowest score become the elites. As in the
    references the fit runs to early stopping; ``max_epochs`` and ``max_updates`` cap it
    (None: no cap).
    """
    start = time.perf_counter()
    n = len(inputs)
    perm = torch.randperm(n, generator=generator, device=inputs.device)
    n_hold = min(max_holdout, int(n * holdout_fraction)) if n >= 10 else 0
    hold, train = perm[:n_hold], perm[n_hold:]
    x_hold, y_hold = (inputs[hold], targets[hold]) if n_hold else (inputs[train], targets[train])
    model.set_normalizer(inputs[train], targets[train])
    x, y = (inputs[train] - model.in_mean) / model.in_std, targets[train]
    members, n_train = model.members, len(train)
    score = lambda: _holdout_mse(model, x_hold, y_hold)[:, scored_outputs].mean(1)  # noqa: E731
    best = score()
    best_state = {k: v.clone() for k, v in model.state_dict().items()}
    epochs, stale, updates = 0, 0, 0
    max_epochs = max_epochs if max_epochs is not None else float("inf")
    max_updates = max_updates if max_updates is not None else float("inf")
    boot = torch.randint(0, n_train, (members, n_train), generator=generator, device=x.device)
    while epochs < max_epochs and stale < patience and updates < max_updates:
        order = boot[:, torch.randperm(n_train, generator=generator, device=x.device)]
        for rows in order.split(batch_size, dim=1):
            if updates >= max_updates:
                break
            mean, logvar = model.normalized(x[rows])
            nll = ((mean - y[rows]).square() * (-logvar).exp() + logvar).mean((1, 2)).sum()
            loss = nll + 0.01 * (model.max_logvar.sum() - model.min_logvar.sum()) + model.weight_penalty()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            updates += 1
        epochs += 1
        current = score()
        improved = (best - current) / best.clamp_min(1e-12) > 0.01
        stale = 0 if improved.any() else stale + 1
        if improved.any():
            _keep_members(best_state, model.state_dict(), improved)
            best = torch.where(improved, current, best)
    model.load_state_dict(best_state)
    model.elites.copy_(score().argsort()[: model.num_elites].sort().values)
    elite_mse = _holdout_mse(model, x_hold, y_hold)[model.elites].mean(0)
    return FitReport(epochs, updates, [float(v) for v in elite_mse], float(elite_mse.mean()), time.perf_counter() - start)


def _keep_members(best: dict[str, torch.Tensor], current: dict[str, torch.Tensor], members: torch.Tensor) -> None:
    """Copy ``members``' slices of the per-member tensors (leading dim E) into ``best``;
    shared tensors (log-variance limits, normaliser) follow the latest epoch."""
    for key, value in current.items():
        if key.startswith("layers."):
            best[key][members] = value[members]
        elif key != "elites":
            best[key].copy_(value)
