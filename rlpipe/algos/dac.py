"""DAC: off-policy adversarial imitation (Kostrikov et al., "Discriminator-Actor-Critic",
2019), here with SAC as the learner.

GAIL's discriminator D(s, a) (``gail.Discriminator``: the probability that a pair is the
policy's rather than the expert's) is trained on replay samples against as many expert
pairs, with a gradient penalty on pairs mixed between the two (WGAN-GP style), which keeps
D smooth so its reward stays informative once it can tell the two apart. SAC learns from
the reward

    r(s, a) = log(1 - D) - log D = -logit D(s, a)

(log D_expert - log D_policy), which is negative on pairs D finds policy-like. GAIL's
-log D is always positive, so ending an episode forfeits reward and survival alone is
rewarded; this reward has no such sign, and Pendulum, which never terminates, gives
survival nothing to exploit: only matching the expert's pairs pays. The env reward is
never used for learning, only for evaluation. Episode ends follow SAC: no bootstrap on
``terminated``, bootstrap on truncation; absorbing states (the paper's fix for envs that
terminate) are not implemented.

``constant_reward`` replaces D's reward by a constant: the control that shows the
learning comes from imitation (on Pendulum it stays near a random policy's return).

Read top to bottom: config (SAC's fields plus the dataset and discriminator settings), the
gradient penalty, then ``train``: SAC's agent whose update first steps D on the replay
batch against an expert batch, then runs SAC's update on D's rewards.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlpipe.algos import sac
from rlpipe.algos.gail import Discriminator, discriminator_update
from rlpipe.algos.registry import REGISTRY
from rlpipe.envs import base_env_id
from rlpipe.errors import RlpipeError
from rlpipe.training import Batch, DatasetFields, TrainResult
from rlpipe.training.config import layer_sizes, positive
from rlpipe.training.diagnostics import Diagnosed
from rlpipe.training.env import BOX
from rlpipe.training.offline import dataset_metrics, load_offline
from rlpipe.training.offpolicy import Agent, setup, train_off_policy
from rlpipe.training.optim import adam

ACTION_SPACES = (BOX,)
SPEC = REGISTRY["dac"]


@dataclass
class Config(DatasetFields, sac.Config):
    """SAC's settings (the learner: env_steps, hidden, learning rates, ...), the expert
    dataset (``env_id`` is filled from its metadata; ``max_samples``: expert pairs to imitate)
    and the discriminator's settings."""

    disc_learning_rate: float = positive(3e-4)
    disc_hidden: tuple[int, ...] = layer_sizes((64, 64))
    grad_penalty: float = 10.0  # weight of (|grad D| - 1)^2 on mixed pairs (the paper's 10)
    constant_reward: float | None = None  # the control: this reward instead of D's (D is not trained)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.grad_penalty < 0:
            raise RlpipeError(f"setting grad_penalty={self.grad_penalty!r}: expected a number >= 0")


TUNED: dict[str, dict[str, Any]] = {
    # SAC's tuned Pendulum settings. From `pendulum-expert` (50 episodes, -148), 100-episode
    # returns: seed 0 -149.1 after 15k env steps, seed 1 -154.4 after 10k, seed 2 -143.6 after
    # 15k (-305 after 10k); the constant-reward control stays near -1290.
    "Pendulum-v1": dict(sac.TUNED["Pendulum-v1"], env_steps=15_000, eval_every=5_000),
}


def train(config: Config, out_dir: str | Path | None = None, *, progress: bool = True) -> TrainResult:
    """Train DAC on ``config.dataset``; with ``out_dir`` also write checkpoint, metrics and curve."""
    data = load_offline(SPEC.name, config, ACTION_SPACES)
    if data.info.env_id != base_env_id(config.env_id):
        raise RlpipeError(f"dataset {data.info.name!r} was collected in {data.info.env_id!r}, not {config.env_id!r}")
    env = setup(SPEC.name, config)
    learner = sac.make_agent(config, env)
    disc = Discriminator(env.obs_dim, env.act_dim, False, config.disc_hidden).to(env.device)
    optimizer = adam(disc.parameters(), config.disc_learning_rate)
    disc_updates, disc_loss = 0, None

    def update(b: Batch, index: int) -> Diagnosed:
        nonlocal disc_updates, disc_loss
        if config.constant_reward is not None:
            rewards = torch.full_like(b.rewards, config.constant_reward)
        else:
            expert = data.sampler.sample(len(b.obs))  # balanced classes
            disc_loss = discriminator_update(disc, optimizer, b.obs, b.actions, expert, config.grad_penalty)
            disc_updates += 1
            with torch.no_grad():
                rewards = -disc(b.obs, b.actions)  # log D_expert - log D_policy
        learned = learner.update(b._replace(rewards=rewards), index) or {}
        return {**learned, **({} if disc_loss is None else {"discriminator_loss": torch.as_tensor(disc_loss)})}

    def extra_metrics() -> dict[str, Any]:
        learner_metrics = learner.extra_metrics() if learner.extra_metrics else {}
        return {**learner_metrics, **dataset_metrics(data), "discriminator_updates": disc_updates, "discriminator_loss": disc_loss}

    agent = Agent(learner.actor, {**learner.modules, "discriminator": disc}, learner.explore, update, extra_metrics)
    return train_off_policy(SPEC.name, config, env, agent, out_dir, progress, None)
