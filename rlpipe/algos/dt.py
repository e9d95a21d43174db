"""Decision Transformer (Chen et al., 2021): offline RL as return-conditioned sequence modelling.

Read top to bottom: config and tuned defaults, the causal transformer over (return-to-go,
observation, action) tokens, the return-conditioned policy that acts with it, then ``train``:
windows of K steps from the dataset (`rlpipe.training.windows`, padded on the left), the
action predicted at each observation token regressed onto the dataset's (MSE through a tanh
head for continuous actions, cross-entropy for discrete ones) by AdamW with a linear warm-up
and gradient clipping, in the shared offline loop. Acting, the policy is conditioned on a
target return (default: the best episode return in the data) that each reward earned lowers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rlpipe.algos.policy import LoadedPolicy, load_checkpoint_policy
from rlpipe.algos.registry import REGISTRY
from rlpipe.datasets.frames import chain_starts
from rlpipe.datasets.mapped import MappedTransitions
from rlpipe.errors import RlpipeError
from rlpipe.nets.networks import Float32Linear, ObsNormalizer, init_spec, register_policy_class
from rlpipe.training import ActionScaler, OfflineConfig, TrainResult
from rlpipe.training.config import positive
from rlpipe.training.diagnostics import Diagnosed
from rlpipe.training.env import BOX, DISCRETE
from rlpipe.training.offline import Learner, OfflineData, fit_obs_normalizer, load_offline, train_offline
from rlpipe.training.optim import optimizer_step
from rlpipe.training.windows import MAX_WINDOW, WindowBatch, window_sampler

ACTION_SPACES = (DISCRETE, BOX)
SPEC = REGISTRY["dt"]


@dataclass
class Config(OfflineConfig):
    # The paper's and CORL's settings, but for the budget: they run 100k updates with 10k of
    # warm-up; on a CPU the default is 10k updates, warming up over the same tenth of them.
    updates: int = positive(10_000)
    eval_every: int = positive(2_000)
    batch_size: int = positive(64)
    context: int = positive(20, at_most=MAX_WINDOW)  # K: steps per window (3K tokens)
    embedding_dim: int = positive(128)
    layers: int = positive(3)
    heads: int = positive(1)
    dropout: float = 0.1  # on the embeddings, attention weights and residual branches
    learning_rate: float = positive(1e-4)
    weight_decay: float = 1e-4  # AdamW's
    warmup_steps: int = positive(1_000)  # the learning rate rises linearly over these updates
    grad_clip: float = positive(0.25)  # max total gradient norm
    return_scale: float = 1e-3  # returns-to-go enter the network times this (CORL's MuJoCo 0.001); 0 ignores them
    target_return: float | None = None  # the return acted for; None: the dataset's best episode return
    # The control of return conditioning: train on each row's return-to-go taken from a random
    # row of the same timestep, so the return token carries nothing about its episode.
    shuffle_returns_to_go: bool = False
    normalize_obs: bool = True  # with the dataset's mean and std (CORL)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.embedding_dim % self.heads:
            raise RlpipeError(f"setting heads={self.heads}: embedding_dim {self.embedding_dim} must be a multiple of it")
        if not 0.0 <= self.dropout < 1.0:
            raise RlpipeError(f"setting dropout={self.dropout!r}: expected a number in [0, 1)")


# The classic-control envs get a small network, and a higher learning rate for its short budget:
# the paper's (128-dim, 3 layers, 20-step windows) costs about 0.7 CPU-s per update of 64
# windows on this project's 2-core machine, this one about 0.03, and its return conditioning
# works on `pendulum-mixed` (tests/test_dt.py).
SMALL_NETWORK = dict(embedding_dim=32, layers=2, context=10, learning_rate=1e-3, warmup_steps=100)
TUNED: dict[str, dict[str, Any]] = {
    "Pendulum-v1": dict(SMALL_NETWORK, updates=3_000, eval_every=1_000),
    "CartPole-v1": dict(SMALL_NETWORK, updates=1_000, eval_every=500),
}


class CausalBlock(nn.Module):
    """A GPT block (pre-LayerNorm): self-attention over the allowed keys, then a 4x GELU MLP."""

    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.drop = nn.Dropout(dropout)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """``x`` [B, L, dim]; ``allowed`` [B, 1, L, L] bool: query i may attend to key j."""
        batch, length, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, length, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        dropout = self.dropout if self.training else 0.0
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout)
        x = x + self.drop(self.proj(attended.transpose(1, 2).reshape(batch, length, dim)))
        return x + self.mlp(self.norm2(x))


@register_policy_class
class DecisionTransformer(nn.Module):
    """The action at each step from the window's tokens up to that step's observation.

    The sequence is (R_1, s_1, a_1, ..., R_K, s_K, a_K): each token embedded by its own linear
    map (a discrete action by a lookup) plus its step's learned timestep embedding. Attention
    is causal and skips the padding (``mask`` False); a padding token attends to itself only,
    so no row is empty. ``target_return`` is the return the policy acts for (kept with the
    weights so a saved run acts as trained); ``max_timestep`` bounds the timestep embedding,
    later steps share its last entry.
    """

    kind = "decision_transformer"
    causal: torch.Tensor

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        discrete: bool,
        context: int,
        max_timestep: int,
        target_return: float,
        return_scale: float,
        embedding_dim: int = 128,
        layers: int = 3,
        heads: int = 1,
        dropout: float = 0.1,
        normalize_obs: bool = True,
    ) -> None:
        super().__init__()
        self.spec = init_spec(DecisionTransformer.__init__, locals())
        self.discrete, self.context, self.max_timestep = discrete, context, max_timestep
        self.target_return, self.return_scale = target_return, return_scale
        self.obs_norm = ObsNormalizer(obs_dim) if normalize_obs else nn.Identity()
        self.embed_return = nn.Linear(1, embedding_dim)
        self.embed_obs = nn.Linear(obs_dim, embedding_dim)
        self.embed_action = nn.Embedding(act_dim, embedding_dim) if discrete else nn.Linear(act_dim, embedding_dim)
        self.embed_timestep = nn.Embedding(max_timestep, embedding_dim)
        self.embed_norm, self.embed_drop = nn.LayerNorm(embedding_dim), nn.Dropout(dropout)
        self.blocks = nn.ModuleList(CausalBlock(embedding_dim, heads, dropout) for _ in range(layers))
        self.out_norm = nn.LayerNorm(embedding_dim)
        self.head = Float32Linear(embedding_dim, act_dim)
        self.register_buffer("causal", torch.ones(3 * context, 3 * context, dtype=torch.bool).tril(), persistent=False)
        self.apply(_gpt_init)

    def forward(
        self, obs: torch.Tensor, actions: torch.Tensor, returns_to_go: torch.Tensor, timesteps: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """Per step [B, K, act_dim]: the action logits (discrete) or the action in (-1, 1),
        predicted at the step's observation token, from ``obs`` [B, K, obs_dim], ``actions``
        [B, K, act_dim] (discrete: [B, K] indices), ``returns_to_go`` and ``timesteps`` [B, K]
        and ``mask`` [B, K] (True at real steps)."""
        batch, k = mask.shape
        time = self.embed_timestep(timesteps.clamp(max=self.max_timestep - 1))
        action = self.embed_action(actions.long() if self.discrete else actions)
        rtg = self.embed_return((returns_to_go * self.return_scale).unsqueeze(-1))
        tokens = torch.stack([rtg, self.embed_obs(self.obs_norm(obs)), action], dim=2) + time.unsqueeze(2)
        x = self.embed_drop(self.embed_norm(tokens.reshape(batch, 3 * k, -1)))
        real = mask.repeat_interleave(3, dim=1)
        diagonal = torch.eye(3 * k, dtype=torch.bool, device=mask.device)
        allowed = (self.causal[: 3 * k, : 3 * k] & (real.unsqueeze(1) | diagonal)).unsqueeze(1)
        for block in self.blocks:
            x = block(x, allowed)
        out = self.head(self.out_norm(x[:, 1::3]))
        return out if self.discrete else torch.tanh(out)


def _gpt_init(module: nn.Module) -> None:
    """GPT-2's initialisation (as the paper's and CORL's code): N(0, 0.02) weights, zero biases."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, 0.0, 0.02)
        if isinstance(module, nn.Linear):
            nn.init.zeros_(module.bias)


class ReturnConditionedPolicy:
    """A Decision Transformer as a policy function over a batch of envs
    (`rlpipe.training.evaluation.EpisodicPolicy` and ``RewardConditionedPolicy``).

    Per env it keeps the last K steps' (return-to-go, observation, action, timestep). An
    episode starts at ``target_return`` (default: the model's) and timestep 0;
    ``record_rewards`` lowers the return-to-go by each step's reward and advances the
    timestep; each call adds the step's observation and acts for the window's last step.
    """

    def __init__(
        self,
        model: DecisionTransformer,
        scaler: ActionScaler,
        device: torch.device | str = "cpu",
        deterministic: bool = True,
        target_return: float | None = None,
    ) -> None:
        self.model, self.scaler, self.device, self.deterministic = model, scaler, torch.device(device), deterministic
        self.target_return = model.target_return if target_return is None else target_return
        self._begin(0)  # sized at the first call

    def _begin(self, envs: int) -> None:
        model, k = self.model, self.model.context
        self._envs = envs
        self.obs = torch.zeros(envs, k, model.spec["obs_dim"], device=self.device)
        self.actions = torch.zeros((envs, k) if model.discrete else (envs, k, model.spec["act_dim"]), device=self.device)
        self.returns_to_go = torch.zeros(envs, k, device=self.device)
        self.timesteps = torch.zeros(envs, k, dtype=torch.long, device=self.device)
        self.length = torch.zeros(envs, dtype=torch.long, device=self.device)  # real steps in each window
        self.return_to_go = np.full(envs, self.target_return)
        self.timestep = np.zeros(envs, np.int64)

    def start_episodes(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows, bool)
        if len(rows) != self._envs:
            self._begin(len(rows))
        self.length[torch.as_tensor(rows, device=self.device)] = 0
        self.return_to_go[rows], self.timestep[rows] = self.target_return, 0

    def record_rewards(self, rewards: np.ndarray) -> None:
        self.return_to_go -= rewards
        self.timestep += 1

    @torch.no_grad()
    def __call__(self, obs: np.ndarray) -> np.ndarray:
        if len(obs) != self._envs:
            self._begin(len(obs))
        for window in (self.obs, self.actions, self.returns_to_go, self.timesteps):
            window[:] = window.roll(-1, dims=1)  # the oldest step drops out, the newest goes last
        self.obs[:, -1] = torch.as_tensor(np.asarray(obs, np.float32), device=self.device)
        self.actions[:, -1] = 0  # causal: the step's own action token does not reach its prediction
        self.returns_to_go[:, -1] = torch.as_tensor(self.return_to_go, dtype=torch.float32, device=self.device)
        self.timesteps[:, -1] = torch.as_tensor(self.timestep, device=self.device)
        self.length = (self.length + 1).clamp(max=self.model.context)
        mask = torch.arange(self.model.context, device=self.device) >= self.model.context - self.length.unsqueeze(1)
        out = self.model(self.obs, self.actions, self.returns_to_go, self.timesteps, mask)[:, -1]
        if not self.model.discrete:
            action = out  # the squared error's prediction: deterministic either way
        elif self.deterministic:
            action = out.argmax(-1)
        else:
            action = torch.distributions.Categorical(logits=out).sample()
        self.actions[:, -1] = action
        return self.scaler.to_env(action.cpu().numpy())


def load_policy(run_dir: str | Path, device: str = "cpu", deterministic: bool = True) -> LoadedPolicy:
    """A saved DT run's policy (`load_checkpoint_policy` with :class:`ReturnConditionedPolicy`),
    acting for the target return it was trained to act for."""
    return load_checkpoint_policy(run_dir, device, deterministic, policy_of=ReturnConditionedPolicy)


def episode_extent(data: OfflineData) -> tuple[float, int]:
    """The best episode return in the dataset (over its unbroken runs of steps, as the windows
    see them) and its longest episode, in steps."""
    arrays = data.arrays
    if isinstance(arrays, MappedTransitions):
        starts, steps = arrays.chains()
        reward = np.asarray(arrays.column("reward"))
    else:
        starts, steps, reward = chain_starts(arrays.episode_id, arrays.step), arrays.step, arrays.reward
    returns = np.add.reduceat(np.asarray(reward, np.float64), np.flatnonzero(starts))
    return float(returns.max()), int(np.max(steps)) + 1


def sequence_loss(model: DecisionTransformer, b: WindowBatch) -> torch.Tensor:
    """Mean over the real steps of the error of the predicted actions: cross-entropy on the
    dataset's discrete actions, squared error on continuous ones."""
    predicted = model(b.obs, b.actions, b.returns_to_go, b.timesteps, b.mask)
    if model.discrete:
        errors = F.cross_entropy(predicted.transpose(1, 2), b.actions.long(), reduction="none")
    else:
        errors = (predicted - b.actions).square().mean(-1)
    return errors[b.mask].mean()


def train(config: Config, out_dir: str | Path | None = None, *, progress: bool = True) -> TrainResult:
    """Train a Decision Transformer on ``config.dataset``; with ``out_dir`` also write
    checkpoint, metrics and curve."""
    data = load_offline(SPEC.name, config, ACTION_SPACES, windows=True)
    windows = window_sampler(data, config.context, config.seed, shuffle_returns_to_go=config.shuffle_returns_to_go)
    best_return, longest = episode_extent(data)
    model = DecisionTransformer(
        data.obs_dim,
        data.act_dim,
        data.discrete,
        config.context,
        longest,
        best_return if config.target_return is None else config.target_return,
        config.return_scale,
        config.embedding_dim,
        config.layers,
        config.heads,
        config.dropout,
        config.normalize_obs,
    ).to(data.device)
    fit_obs_normalizer(model, data)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)

    def update(b: WindowBatch, i: int) -> Diagnosed:
        for group in optimizer.param_groups:  # from the update's index, so a resumed run continues the schedule
            group["lr"] = config.learning_rate * min(1.0, (i + 1) / config.warmup_steps)
        model.train()
        loss = sequence_loss(model, b)
        optimizer_step(optimizer, loss, config.grad_clip)
        model.eval()  # evaluation (between updates) acts without dropout
        return {"loss": loss.detach()}

    learner = Learner(
        {"policy": model},
        update,
        optimizers={"optimizer": optimizer},
        sampler=windows,
        policy_of=ReturnConditionedPolicy,
        extra_metrics=lambda: {"target_return": model.target_return},
    )
    return train_offline(SPEC.name, config, data, learner, out_dir, progress)
