"""Calibrated Q-learning (Cal-QL): CQL whose conservative term stops pushing the current
policy's Q values down once they reach the value of the policy that collected the data, so
the pre-trained critic stays on the scale of real returns and online fine-tuning starts
from it (Nakamoto et al. 2023, "Cal-QL: Calibrated Offline RL Pre-Training for Efficient
Online Fine-Tuning").

The critic loss is CQL's (`rlpipe.algos.cql.critic_loss`) with one change. Of the actions
CQL samples per state, those drawn from the current policy (its pi(.|s) and pi(.|s')
proposals, both valued at s) enter the importance-weighted logsumexp as
``max(Q(s, a), V_mc(s))``; the uniform samples and the dataset's actions are unchanged.
``V_mc(s)`` is the row's discounted Monte-Carlo return-to-go (`rlpipe.training.buffer.ReturnsToGo`):
its episode's rewards from that step on, as learnt (``(r + reward_shift) * reward_scale``),
discounted by ``gamma`` and summed to the episode's last row. A truncated episode just ends
there, with nothing bootstrapped after it, so the bound is low near a time limit. While
fine-tuning online (``finetune_env_steps``) a collected row has no bound (-inf) until its
episode ends, then its episode's returns-to-go.

Everything else is CQL's continuous variant (`rlpipe.algos.cql.continuous_cql`: SAC with
fused twin critics and automatic entropy tuning). ``calibrate=False`` is that CQL with the
same settings and batches: the control. Metric ``bound_rate``, in both: the fraction of the
policy proposals' Q values below the rows' returns-to-go in the last update (the ones the
bound raises), how far the critic has fallen under the data's own returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlpipe.algos import cql
from rlpipe.algos.registry import REGISTRY
from rlpipe.errors import RlpipeError
from rlpipe.training import TrainResult
from rlpipe.training.buffer import ReturnsToGo
from rlpipe.training.config import positive
from rlpipe.training.env import BOX
from rlpipe.training.offline import load_offline, train_offline

ACTION_SPACES = (BOX,)
SPEC = REGISTRY["calql"]


@dataclass
class Config(cql.Config):
    num_sampled_actions: int = positive(10)  # per proposal and state (CORL's Cal-QL: 10)
    calibrate: bool = True  # False: CQL with these settings (the control)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.quantiles:
            raise RlpipeError(f"setting quantiles={self.quantiles!r}: calql has continuous actions only (expected 0)")
        if self.frame_stack != 1:
            raise RlpipeError(f"setting frame_stack={self.frame_stack!r}: calql reads flat observations only (expected 1)")


TUNED: dict[str, dict[str, Any]] = {
    # CQL's Pendulum settings, its 5 samples per proposal included, so that calibrate=False
    # is `rlpipe train cql` on the same batches.
    "Pendulum-v1": {**cql.TUNED["Pendulum-v1"], "num_sampled_actions": 5},
}


def reference_returns(config: Config) -> ReturnsToGo:
    """The returns-to-go that bound the policy proposals' Q (measured against, not raised to,
    without ``calibrate``)."""
    return ReturnsToGo(config.gamma, config.reward_shift, config.reward_scale)


def train(config: Config, out_dir: str | Path | None = None, *, progress: bool = True) -> TrainResult:
    """Train Cal-QL on ``config.dataset``; with ``out_dir`` also write checkpoint, metrics and curve."""
    data = load_offline(SPEC.name, config, ACTION_SPACES, returns_to_go=reference_returns(config))
    learner = cql.continuous_cql(config, data, reference_returns=True, floor=config.calibrate)
    return train_offline(SPEC.name, config, data, learner, out_dir, progress)
