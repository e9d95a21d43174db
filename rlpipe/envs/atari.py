"""Atari 2600 games (ale-py, the `atari` extra) with the standard DQN preprocessing, as rlpipe ids.

`rlpipe/<Game>-atari-v5` is ALE's `ALE/<Game>-v5` (sticky actions 0.25, the minimal action set,
108,000 frames at most) built with frameskip 1 and wrapped in gymnasium's AtariPreprocessing: up
to 30 no-ops on reset, 4 frames per step (the last two max-pooled), 84x84 grayscale uint8 frames
of shape (84, 84, 1), no episode end on a lost life, no scaling, and FIRE pressed once after each
reset and lost life in games that have it (Breakout waits for it to serve). Every setting is a kwarg of the
registered spec, so the spec a dataset or run records rebuilds the same preprocessing. The ids
are registered the first time one of them (or an `ALE/` id) is used (rlpipe.envs.extras).
"""

from __future__ import annotations

from typing import Any, Literal, SupportsFloat

import gymnasium as gym
from gymnasium.wrappers import AtariPreprocessing

ATARI_SUFFIX = "-atari"  # rlpipe/Breakout-atari-v5: an ALE game with rlpipe's preprocessing
# The preprocessing of Mnih et al. (2015) as Machado et al. (2018) revisit it: frames are stacked by rlpipe's samplers.
PREPROCESSING = {"noop_max": 30, "frame_skip": 4, "screen_size": 84, "terminal_on_life_loss": False, "fire_reset": True}


class FireReset(gym.Wrapper):
    """Press FIRE once after each reset and each lost life that does not end the episode, as
    SB3's FireResetEnv with EpisodicLifeEnv: games such as Breakout wait for FIRE to serve, and a
    policy that never picks it would idle until the frame limit. The FIRE step's reward is added
    to the step that lost the life (on reset it is dropped, as in SB3: a serve scores nothing);
    sticky actions can swallow the press, and the agent's own FIRE then serves."""

    def __init__(self, env: gym.Env, fire: int) -> None:
        super().__init__(env)
        self.fire = fire  # FIRE's index in the env's action set
        self.lives = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        served, _, terminated, truncated, served_info = self.env.step(self.fire)
        if terminated or truncated:  # a serve that ends the game (no ALE game known): start again, as SB3 does
            obs, info = self.env.reset(options=options)
        else:
            obs, info = served, {**info, "lives": served_info["lives"]}
        self.lives = info["lives"]
        return obs, info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        if info["lives"] < self.lives and not (terminated or truncated):
            obs, fire_reward, terminated, truncated, info = self.env.step(self.fire)
            reward = float(reward) + float(fire_reward)
        self.lives = info["lives"]
        return obs, reward, terminated, truncated, info


def atari_id(game: str) -> str:
    """`Breakout` -> `rlpipe/Breakout-atari-v5`: the preprocessed id of an ALE v5 game name."""
    return f"rlpipe/{game}{ATARI_SUFFIX}-v5"


def is_atari_id(env_id: str) -> bool:
    """Whether `env_id` is an ALE game (`ALE/Pong-v5`) or one of rlpipe's preprocessed ones."""
    namespace, _, rest = env_id.rpartition("/")
    return namespace == "ALE" or (namespace == "rlpipe" and rest.split("-v")[0].endswith(ATARI_SUFFIX))


def make_atari(
    game: str,
    repeat_action_probability: float = 0.25,
    full_action_space: bool = False,
    max_num_frames_per_episode: int | None = None,
    noop_max: int = 30,
    frame_skip: int = 4,
    screen_size: int = 84,
    terminal_on_life_loss: bool = False,
    fire_reset: bool = False,
    render_mode: Literal["human", "rgb_array"] | None = None,
) -> gym.Env:
    """The entry point of `rlpipe/<Game>-atari-v5`: ALE's game at frameskip 1 (the wrapper skips
    frames, max-pooling the last two) in AtariPreprocessing with uint8 (84, 84, 1) observations,
    then FireReset with `fire_reset` where the game has FIRE. `fire_reset` defaults to off here so
    that specs recorded before it existed rebuild without it; the registered ids turn it on."""
    from ale_py.env import AtariEnv

    env = AtariEnv(
        game=game,
        frameskip=1,
        repeat_action_probability=repeat_action_probability,
        full_action_space=full_action_space,
        max_num_frames_per_episode=max_num_frames_per_episode,
        render_mode=render_mode,
    )
    preprocessed = AtariPreprocessing(
        env,
        noop_max=noop_max,
        frame_skip=frame_skip,
        screen_size=screen_size,
        terminal_on_life_loss=terminal_on_life_loss,
        grayscale_obs=True,
        grayscale_newaxis=True,
        scale_obs=False,
    )
    meanings = env.get_action_meanings()
    return FireReset(preprocessed, meanings.index("FIRE")) if fire_reset and "FIRE" in meanings else preprocessed


def register_atari_envs() -> None:
    """Register ALE's ids and `rlpipe/<Game>-atari-v5` for each ALE v5 game; ImportError
    without ale-py. ALE's start-up banner (its Info log) is turned off: errors and warnings stay."""
    import ale_py

    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Warning)
    gym.register_envs(ale_py)
    for spec in list(gym.registry.values()):
        if spec.namespace == "ALE" and spec.version == 5 and atari_id(spec.name) not in gym.registry:
            ale_kwargs = {key: value for key, value in spec.kwargs.items() if key != "frameskip"}
            gym.register(atari_id(spec.name), entry_point="rlpipe.envs.atari:make_atari", kwargs={**ale_kwargs, **PREPROCESSING})
