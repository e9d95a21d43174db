"""Multi-agent env ids (PettingZoo Parallel API), grouped in env families, and their
construction with one-line errors.

An env family is a plug-in: its :class:`EnvFamily` entry in :data:`FAMILIES` names the env
ids it serves and its plug-in module, which holds everything family-specific that training,
evaluation and collection need (rows, evaluation, policy heads, dataset hooks: see
:mod:`rlpipe.training.multiagent`). Generic code asks :func:`env_family` and names no env
id. ``Combat-v0`` is rlpipe's rewrite of ma-gym's Combat (:mod:`rlpipe.envs.combat`); the
MPE tasks come from ``mpe2`` with discrete actions (the reference text's setting).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlpipe.errors import RlpipeError

if TYPE_CHECKING:  # pettingzoo loads when an env is made: `is_multi_agent` stays cheap for the CLI
    from pettingzoo import ParallelEnv


@dataclass(frozen=True, kw_only=True)
class EnvFamily:
    """A family of multi-agent envs. Torch-free data: the plug-in module is named, not
    imported, so listing families (and the CLI's start-up) loads neither torch nor PettingZoo."""

    name: str
    envs: Mapping[str, tuple[str, Mapping[str, Any]]]  # env id -> (PettingZoo module, default keyword arguments)
    plugin: str  # the module whose ``PLUGIN`` (a ``rlpipe.training.multiagent.FamilyPlugin``) serves these envs


# One entry per family: adding a family is its plug-in module plus one entry here.
FAMILIES: tuple[EnvFamily, ...] = (
    EnvFamily(name="combat", envs={"Combat-v0": ("rlpipe.envs.combat", {})}, plugin="rlpipe.training.multiagent.combat"),
    EnvFamily(
        name="mpe",
        envs={
            "simple_adversary_v3": ("mpe2.simple_adversary_v3", {"N": 2, "max_cycles": 25, "continuous_actions": False}),
            "simple_spread_v3": ("mpe2.simple_spread_v3", {"N": 3, "max_cycles": 25, "continuous_actions": False}),
        },
        plugin="rlpipe.training.multiagent.mpe",
    ),
)
MULTI_AGENT_ENVS: dict[str, tuple[str, Mapping[str, Any]]] = {env_id: entry for family in FAMILIES for env_id, entry in family.envs.items()}


def is_multi_agent(env_id: str) -> bool:
    return env_id in MULTI_AGENT_ENVS


def env_family(env_id: str) -> EnvFamily:
    """The family that serves the multi-agent env ``env_id``; an RlpipeError for any other id."""
    for family in FAMILIES:
        if env_id in family.envs:
            return family
    raise RlpipeError(f"unknown multi-agent environment {env_id!r}; choose from {', '.join(MULTI_AGENT_ENVS)}")


def make_parallel_env(env_id: str, **kwargs: Any) -> ParallelEnv:
    """A PettingZoo ParallelEnv for ``env_id``; ``kwargs`` override its defaults."""
    module_name, defaults = env_family(env_id).envs[env_id]
    from pettingzoo.utils.conversions import aec_to_parallel_wrapper

    module = importlib.import_module(module_name)
    try:
        if hasattr(module, "raw_env"):
            # MPE: the AEC env without PettingZoo's checking wrappers steps twice as fast;
            # our trainers only send actions from the env's own spaces.
            return aec_to_parallel_wrapper(module.raw_env(**{**defaults, **kwargs}))
        return module.parallel_env(**{**defaults, **kwargs})
    except TypeError as exc:
        raise RlpipeError(f"bad option for {env_id}: {exc}") from None
