"""Pieces every algorithm shares: replay buffer, dataset sampler, evaluation, device
choice, run bookkeeping (DVCLive, progress, checkpoint) and seeding. The env-side pieces
(action scaling, the vector-env stepper) come from rlpipe.envs and are re-exported here."""

from rlpipe.envs import make_vec_env
from rlpipe.envs.spaces import ActionScaler, require_spaces
from rlpipe.envs.stepper import StepBatch, StepSink, VecStepper
from rlpipe.training.buffer import Batch, ReplayBuffer, Update
from rlpipe.training.config import DatasetFields, OfflineConfig, OnlineConfig, RunConfig, config_for_env
from rlpipe.training.env import resolve_device
from rlpipe.training.evaluation import EvalResult, PolicyFn, evaluate, policy_fn
from rlpipe.training.run import EvalPoint, Run, TrainResult
from rlpipe.training.seeding import seed_everything

__all__ = [
    "ActionScaler",
    "Batch",
    "DatasetFields",
    "EvalPoint",
    "EvalResult",
    "OfflineConfig",
    "OnlineConfig",
    "PolicyFn",
    "ReplayBuffer",
    "Run",
    "RunConfig",
    "StepBatch",
    "StepSink",
    "TrainResult",
    "Update",
    "VecStepper",
    "config_for_env",
    "evaluate",
    "make_vec_env",
    "policy_fn",
    "require_spaces",
    "resolve_device",
    "seed_everything",
]
