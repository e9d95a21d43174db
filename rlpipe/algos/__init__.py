"""One module per algorithm, and the registry that describes them (:mod:`rlpipe.algos.registry`).

``get_algo(name)`` gives an algorithm's :class:`AlgoSpec` (its config class, tuned
defaults, ``make_config``, ``train`` and capabilities); ``load_policy(run_dir)`` loads
the policy of any saved run.
"""

from rlpipe.algos.policy import LoadedPolicy
from rlpipe.algos.registry import OFFLINE, ONLINE, REGISTRY, SPECS, AlgoSpec, get_algo, load_policy

__all__ = ["AlgoSpec", "LoadedPolicy", "OFFLINE", "ONLINE", "REGISTRY", "SPECS", "get_algo", "load_policy"]
