"""What model-based RL may know of an env without learning it: its reward and termination
as functions of batched tensors ``(obs, env_action, next_obs)``.

A learned model predicts Δobs and reward; termination is never learned, so an env can be
planned in or rolled out in only if it is listed in ``TERMINATION_FNS``. Where the reward is
a function of ``(obs, action, next_obs)`` (``REWARD_FNS``) it is used instead of the learned
one by default. Hopper-v5's is not: its forward reward reads the x position, which the
observation leaves out.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlpipe.errors import RlpipeError

EnvFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""``fn(obs [..., o], env_action [..., a], next_obs [..., o]) -> [...]``."""


def pendulum_reward(obs: torch.Tensor, action: torch.Tensor, next_obs: torch.Tensor) -> torch.Tensor:
    """Pendulum-v1's reward, -(theta^2 + 0.1 theta_dot^2 + 0.001 u^2), theta in [-pi, pi),
    from the observation (cos, sin, theta_dot) before the step."""
    theta = torch.atan2(obs[..., 1], obs[..., 0])
    u = action[..., 0].clamp(-2.0, 2.0)
    return -(theta.square() + 0.1 * obs[..., 2].square() + 0.001 * u.square())


def never_terminates(obs: torch.Tensor, action: torch.Tensor, next_obs: torch.Tensor) -> torch.Tensor:
    return torch.zeros(obs.shape[:-1], dtype=torch.bool, device=obs.device)


def inverted_pendulum_terminates(obs: torch.Tensor, action: torch.Tensor, next_obs: torch.Tensor) -> torch.Tensor:
    """InvertedPendulum-v5: the pole (next_obs[1]) beyond 0.2 rad, or a non-finite state."""
    return ~next_obs.isfinite().all(-1) | (next_obs[..., 1].abs() > 0.2)


def inverted_pendulum_reward(obs: torch.Tensor, action: torch.Tensor, next_obs: torch.Tensor) -> torch.Tensor:
    """InvertedPendulum-v5's reward: 1 on every step except the terminating one (0)."""
    return 1.0 - inverted_pendulum_terminates(obs, action, next_obs).float()


def hopper_terminates(obs: torch.Tensor, action: torch.Tensor, next_obs: torch.Tensor) -> torch.Tensor:
    """Hopper-v5 at its default health ranges: fallen (height next_obs[0] <= 0.7), torso
    angle (next_obs[1]) outside (-0.2, 0.2), or a state element outside (-100, 100)."""
    healthy = (next_obs[..., 0] > 0.7) & (next_obs[..., 1].abs() < 0.2) & (next_obs[..., 1:].abs() < 100.0).all(-1)
    return ~(healthy & next_obs.isfinite().all(-1))


REWARD_FNS: dict[str, EnvFn] = {"Pendulum-v1": pendulum_reward, "InvertedPendulum-v5": inverted_pendulum_reward}
TERMINATION_FNS: dict[str, EnvFn] = {
    "Pendulum-v1": never_terminates,
    "InvertedPendulum-v5": inverted_pendulum_terminates,
    "Hopper-v5": hopper_terminates,
}


def termination_fn(algo: str, env_id: str) -> EnvFn:
    """The known termination function of ``env_id``; an env without one is an RlpipeError
    (dynamics models here do not learn termination)."""
    if env_id not in TERMINATION_FNS:
        raise RlpipeError(
            f"{algo} needs a known termination function for {env_id} (the dynamics model does not learn "
            f"termination); known: {', '.join(sorted(TERMINATION_FNS))}"
        )
    return TERMINATION_FNS[env_id]


def reward_fn(algo: str, env_id: str, reward: str) -> EnvFn | None:
    """``reward="known"``: the env's reward function (an RlpipeError if it has none);
    ``"learned"``: None, the model's predicted reward is used; ``"auto"``: the known one
    where the env has it, else None."""
    if reward == "auto":
        return REWARD_FNS.get(env_id)
    if reward == "learned":
        return None
    if reward != "known":
        raise RlpipeError(f"{algo}: reward must be 'auto', 'known' or 'learned', got {reward!r}")
    if env_id not in REWARD_FNS:
        raise RlpipeError(
            f"{algo} has no known reward function for {env_id}; use --set reward=learned to plan with the "
            f"model's learned reward (known: {', '.join(sorted(REWARD_FNS))})"
        )
    return REWARD_FNS[env_id]
