"""Multi-agent env ids (PettingZoo Parallel API): construction with one-line errors.

``Combat-v0`` is rlpipe's rewrite of ma-gym's Combat (:mod:`rlpipe.envs.combat`); the MPE
tasks come from ``mpe2`` with discrete actions (the reference text's setting).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rlpipe.errors import RlpipeError

if TYPE_CHECKING:  # pettingzoo loads when an env is made: `is_multi_agent` stays cheap for the CLI
    from pettingzoo import ParallelEnv

# id -> (module, default keyword arguments of its ``raw_env`` / ``parallel_env``)
MULTI_AGENT_ENVS: dict[str, tuple[str, dict[str, Any]]] = {
    "Combat-v0": ("rlpipe.envs.combat", {}),
    "simple_adversary_v3": ("mpe2.simple_adversary_v3", {"N": 2, "max_cycles": 25, "continuous_actions": False}),
    "simple_spread_v3": ("mpe2.simple_spread_v3", {"N": 3, "max_cycles": 25, "continuous_actions": False}),
}


def is_multi_agent(env_id: str) -> bool:
    return env_id in MULTI_AGENT_ENVS


def make_parallel_env(env_id: str, **kwargs: Any) -> ParallelEnv:
    """A PettingZoo ParallelEnv for ``env_id``; ``kwargs`` override its defaults."""
    if env_id not in MULTI_AGENT_ENVS:
        raise RlpipeError(f"unknown multi-agent environment {env_id!r}; choose from {', '.join(MULTI_AGENT_ENVS)}")
    module_name, defaults = MULTI_AGENT_ENVS[env_id]
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
