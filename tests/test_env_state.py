"""A vector env's state as plain data (rlpipe.envs.state): a fresh env loaded with a running
env's record steps on exactly as the running one does; what cannot be recorded that way is
refused up front; a record that does not fit the live env is refused."""

from __future__ import annotations

import copy
import threading
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.classic_control.pendulum import PendulumEnv

from rlpipe.envs import make_vec_env
from rlpipe.envs.state import env_state, load_env_state
from rlpipe.envs.stepper import VecStepper
from rlpipe.errors import RlpipeError

ENVS = ["Pendulum-v1", "CartPole-v1", "GoalWorld-v0", "MountainCarContinuous-v0", "Acrobot-v1", "MountainCar-v0"]


def _obs_equal(a, b) -> bool:
    return all(np.array_equal(a[k], b[k]) for k in a) if isinstance(a, dict) else np.array_equal(a, b)


def _continuations_equal(env_id: str, load: bool) -> bool:
    """Step an env 150 steps, record it, load the record into a fresh env (seeded otherwise)
    and compare the next 250 steps and a draw from the action space."""
    live = VecStepper(make_vec_env(env_id, 3), None, 0)
    actions = [live.envs.action_space.sample() for _ in range(400)]
    for action in actions[:150]:
        live.step(action)
    state = copy.deepcopy(live.state_dict())  # as the file gives it: no array shared with the live env
    fresh = VecStepper(make_vec_env(env_id, 3), None, 5)
    if load:
        fresh.load_state_dict(state)
    for action in actions[150:]:
        a, b = live.step(action), fresh.step(action)
        if not (np.array_equal(a.rewards, b.rewards) and _obs_equal(a.next_obs, b.next_obs)):
            return False
    return np.array_equal(live.envs.action_space.sample(), fresh.envs.action_space.sample())


@pytest.mark.parametrize("env_id", ENVS)
def test_a_loaded_env_steps_on_exactly(env_id: str) -> None:
    assert _continuations_equal(env_id, load=True)
    assert not _continuations_equal(env_id, load=False)  # control: the fresh env alone differs


def test_the_record_is_plain_data() -> None:
    """Tagged tuples, dicts, lists, numbers, strings and NumPy data: nothing a file could not hold."""

    def plain(value) -> bool:
        if isinstance(value, (tuple, list)):
            return all(map(plain, value))
        if isinstance(value, dict):
            return all(type(k) in (str, int) and plain(v) for k, v in value.items())
        return value is None or type(value) in (bool, int, float, str) or isinstance(value, (np.ndarray, np.generic))

    envs = make_vec_env("Pendulum-v1", 2)
    envs.reset(seed=0)
    assert plain(env_state(envs))


class _LockedPendulum(PendulumEnv):
    """A Pendulum holding an object of no known kind (as a native handle would be)."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()


def test_an_env_that_cannot_be_recorded_is_refused() -> None:
    envs = gym.vector.SyncVectorEnv([_LockedPendulum])
    envs.reset(seed=0)
    with pytest.raises(RlpipeError, match=r"envs\[0\]\.lock is a lock"):
        env_state(envs)


def test_checkpoint_every_refuses_such_an_env_before_training(tmp_path: Path, cli) -> None:
    gym.register("rlpipe-test/LockedPendulum-v0", entry_point=_LockedPendulum, max_episode_steps=200)
    try:
        res = cli(
            "train",
            "sac",
            "--env",
            "rlpipe-test/LockedPendulum-v0",
            "--env-steps",
            "300",
            "--checkpoint-every",
            "100",
            "--device",
            "cpu",
            "--no-progress",
            "--out",
            str(tmp_path / "run"),
        )
    finally:
        del gym.registry["rlpipe-test/LockedPendulum-v0"]
    assert res.code == 2 and len(res.err.strip().splitlines()) == 1 and "lock is a lock" in res.err, res.err
    assert {p.name for p in tmp_path.iterdir()} <= {".locks", ".rlpipe-root"}  # a run root's bookkeeping, no run


def test_a_record_that_does_not_fit_is_refused() -> None:
    pendulum = make_vec_env("Pendulum-v1", 2)
    pendulum.reset(seed=0)
    record = env_state(pendulum)
    other = make_vec_env("Pendulum-v1", 3)  # one sub-env more
    other.reset(seed=0)
    with pytest.raises(RlpipeError, match="does not fit this env"):
        load_env_state(other, record)
    cartpole = make_vec_env("CartPole-v1", 2)
    cartpole.reset(seed=0)
    with pytest.raises(RlpipeError, match="does not fit this env"):
        load_env_state(cartpole, record)
