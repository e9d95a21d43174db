"""Environments the reference texts need that Gymnasium lacks, registered on import."""

import gymnasium as gym

if "GoalWorld-v0" not in gym.registry:
    gym.register(
        "GoalWorld-v0",
        entry_point="rlpipe.envs.goalworld:GoalWorldEnv",
        vector_entry_point="rlpipe.envs.goalworld:GoalWorldVectorEnv",
        max_episode_steps=50,
    )
