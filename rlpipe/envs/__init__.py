"""Environments: the ones the reference texts need that Gymnasium lacks (registered on
import), env construction with one-line errors, spaces (`spaces.py`) and the one
vector-env stepper (`stepper.py`). Torch-free, so collection and the dataset commands
start fast."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import gymnasium as gym
from gymnasium import spaces
from gymnasium.envs.registration import EnvSpec, load_env_creator

from rlpipe.errors import RlpipeError
from rlpipe.files import loads_json

if "GoalWorld-v0" not in gym.registry:
    gym.register(
        "GoalWorld-v0",
        entry_point="rlpipe.envs.goalworld:GoalWorldEnv",
        vector_entry_point="rlpipe.envs.goalworld:GoalWorldVectorEnv",
        max_episode_steps=50,
    )


def env_slug(env_id: str) -> str:
    """`CartPole-v1` -> `cartpole`: the short env name used in run and dataset names."""
    return env_id.split("/")[-1].split("-v")[0].lower()


@contextmanager
def _building(env_id: str) -> Iterator[None]:
    """Turn gymnasium's errors while building `env_id` into one clear RlpipeError."""
    try:
        yield
    except gym.error.DependencyNotInstalled as exc:
        raise RlpipeError(f"environment {env_id!r} needs an extra dependency: {exc}") from None
    except ImportError as exc:
        raise RlpipeError(f"environment {env_id!r} cannot be built here: {exc}") from None
    except gym.error.Error:
        raise RlpipeError(f"unknown environment {env_id!r} (not registered with gymnasium)") from None


def make_vec_env(env_id: str, num_envs: int = 1, **kwargs: Any) -> gym.vector.VectorEnv:
    """``gymnasium.make_vec`` with unknown ids turned into one clear RlpipeError.

    Uses the env's native vectorised implementation when it has one (e.g. CartPole),
    otherwise a SyncVectorEnv; both use the NEXT_STEP autoreset mode.
    """
    if num_envs < 1:
        raise RlpipeError(f"--num-envs must be >= 1, got {num_envs}")
    with _building(env_id):
        return gym.make_vec(env_id, num_envs=num_envs, **kwargs)


def make_env(env_id: str) -> gym.Env:
    """``gymnasium.make`` (one env, with its time limit) with the errors of `make_vec_env`."""
    with _building(env_id):
        return gym.make(env_id)


def has_native_vector_env(env_id: str) -> bool:
    """Whether `env_id` steps many copies as one numpy-batched env (a vector entry point,
    e.g. CartPole), so that adding envs costs little per step."""
    with _building(env_id):
        return gym.spec(env_id).vector_entry_point is not None


def env_spaces(env_id: str) -> tuple[spaces.Space, spaces.Space]:
    """(observation_space, action_space) of one ``env_id`` instance."""
    envs = make_vec_env(env_id, 1)
    try:
        return envs.single_observation_space, envs.single_action_space
    finally:
        envs.close()


SPEC_NAMESPACE = "dataset-"  # ids registered for specs that differ from the local registry's


def parse_env_spec(spec_json: str) -> EnvSpec:
    """An `EnvSpec.to_json()` string (from any gymnasium 1.x, keys it lacks ignored) as an EnvSpec."""
    known = {field.name for field in dataclasses.fields(EnvSpec) if field.init}
    try:
        fields = {key: value for key, value in loads_json(spec_json).items() if key in known}
        return EnvSpec.from_json(json.dumps(fields))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise RlpipeError(f"unreadable environment spec: {exc}") from None


def _spec_json(spec: EnvSpec) -> str | None:
    try:
        return spec.to_json()
    except (TypeError, ValueError):  # a callable entry point or kwargs JSON cannot hold
        return None


def env_id_for_spec(spec_json: str) -> str:
    """A registered gymnasium id whose env is exactly the one `spec_json` describes.

    The spec's own id when the local registry holds the same spec (registered here when the
    id is unknown, e.g. a dataset from an env rlpipe does not ship); otherwise the spec is
    registered as `dataset-<sha256[:8]>/<name>-v<N>` (say `max_episode_steps` differs), the
    same id for the same spec in every process.
    """
    spec = parse_env_spec(spec_json)
    wanted = _spec_json(spec)
    registered = gym.registry.get(spec.id)
    if registered is not None and _spec_json(registered) == wanted:
        return spec.id
    if registered is not None:
        digest = hashlib.sha256(str(wanted).encode()).hexdigest()[:8]
        version = "" if spec.version is None else f"-v{spec.version}"
        spec = dataclasses.replace(spec, id=f"{SPEC_NAMESPACE}{digest}/{spec.name}{version}")
    if spec.id not in gym.registry:
        try:
            if isinstance(spec.entry_point, str):
                load_env_creator(spec.entry_point)
        except (ImportError, AttributeError) as exc:
            raise RlpipeError(f"environment {spec.id!r} cannot be built here ({spec.entry_point}): {exc}") from None
        gym.registry[spec.id] = spec
    return spec.id


def base_env_id(env_id: str) -> str:
    """The id a spec was registered from: `dataset-<hash>/CartPole-v1` -> `CartPole-v1`."""
    namespace, _, rest = env_id.partition("/")
    return rest if rest and namespace.startswith(SPEC_NAMESPACE) else env_id


def env_spec_json(env_id: str) -> str | None:
    """The registered spec of `env_id` as JSON (None when it is unknown or not serialisable)."""
    return _spec_json(gym.spec(env_id)) if env_id in gym.registry else None
