"""One module per algorithm, and the registry that describes them (:mod:`rlpipe.algos.registry`).

``get_algo(name)`` gives an algorithm's :class:`AlgoSpec` (its config class, tuned
defaults, ``make_config``, ``train`` and capabilities); ``load_policy(run_dir)`` loads
the policy of any saved run. Importing the package does not import torch: the
algorithm modules and :class:`LoadedPolicy` are imported on first use.
"""

from typing import Any

from rlpipe.algos.registry import OFFLINE, ONLINE, REGISTRY, SPECS, AlgoSpec, get_algo, load_policy


def __getattr__(name: str) -> Any:
    if name == "LoadedPolicy":
        from rlpipe.algos.policy import LoadedPolicy

        return LoadedPolicy
    raise AttributeError(f"module 'rlpipe.algos' has no attribute {name!r}")


__all__ = ["AlgoSpec", "LoadedPolicy", "OFFLINE", "ONLINE", "REGISTRY", "SPECS", "get_algo", "load_policy"]
