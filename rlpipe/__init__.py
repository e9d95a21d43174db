"""rlpipe: offline-RL and imitation-learning data pipeline.

The Python API (`rlpipe.api`) is available on the package itself: ``rlpipe.collect``,
``rlpipe.load_dataset``, ``rlpipe.sampler``, ``rlpipe.train``, ``rlpipe.load_policy``,
``rlpipe.evaluate``, ... Each is imported on first use, so ``import rlpipe`` does not import torch.
"""

from typing import Any

import rlpipe.envs  # noqa: F401  (registers GoalWorld-v0 with gymnasium)
from rlpipe.version import __version__

API = (
    "DatasetInfo",
    "TransitionArrays",
    "collect",
    "evaluate",
    "list_datasets",
    "load_dataset",
    "load_policy",
    "make_config",
    "open_dataset",
    "sampler",
    "train",
)


def __getattr__(name: str) -> Any:
    if name in API:
        import rlpipe.api

        return getattr(rlpipe.api, name)
    raise AttributeError(f"module 'rlpipe' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *API])


__all__ = ["__version__", *API]
