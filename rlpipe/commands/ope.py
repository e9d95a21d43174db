"""Off-policy evaluation of saved runs: Fitted Q Evaluation (`rlpipe.training.fqe`) of the
policies in run directories, checked against the dataset they are scored on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from rlpipe.algos.policy import LoadedPolicy
from rlpipe.datasets.store import METADATA_FILE, DatasetInfo
from rlpipe.envs.goals import flat_observation_space
from rlpipe.errors import RlpipeError
from rlpipe.nets.recurrent import RecurrentPolicy
from rlpipe.training.fqe import FQEConfig, FQEResult, fitted_q_evaluation


def require_dataset_fits(policies: Sequence[LoadedPolicy], info: DatasetInfo) -> None:
    """Raise a one-line RlpipeError unless every policy acts in the env the dataset (opened as
    ``info``) was collected in, on its observations and with its actions: FQE feeds the
    dataset's observations to the policies and scores their actions against the dataset's."""
    from rlpipe.envs import base_env_id
    from rlpipe.nets.checkpoint import read_meta

    where = info.path / METADATA_FILE
    for policy in policies:
        if isinstance(policy.actor, RecurrentPolicy):
            raise RlpipeError(f"the policy of {policy.run_dir} is recurrent: FQE feeds it dataset rows one by one, not episodes in order")
        if base_env_id(policy.env_id) != base_env_id(info.env_id or ""):
            raise RlpipeError(f"dataset {info.name!r} comes from {info.env_id}, but the policy of {policy.run_dir} acts in {policy.env_id}")
        # Loading the policy checked that it takes its env's (flattened) observations: obs_dim values.
        obs_dim = read_meta(policy.run_dir)["policy"]["spec"].get("obs_dim")
        stored_obs = flat_observation_space(info.observation_space)
        problems = []
        if not isinstance(stored_obs, spaces.Box) or int(np.prod(stored_obs.shape)) != obs_dim:
            problems.append(("observation_space", f"{stored_obs}", f"{obs_dim} observation values"))
        if _action_layout(info.action_space) != _action_layout(policy.action_space):
            problems.append(("action_space", f"{info.action_space}", f"actions in {policy.action_space}"))
        if problems:
            key, stored, taken = problems[0]
            raise RlpipeError(
                f"{where} {key!r} is {stored}, but the policy of {policy.run_dir} ({policy.env_id}) takes {taken}: "
                "FQE needs a dataset of the policy's env"
            )


def _action_layout(space: spaces.Space) -> tuple[str, Any]:
    """What a policy's and a dataset's action spaces must share: their kind and size or shape."""
    return type(space).__name__, space.n if isinstance(space, spaces.Discrete) else space.shape


__all__ = ["FQEConfig", "FQEResult", "fitted_q_evaluation", "require_dataset_fits"]
