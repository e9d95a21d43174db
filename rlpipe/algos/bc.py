"""Behaviour cloning: supervised learning of the dataset's actions.

Read top to bottom: config and tuned defaults, then ``train``: the policy for the
dataset's action space (categorical for discrete actions with cross-entropy, reading
flat vectors, images or frame stacks through an encoder; for continuous actions, flat
vectors only, a deterministic tanh policy with MSE, or a tanh-Gaussian with negative
log-likelihood) and the shared offline loop. With ``recurrent`` (discrete actions, flat
observations) an LSTM or GRU policy learns from windows of ``window`` consecutive steps
(`rlpipe.training.windows`), its state zeroed at each window's first step, the loss on the
windows' real steps; it acts with a hidden state per env from each episode's start.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import torch
import torch.nn.functional as F

from rlpipe.algos.registry import REGISTRY
from rlpipe.errors import RlpipeError
from rlpipe.nets.encoders import EncoderChoice
from rlpipe.nets.networks import CategoricalActor, DeterministicActor, TanhGaussianActor
from rlpipe.nets.recurrent import RecurrentCategoricalActor
from rlpipe.training import Batch, OfflineConfig, TrainResult
from rlpipe.training.config import layer_sizes, positive
from rlpipe.training.diagnostics import Diagnosed
from rlpipe.training.env import BOX, DISCRETE, encoder_spec
from rlpipe.training.offline import IMAGE_OBSERVATION_KINDS, Learner, OfflineData, load_offline, require_flat_observations, train_offline
from rlpipe.training.optim import adam, optimizer_step
from rlpipe.training.windows import MAX_WINDOW, WindowBatch, window_sampler

ACTION_SPACES = (DISCRETE, BOX)
SPEC = REGISTRY["bc"]


@dataclass
class Config(OfflineConfig):
    updates: int = positive(2_000)
    eval_every: int = positive(500)
    batch_size: int = positive(64)
    learning_rate: float = positive(1e-3)
    hidden: tuple[int, ...] = layer_sizes((256, 256))
    continuous_loss: Literal["mse", "gaussian"] = "mse"  # continuous actions: "mse" or "gaussian" (likelihood)
    # False (discrete actions): evaluate by sampling the learnt distribution, not its mode, as a
    # sampling expert acts (IPPO's Combat team: its mode can stall, a blocked move repeating).
    eval_deterministic: bool = True
    frame_stack: int = positive(1)  # observations seen as the last k stacked (discrete actions)
    encoder: EncoderChoice = "auto"  # the CNN that reads images; auto: by frame size
    # "lstm" or "gru" (discrete actions, flat observations): a recurrent core of `recurrent_hidden` units
    # before the `hidden` MLP, trained on windows of `window` steps, for partially observed envs.
    recurrent: Literal["none", "lstm", "gru"] = "none"
    recurrent_hidden: int = positive(64)
    window: int = positive(16, at_most=MAX_WINDOW)


TUNED: dict[str, dict[str, Any]] = {
    "Pendulum-v1": dict(updates=5_000, batch_size=256, continuous_loss="mse", eval_every=1_000),
    # The IPPO team's data (sampled actions): sampling wins 0.385 against the mode's 0.33
    # (bc-combat stage, 5000 updates, 200 episodes, seed 0; the expert itself wins 0.40).
    "Combat-v0": dict(eval_deterministic=False),
}


def train(config: Config, out_dir: str | Path | None = None, *, progress: bool = True) -> TrainResult:
    """Train BC on ``config.dataset``; with ``out_dir`` also write checkpoint, metrics and curve."""
    recurrent = config.recurrent != "none"
    data = load_offline(SPEC.name, config, ACTION_SPACES, observation_kinds=IMAGE_OBSERVATION_KINDS, windows=recurrent)
    if recurrent:
        return _train_recurrent(config, data, out_dir, progress)
    obs_dim, act_dim, device = data.obs_dim, data.act_dim, data.device
    actor: CategoricalActor | TanhGaussianActor | DeterministicActor
    if data.discrete:
        encoder = encoder_spec(data.observation_space, config.frame_stack, config.encoder)
        actor = CategoricalActor(obs_dim, act_dim, config.hidden, activation="relu", encoder=encoder).to(device)
    else:
        require_flat_observations(SPEC.name, config, data)
        continuous = TanhGaussianActor if config.continuous_loss == "gaussian" else DeterministicActor
        actor = continuous(obs_dim, act_dim, config.hidden).to(device)
    optimizer = adam(actor.parameters(), config.learning_rate)

    def loss_of(b: Batch) -> torch.Tensor:
        if data.discrete:
            return -cast(CategoricalActor, actor).dist(b.obs).log_prob(b.actions.long()).mean()
        if config.continuous_loss == "gaussian":
            return -cast(TanhGaussianActor, actor).log_prob(b.obs, b.actions).mean()
        return (actor(b.obs) - b.actions).square().mean()

    def update(b: Batch, i: int) -> Diagnosed:
        loss = loss_of(b)
        optimizer_step(optimizer, loss)
        return {"loss": loss.detach()}

    deterministic_eval = config.eval_deterministic or not data.discrete
    learner = Learner({"policy": actor}, update, optimizers={"optimizer": optimizer}, deterministic_eval=deterministic_eval)
    return train_offline(SPEC.name, config, data, learner, out_dir, progress)


def _train_recurrent(config: Config, data: OfflineData, out_dir: str | Path | None, progress: bool) -> TrainResult:
    """Recurrent BC: cross-entropy of the dataset's actions at the real steps of windows."""
    if not data.discrete or len(data.observation_space.shape) != 1 or config.frame_stack > 1:
        raise RlpipeError(
            f"bc with recurrent={config.recurrent} reads flat observations one at a time (frame_stack=1) and needs "
            f"discrete actions; dataset {data.info.name!r} has {data.observation_space} observations, {data.action_space} actions"
        )
    cell = cast(Literal["lstm", "gru"], config.recurrent)  # not "none": train() sends only recurrent configs here
    actor = RecurrentCategoricalActor(data.obs_dim, data.act_dim, cell, config.recurrent_hidden, config.hidden).to(data.device)
    optimizer = adam(actor.parameters(), config.learning_rate)

    def update(b: WindowBatch, i: int) -> Diagnosed:
        logits, _ = actor(b.obs, actor.initial_state(len(b.obs)), b.starts)
        loss = F.cross_entropy(logits[b.mask], b.actions[b.mask].long())
        optimizer_step(optimizer, loss)
        return {"loss": loss.detach()}

    learner = Learner(
        {"policy": actor},
        update,
        optimizers={"optimizer": optimizer},
        deterministic_eval=config.eval_deterministic,
        sampler=window_sampler(data, config.window, config.seed),
    )
    return train_offline(SPEC.name, config, data, learner, out_dir, progress)
