"""Connecting to Ray, the optional engine behind ``--backend ray`` (``pip install 'rlpipe[ray]'``).

Ray is imported only here and only when a Ray backend is asked for. With ``RAY_ADDRESS``
set (e.g. ``HEAD:6379`` of a cluster started by ``ray start --head``) the driver joins
that cluster; otherwise a local Ray with ``num_cpus`` CPUs is started for this process.
"""

from __future__ import annotations

import os
from types import ModuleType

from rlpipe.envs import TRUST_ENV_SPEC_VAR, env_specs_trusted
from rlpipe.errors import RlpipeError

LOCAL_OBJECT_STORE_BYTES = 512 * 2**20  # enough for shard paths and metrics; Ray's default takes 30% of RAM


def ensure_ray(num_cpus: int) -> ModuleType:
    """The ``ray`` module, initialised: joined to ``$RAY_ADDRESS`` or a local Ray of ``num_cpus`` CPUs."""
    try:
        import ray
    except ImportError:
        raise RlpipeError("--backend ray needs Ray: pip install 'rlpipe[ray]'") from None
    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            # a cluster's workers do not inherit this process's environment: pass on --trust-env-spec
            trust = {"env_vars": {TRUST_ENV_SPEC_VAR: "1"}} if env_specs_trusted() else None
            ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False, runtime_env=trust)
        else:
            ray.init(num_cpus=num_cpus, include_dashboard=False, object_store_memory=LOCAL_OBJECT_STORE_BYTES, log_to_driver=False)
    return ray


__all__ = ["ensure_ray"]
