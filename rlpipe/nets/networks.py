"""Neural networks shared by every algorithm: MLPs, policies, value nets and fused Q ensembles.

Every actor exposes ``act(obs, deterministic) -> action`` where continuous actions live in
[-1, 1] (rescaled to the env's bounds in :mod:`rlpipe.training.env`) and discrete actions
are integer indices. Actors are rebuilt from JSON with :func:`build_policy`, so a
checkpoint never needs to pickle Python objects. A policy class that belongs to one
algorithm or env family lives in that module and registers itself with
:func:`register_policy_class`; loading a checkpoint imports the module of the algorithm
that wrote it (:func:`rlpipe.algos.registry.import_algorithm`), so its classes are known.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from types import UnionType
from typing import Any, Literal, TypeVar, Union, cast, get_args, get_origin, get_type_hints

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Categorical, Normal

from rlpipe.errors import RlpipeError

_ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "tanh": nn.Tanh, "elu": nn.ELU}
_INPLACE_ACTIVATIONS = {"relu": torch.relu_, "tanh": torch.tanh_, "elu": F.elu_}
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
_POLICY_CLASSES: dict[str, type[nn.Module]] = {}  # kind -> class; filled by register_policy_class
PolicyClass = TypeVar("PolicyClass", bound=type[nn.Module])


def register_policy_class(cls: PolicyClass) -> PolicyClass:
    """Class decorator: checkpoints whose policy ``kind`` is ``cls.kind`` are rebuilt as ``cls(**spec)``."""
    kind = cls.kind  # type: ignore[attr-defined]  # each policy class declares its kind
    if _POLICY_CLASSES.setdefault(kind, cls) is not cls:
        raise RlpipeError(f"policy kind {kind!r} is registered twice: {_POLICY_CLASSES[kind].__qualname__} and {cls.__qualname__}")
    return cls


def init_spec(init: Callable[..., None], arguments: Mapping[str, Any], only_if_set: Collection[str] = ()) -> dict[str, Any]:
    """A policy's ``spec``, the JSON a checkpoint rebuilds it from (:func:`build_policy`:
    ``cls(**spec)``): the parameters of its ``init`` in their order, valued from ``arguments``
    (``locals()`` in ``init``), sequences as lists. A parameter in ``only_if_set`` is left out
    where it has its default, so that checkpoints written before it existed keep their specs."""
    spec: dict[str, Any] = {}
    for name, parameter in list(inspect.signature(init).parameters.items())[1:]:  # after self
        value = arguments[name]
        if name not in only_if_set or value != parameter.default:
            spec[name] = list(value) if isinstance(value, (list, tuple)) else value
    return spec


def float32_output(layer: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``layer(x)`` in float32 even under bfloat16 autocast (rlpipe.training.optim.autocast): a
    network's outputs (values, logits, actions) keep full precision, so the losses and targets
    built on them do too; the hidden layers' products are where bfloat16 saves time."""
    if torch.is_autocast_enabled(x.device.type):
        with torch.autocast(x.device.type, enabled=False):
            return layer(x.float())
    return layer(x)


class Float32Linear(nn.Linear):
    """An output ``nn.Linear`` that stays float32 under autocast (:func:`float32_output`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return float32_output(super().forward, x)


def mlp(
    in_dim: int,
    out_dim: int,
    hidden: Sequence[int] = (256, 256),
    activation: str = "relu",
    out_gain: float | None = None,
    orthogonal: bool = False,
    layer_norm: bool = False,
) -> nn.Sequential:
    """A plain MLP ``in_dim -> hidden... -> out_dim`` with no output activation.

    ``orthogonal=True`` uses the PPO-style orthogonal init (gain sqrt(2) for hidden layers,
    ``out_gain`` for the last one); otherwise PyTorch's default init is kept and
    ``out_gain`` (if given) only scales the last layer. ``layer_norm=True`` adds a LayerNorm
    after each hidden layer's activation (ReBRAC's placement).
    """
    if activation not in _ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; choose from {sorted(_ACTIVATIONS)}")
    dims = [in_dim, *hidden, out_dim]
    layers: list[nn.Module] = []
    for i, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:])):
        last = i == len(dims) - 2
        layer = Float32Linear(d_in, d_out) if last else nn.Linear(d_in, d_out)
        if orthogonal:
            nn.init.orthogonal_(layer.weight, out_gain if last and out_gain is not None else math.sqrt(2))
            nn.init.zeros_(layer.bias)
        elif last and out_gain is not None:
            with torch.no_grad():
                layer.weight.mul_(out_gain)
                layer.bias.mul_(out_gain)
        layers.append(layer)
        if not last:
            layers.append(_ACTIVATIONS[activation]())
            if layer_norm:
                layers.append(nn.LayerNorm(d_out))
    return nn.Sequential(*layers)


class ObsNormalizer(nn.Module):
    """Running mean/variance of observations, stored as buffers so checkpoints carry them.

    Identity until :meth:`update` is called (PPO's optional observation normalisation).
    """

    mean: torch.Tensor  # buffers (register_buffer)
    var: torch.Tensor
    count: torch.Tensor

    def __init__(self, obs_dim: int, clip: float = 10.0, eps: float = 1e-8) -> None:
        super().__init__()
        self.clip, self.eps = clip, eps
        self.register_buffer("mean", torch.zeros(obs_dim))
        self.register_buffer("var", torch.ones(obs_dim))
        self.register_buffer("count", torch.zeros(()))
        # Host-side mirror of count > 0: forward must not read a device value (that would
        # sync every call and cannot be captured in a CUDA graph).
        self.active = False

    @torch.no_grad()
    def update(self, batch: torch.Tensor) -> None:
        """Merge a batch's moments into the running ones (parallel-variance formula)."""
        b_mean, b_var, n = batch.mean(0), batch.var(0, unbiased=False), batch.shape[0]
        if not self.active:
            self.mean.copy_(b_mean)
            self.var.copy_(b_var)
            self.count.fill_(n)
            self.active = True
            return
        total = self.count + n
        delta = b_mean - self.mean
        self.mean.add_(delta * n / total)
        self.var.copy_((self.var * self.count + b_var * n + delta.square() * self.count * n / total) / total)
        self.count.copy_(total)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self.active = bool(self.count > 0)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if not self.active:
            return obs
        return ((obs - self.mean) / torch.sqrt(self.var + self.eps)).clamp(-self.clip, self.clip)


def tanh_log_det_jacobian(u: torch.Tensor) -> torch.Tensor:
    """log |d tanh(u)/du| summed over the last axis, in the overflow-free form.

    log(1 - tanh(u)^2) = 2 * (log 2 - u - softplus(-2u)); the naive form loses all precision
    once |u| > ~9 (tanh saturates to 1 in float32) and returns -inf.
    """
    return (2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))).sum(-1)


@register_policy_class
class TanhGaussianActor(nn.Module):
    """SAC's policy: a = tanh(u), u ~ N(mu(s), sigma(s)); actions in (-1, 1)."""

    kind = "tanh_gaussian"

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int] = (256, 256), normalize_obs: bool = False) -> None:
        super().__init__()
        self.spec = init_spec(TanhGaussianActor.__init__, locals())
        self.obs_norm = ObsNormalizer(obs_dim) if normalize_obs else nn.Identity()
        self.net = mlp(obs_dim, 2 * act_dim, hidden)

    def _mu_log_std(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mu, log_std = self.net(self.obs_norm(obs)).chunk(2, dim=-1)
        return mu, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample(self, obs: torch.Tensor, n: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised sample and its log-probability (with the tanh correction).

        With ``n``: n samples per state, shapes [n, B, act_dim] and [n, B], from one network pass.
        """
        mu, log_std = self._mu_log_std(obs)
        if n is not None:
            mu, log_std = mu.expand(n, *mu.shape), log_std.expand(n, *log_std.shape)
        u = mu + log_std.exp() * torch.randn_like(mu)
        # Gaussian log-density written out: cheaper than building a Normal per update.
        log_prob = (-0.5 * ((u - mu) / log_std.exp()).square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        return torch.tanh(u), log_prob - tanh_log_det_jacobian(u)

    def log_prob(self, obs: torch.Tensor, action: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        """log pi(a|s) of given actions in (-1, 1) (used by offline algorithms)."""
        mu, log_std = self._mu_log_std(obs)
        u = torch.atanh(action.clamp(-1 + eps, 1 - eps))
        return Normal(mu, log_std.exp(), validate_args=False).log_prob(u).sum(-1) - tanh_log_det_jacobian(u)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        if deterministic:
            return torch.tanh(self._mu_log_std(obs)[0])
        return self.sample(obs)[0]


@register_policy_class
class NormalActor(nn.Module):
    """CORL's and d3rlpy's IQL policy (AWAC's too, by option): a ~ N(tanh(mu(s)), sigma), sigma one learned vector.

    Its log-likelihood of a dataset action is a plain Gaussian's, so an action at the bound
    (tanh saturated in float32) costs a finite squared error where a tanh-squashed Gaussian's
    needs atanh(1 - eps). Sampled actions are clipped to [-1, 1]."""

    kind = "normal"

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int] = (256, 256), normalize_obs: bool = False) -> None:
        super().__init__()
        self.spec = init_spec(NormalActor.__init__, locals())
        self.obs_norm = ObsNormalizer(obs_dim) if normalize_obs else nn.Identity()
        self.net = mlp(obs_dim, act_dim, hidden)
        self.log_std = nn.Parameter(torch.zeros(act_dim))

    def _dist(self, obs: torch.Tensor) -> Normal:
        std = self.log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).exp()  # d3rlpy's bounds, as our other actors
        return Normal(torch.tanh(self.net(self.obs_norm(obs))), std, validate_args=False)

    def log_prob(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """log pi(a|s) of dataset actions, summed over action dimensions."""
        return self._dist(obs).log_prob(action).sum(-1)

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised sample clipped to [-1, 1], and the log-probability of the sample
        before the clip (as :class:`TanhGaussianActor.sample`'s pair; AWAC uses the action)."""
        dist = self._dist(obs)
        action = dist.rsample()
        return action.clamp(-1.0, 1.0), dist.log_prob(action).sum(-1)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        return self._dist(obs).mean if deterministic else self.sample(obs)[0]


@register_policy_class
class DeterministicActor(nn.Module):
    """DDPG/TD3's policy: a = tanh(f(s)) in (-1, 1); exploration noise is added by the caller.

    ``layer_norm=True`` normalises each hidden layer (:func:`mlp`)."""

    kind = "deterministic"

    def __init__(
        self, obs_dim: int, act_dim: int, hidden: Sequence[int] = (256, 256), normalize_obs: bool = False, layer_norm: bool = False
    ) -> None:
        super().__init__()
        self.spec = init_spec(DeterministicActor.__init__, locals(), only_if_set=("layer_norm",))
        self.obs_norm = ObsNormalizer(obs_dim) if normalize_obs else nn.Identity()
        self.net = mlp(obs_dim, act_dim, hidden, layer_norm=layer_norm)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.net(self.obs_norm(obs)))

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        return self(obs)


@register_policy_class
class CategoricalActor(nn.Module):
    """PPO's and discrete BC's policy: logits over ``n_actions``. ``encoder`` (a spec from
    :func:`rlpipe.training.env.encoder_spec`) reads images or stacked frames before the MLP."""

    kind = "categorical"

    def __init__(
        self,
        obs_dim: int,
        n_actions: int,
        hidden: Sequence[int] = (64, 64),
        activation: str = "tanh",
        normalize_obs: bool = False,
        encoder: dict[str, Any] | None = None,
    ) -> None:
        from rlpipe.nets.encoders import build_encoder

        super().__init__()
        self.spec = init_spec(CategoricalActor.__init__, locals(), only_if_set=("encoder",))
        self.obs_norm = ObsNormalizer(obs_dim) if normalize_obs else nn.Identity()
        self.encoder, features = build_encoder(encoder, obs_dim)
        self.net = mlp(features, n_actions, hidden, activation, out_gain=0.01, orthogonal=True)

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        """Unnormalised log-probabilities of the actions, [B, n_actions]."""
        return self.net(self.encoder(self.obs_norm(obs)))

    def dist(self, obs: torch.Tensor) -> Categorical:
        return Categorical(logits=self.logits(obs), validate_args=False)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        if deterministic:
            return self.logits(obs).argmax(-1)
        return self.dist(obs).sample()


class ValueNet(nn.Module):
    """State-value function V(s) -> shape [B]."""

    def __init__(self, obs_dim: int, hidden: Sequence[int] = (64, 64), activation: str = "tanh", obs_norm: nn.Module | None = None) -> None:
        super().__init__()
        # PPO shares the actor's normaliser (no separate statistics to keep in sync).
        self.obs_norm = obs_norm if obs_norm is not None else nn.Identity()
        self.net = mlp(obs_dim, 1, hidden, activation, out_gain=1.0, orthogonal=True)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(self.obs_norm(obs)).squeeze(-1)


class EnsembleLinear(nn.Module):
    """N independent linear layers evaluated with one batched matmul.

    weight: [N, in, out], bias: [N, 1, out]; input [N, B, in] -> output [N, B, out].
    Each member is initialised like ``nn.Linear`` (uniform in +-1/sqrt(in)).
    """

    def __init__(self, n: int, in_dim: int, out_dim: int) -> None:
        super().__init__()
        bound = 1.0 / math.sqrt(in_dim)
        self.weight = nn.Parameter(torch.empty(n, in_dim, out_dim).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(n, 1, out_dim).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.bias, x, self.weight)


def edac_init_(net: nn.Module, out_bound: float) -> None:
    """The EDAC paper's initialisation, as CORL's EDAC and ReBRAC use it, in place on ``net``'s
    linear layers (``nn.Linear`` or :class:`EnsembleLinear`, in order): hidden biases 0.1, the
    last layer's weight and bias uniform in +-``out_bound`` (CORL: 1e-3 for actors, 3e-3 for
    critics). Hidden weights keep PyTorch's default."""
    *hidden, last = [m for m in net.modules() if isinstance(m, (nn.Linear, EnsembleLinear))]
    with torch.no_grad():
        for layer in hidden:
            layer.bias.fill_(0.1)
        last.weight.uniform_(-out_bound, out_bound)
        last.bias.uniform_(-out_bound, out_bound)


class EnsembleLayerNorm(nn.Module):
    """LayerNorm over the last axis of [N, B, dim] with each member's own scale and shift."""

    def __init__(self, n: int, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n, 1, dim))
        self.bias = nn.Parameter(torch.zeros(n, 1, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(self.bias, F.layer_norm(x, x.shape[-1:]), self.weight)


class EnsembleMLP(nn.Module):
    """N independent MLPs of the same shape, evaluated together: [B or N x B, in] -> [N, B, out].

    One ``baddbmm`` per layer for all members. ``out_gains`` (one per member) selects the
    PPO-style orthogonal init; without it each member is initialised like ``nn.Linear``.
    ``layer_norm=True`` adds a LayerNorm (:class:`EnsembleLayerNorm`) after each hidden
    layer's activation.
    """

    def __init__(
        self,
        n: int,
        in_dim: int,
        out_dim: int,
        hidden: Sequence[int] = (256, 256),
        activation: str = "relu",
        out_gains: Sequence[float] | None = None,
        layer_norm: bool = False,
    ) -> None:
        super().__init__()
        self.n = n
        if activation not in _INPLACE_ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose from {sorted(_INPLACE_ACTIVATIONS)}")
        # In place: baddbmm's backward needs its inputs, not its output, so the activation may
        # overwrite it (one large tensor less to allocate and write per layer).
        self.act = _INPLACE_ACTIVATIONS[activation]
        dims = [in_dim, *hidden, out_dim]
        self.layers = nn.ModuleList(EnsembleLinear(n, a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.norms = nn.ModuleList(EnsembleLayerNorm(n, h) for h in hidden) if layer_norm else None
        if out_gains is not None:
            with torch.no_grad():
                for j, layer in enumerate(cast("list[EnsembleLinear]", self.layers)):
                    last = j == len(self.layers) - 1
                    for i in range(n):
                        # orthogonal_ on [out, in] like nn.Linear's weight; stored transposed.
                        w = torch.empty(layer.weight.shape[2], layer.weight.shape[1])
                        nn.init.orthogonal_(w, out_gains[i] if last else math.sqrt(2))
                        layer.weight[i] = w.T
                    layer.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:  # the same batch for every member
            x = x.unsqueeze(0).expand(self.n, -1, -1)
        *hidden, output = self.layers
        for i, layer in enumerate(hidden):
            x = self.act(layer(x))
            if self.norms is not None:
                x = self.norms[i](x)
        return float32_output(output, x)


class EnsembleQ(nn.Module):
    """N Q-critics Q_i(s, a) fused into one module; returns [N, B].

    Twin critics (SAC, TD3) are ``EnsembleQ(..., n=2)``; one forward pass runs all members
    with ``torch.baddbmm`` instead of a Python loop over separate networks. ``layer_norm=True``
    normalises each hidden layer (ReBRAC's critics).
    """

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        hidden: Sequence[int] = (256, 256),
        n: int = 2,
        obs_norm: nn.Module | None = None,
        layer_norm: bool = False,
    ) -> None:
        super().__init__()
        self.n = n
        # Offline critics share the actor's dataset normaliser (as ValueNet does PPO's).
        self.obs_norm = obs_norm if obs_norm is not None else nn.Identity()
        self.net = EnsembleMLP(n, obs_dim + act_dim, 1, hidden, "relu", layer_norm=layer_norm)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([self.obs_norm(obs), action], dim=-1)).squeeze(-1)


@register_policy_class
class ActorCritic(nn.Module):
    """PPO's policy and value function: two separate MLPs fused as a 2-member ensemble.

    Member 0 outputs the policy head (logits, or the Gaussian mean with a state-independent
    log std), member 1 the value (its first output). Same maths as two networks, half the
    kernel launches per forward/backward, which dominate at PPO's small sizes.
    """

    kind = "actor_critic"

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        discrete: bool,
        hidden: Sequence[int] = (64, 64),
        activation: str = "tanh",
        normalize_obs: bool = False,
        init_log_std: float = 0.0,
    ) -> None:
        super().__init__()
        self.spec = init_spec(ActorCritic.__init__, locals())
        self.discrete = discrete
        self.obs_norm = ObsNormalizer(obs_dim) if normalize_obs else nn.Identity()
        self.body = EnsembleMLP(2, obs_dim, act_dim, hidden, activation, out_gains=(0.01, 1.0))
        if not discrete:
            self.log_std = nn.Parameter(torch.full((act_dim,), float(init_log_std)))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(policy head [B, act_dim], value [B])."""
        out = self.body(self.obs_norm(obs))
        return out[0], out[1, :, 0]

    def sample(self, head: torch.Tensor) -> torch.Tensor:
        if self.discrete:
            return torch.multinomial(head.softmax(-1), 1).squeeze(-1)
        return head + self.log_std.exp() * torch.randn_like(head)

    def log_prob_entropy(self, head: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """log pi(a|s) and the policy entropy, both [B]."""
        if self.discrete:
            logp_all = head.log_softmax(-1)
            logp = logp_all.gather(-1, action.unsqueeze(-1)).squeeze(-1)
            return logp, -(logp_all.exp() * logp_all).sum(-1)
        log_std = self.log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
        logp = (-0.5 * ((action - head) / log_std.exp()).square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        entropy = (0.5 + 0.5 * math.log(2 * math.pi) + log_std).sum().expand(head.shape[0])
        return logp, entropy

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        head = self(obs)[0]
        if deterministic:
            return head.argmax(-1) if self.discrete else head
        return self.sample(head)


@register_policy_class
class GreedyQPolicy(nn.Module):
    """A Q-network over discrete actions that acts greedily (DQN's, QR-DQN's and discrete
    CQL's policy).

    ``encoder`` (a spec from :func:`rlpipe.nets.encoders.encoder_spec`) reads images or
    stacked frames before the MLP; ``dueling`` splits the head into a state value and
    mean-centred advantages (Wang et al. 2016); ``quantiles`` > 0 makes each action's output
    ``quantiles`` return quantiles (QR-DQN, Dabney et al. 2018) whose mean is the Q-value.
    """

    kind = "greedy_q"

    def __init__(
        self,
        obs_dim: int,
        n_actions: int,
        hidden: Sequence[int] = (256, 256),
        encoder: dict[str, Any] | None = None,
        dueling: bool = False,
        quantiles: int = 0,
    ) -> None:
        from rlpipe.nets.encoders import build_encoder

        super().__init__()
        self.spec = init_spec(GreedyQPolicy.__init__, locals(), only_if_set=("encoder", "dueling", "quantiles"))
        self.encoder, features = build_encoder(encoder, obs_dim)
        self.n_actions, self.atoms = n_actions, max(quantiles, 1)
        self.net = mlp(features, n_actions * self.atoms, hidden)
        self.value = mlp(features, self.atoms, hidden) if dueling else None

    def quantile_values(self, obs: torch.Tensor) -> torch.Tensor:
        """Per-action outputs [B, n_actions, atoms] (atoms = 1 without quantiles)."""
        features = self.encoder(obs)
        out = self.net(features).unflatten(-1, (self.n_actions, self.atoms))
        if self.value is not None:
            out = self.value(features).unsqueeze(-2) + out - out.mean(-2, keepdim=True)
        return out

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q-values of every action, [B, n_actions]."""
        return self.quantile_values(obs).mean(-1)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        return self(obs).argmax(-1)  # greedy either way: the Q-values define no distribution


def build_policy(kind: str, spec: dict[str, Any]) -> nn.Module:
    """Rebuild an actor from the JSON ``(kind, spec)`` pair stored in a checkpoint. Each value
    must have the type its class's parameter is annotated with: one of another type (a spec
    edited by hand, or damaged) fails deep inside the class, or only when the policy acts."""
    if kind not in _POLICY_CLASSES:
        raise RlpipeError(f"unknown policy kind {kind!r}")
    cls = _POLICY_CLASSES[kind]
    hints = get_type_hints(cls.__init__)
    for key, value in spec.items():
        if key in hints and key != "return" and not _fits(value, hints[key]):
            raise RlpipeError(
                f"checkpoint policy spec does not fit {kind}: {key!r} is {_json_excerpt(value)}, not {_described(hints[key])}"
            )
    try:
        return cls(**spec)
    except (TypeError, ValueError, RuntimeError, ArithmeticError) as exc:  # an unknown or missing key; a value out of range (a 0 dim)
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__  # torch's C++ errors add a stack dump
        raise RlpipeError(f"checkpoint policy spec does not fit {kind}: {first_line}") from None


def policy_shapes(kind: str, spec: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The tensors a policy of ``(kind, spec)`` holds and their shapes, from a copy built on
    PyTorch's meta device: nothing is allocated, so a spec edited to huge layers is refused
    (against the weights file's shapes) before it costs memory."""
    with torch.device("meta"):
        return {key: tuple(value.shape) for key, value in build_policy(kind, spec).state_dict().items()}


_JSON_NAMES: dict[Any, str] = {bool: "boolean", int: "integer", float: "number", str: "string", dict: "object"}


def _fits(value: Any, hint: Any) -> bool:
    """Whether a JSON value has the annotated type ``hint`` (an integer is a number too; a boolean is no integer)."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Literal:
        return any(type(value) is type(option) and value == option for option in args)
    if origin in (Union, UnionType):
        return any(_fits(value, option) for option in args)
    if origin in (Sequence, list, tuple):
        return isinstance(value, (list, tuple)) and all(_fits(item, args[0]) for item in value)
    if hint is float:
        return type(value) in (int, float)
    return type(value) is (origin or hint)


def _described(hint: Any) -> str:
    """An annotated type in JSON's words: "a list of integers", "an object or null"."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Literal:
        return " or ".join(map(json.dumps, args))
    if origin in (Union, UnionType):
        return " or ".join(map(_described, args))
    if origin in (Sequence, list, tuple):
        return f"a list of {_JSON_NAMES[args[0]]}s"
    if hint is type(None):
        return "null"
    name = _JSON_NAMES[origin or hint]
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _json_excerpt(value: Any, limit: int = 40) -> str:
    """``value`` as JSON, cut to ``limit`` characters (a spec value may be a long list)."""
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
