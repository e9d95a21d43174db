"""Pieces every algorithm shares: the typed run config, envs and action scaling, replay buffer, evaluation,
vector-env stepping, run bookkeeping (DVCLive, progress, checkpoint) and seeding."""

from rlpipe.training.buffer import Batch, ReplayBuffer, Update
from rlpipe.training.config import DatasetFields, OfflineConfig, OnlineConfig, RunConfig, config_for_env
from rlpipe.training.env import ActionScaler, make_vec_env, require_spaces, resolve_device
from rlpipe.training.evaluation import EvalResult, PolicyFn, evaluate, policy_fn
from rlpipe.training.rollout import StepBatch, StepSink, VecStepper
from rlpipe.training.run import EvalPoint, Run, TrainResult
from rlpipe.training.seeding import seed_everything

__all__ = [
    "ActionScaler", "Batch", "DatasetFields", "EvalPoint", "EvalResult", "OfflineConfig", "OnlineConfig", "PolicyFn", "ReplayBuffer", "Run", "RunConfig",
    "StepBatch", "StepSink", "TrainResult", "Update", "VecStepper", "config_for_env", "evaluate",
    "make_vec_env", "policy_fn", "require_spaces", "resolve_device", "seed_everything",
]
