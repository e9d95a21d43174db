"""D4RL-style flat arrays of a dataset, the form d3rlpy's `MDPDataset` and D4RL users expect.

D4RL has `terminals` and `timeouts` and never both on one step; our rows may have both
(the MDP ended on the step the time limit ran out). Such a step is a termination: nothing
is bootstrapped past it, so `timeouts = truncated & ~terminated`.
"""

from __future__ import annotations

import numpy as np

from rlpipe.datasets.loader import TransitionArrays


def d4rl_arrays(data: TransitionArrays) -> dict[str, np.ndarray]:
    """observations, actions, rewards, next_observations, terminals, timeouts (flat observations only)."""
    if isinstance(data.obs, dict):
        raise TypeError("D4RL's layout has flat observations; flatten Dict observations first")
    terminated = np.asarray(data.terminated, dtype=bool)
    return {
        "observations": np.asarray(data.obs),
        "actions": np.asarray(data.action),
        "rewards": np.asarray(data.reward),
        "next_observations": np.asarray(data.next_obs),
        "terminals": terminated,
        "timeouts": np.asarray(data.truncated, dtype=bool) & ~terminated,
    }
