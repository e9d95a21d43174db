"""rlpipe: offline-RL and imitation-learning data pipeline."""

__version__ = "0.1.0"  # the package version (pyproject.toml reads it from here)

import rlpipe.envs  # noqa: F401  (registers GoalWorld-v0 with gymnasium)
