"""Environments: the ones the reference texts need that Gymnasium lacks and partially
observed variants (`masked.py`), registered on import; optional families (MinAtar, Atari:
`extras.py`, `atari.py`), registered on first use; env construction with one-line errors,
spaces (`spaces.py`) and the one vector-env stepper (`stepper.py`). Torch-free, so
collection and the dataset commands start fast."""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import gymnasium as gym
from gymnasium import spaces
from gymnasium.envs.registration import EnvSpec, load_env_creator

from rlpipe.envs import masked as _masked  # noqa: F401  (registers rlpipe/CartPoleNoVel-v1, rlpipe/PendulumNoVel-v1)
from rlpipe.envs.extras import missing_dependency_message, register_optional
from rlpipe.errors import ArgumentError, RlpipeError
from rlpipe.storage.files import loads_json

if "GoalWorld-v0" not in gym.registry:
    gym.register(
        "GoalWorld-v0",
        entry_point="rlpipe.envs.goalworld:GoalWorldEnv",
        vector_entry_point="rlpipe.envs.goalworld:GoalWorldVectorEnv",
        max_episode_steps=50,
    )


def env_slug(env_id: str) -> str:
    """`CartPole-v1` -> `cartpole`: the short env name used in run and dataset names
    (`MinAtar/Breakout-v1` -> `minatar-breakout`, apart from Atari's `breakout-atari`)."""
    name = env_id.split("/")[-1].split("-v")[0].lower()
    return f"minatar-{name}" if base_env_id(env_id).startswith("MinAtar/") else name


@contextmanager
def _building(env_id: str) -> Iterator[None]:
    """Turn gymnasium's errors while building `env_id` into one clear RlpipeError (an env of
    an optional package names the rlpipe extra that brings it)."""
    register_optional(base_env_id(env_id))
    try:
        yield
    except gym.error.DependencyNotInstalled as exc:
        raise RlpipeError(missing_dependency_message(base_env_id(env_id), str(exc))) from None
    except TypeError as exc:
        if not env_id.startswith(SPEC_NAMESPACE):  # a registered env's own settings: a bug, with its traceback
            raise
        reason = " ".join(str(exc).split())
        raise RlpipeError(
            f"environment {base_env_id(env_id)!r} cannot be built with the settings of its recorded env spec: {reason}"
        ) from None
    except ImportError as exc:
        raise RlpipeError(f"environment {env_id!r} cannot be built here: {exc}") from None
    except gym.error.Error:
        raise ArgumentError(f"unknown environment {env_id!r} (not registered with gymnasium)") from None


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
_DIGEST_CHARS = 8  # of the spec's sha256 in such an id
TRUST_ENV_SPEC_VAR = "RLPIPE_TRUST_ENV_SPEC"
TRUST_HINT = (
    "rlpipe builds envs from datasets and runs only by their registered entry points; if you trust "
    f"where this came from, pass --trust-env-spec (or set {TRUST_ENV_SPEC_VAR}=1)"
)


def env_specs_trusted() -> bool:
    """Whether env specs and ids read from datasets and runs may name code that is not
    registered here (`--trust-env-spec` or RLPIPE_TRUST_ENV_SPEC=1)."""
    return os.environ.get(TRUST_ENV_SPEC_VAR) == "1"


def trust_env_specs() -> None:
    """Trust recorded env specs in this process and in the worker processes it starts
    (sweep and collection workers inherit the environment)."""
    os.environ[TRUST_ENV_SPEC_VAR] = "1"


def parse_env_spec(spec_json: str) -> EnvSpec:
    """An `EnvSpec.to_json()` string (from any gymnasium 1.x, keys it lacks ignored) as an
    EnvSpec. Only parses: nothing the spec names is imported."""
    known = {field.name for field in dataclasses.fields(EnvSpec) if field.init}
    try:
        fields = {key: value for key, value in loads_json(spec_json).items() if key in known}
        spec = EnvSpec.from_json(json.dumps(fields))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise RlpipeError(f"unreadable environment spec: {exc}") from None
    steps = spec.max_episode_steps
    if not isinstance(spec.kwargs, dict) or not (steps is None or (type(steps) is int and steps > 0)):
        raise RlpipeError(
            f"unreadable environment spec of {spec.id!r}: kwargs must be an object, max_episode_steps a positive integer or null"
        )
    return spec


def _unregistered_code(spec: EnvSpec) -> str | None:
    """What in `spec` names code other than the registered env of its id (None: nothing), so
    that building it would import and run that code. The spec's other fields (kwargs, time
    limit) are plain JSON values, handed to the registered constructor as `gymnasium.make` would.
    An id of an optional env family that registers on first use (FetchReach-v4) is registered
    first, as building it would."""
    register_optional(base_env_id(spec.id))
    registered = gym.registry.get(base_env_id(spec.id))
    if registered is None:
        return f"{spec.id!r} is not registered here and its entry point is {spec.entry_point!r}"
    if spec.entry_point != registered.entry_point:
        return f"its entry point {spec.entry_point!r} for {spec.id!r} is not the registered {registered.entry_point!r}"
    if spec.vector_entry_point not in (None, registered.vector_entry_point):
        return f"its vector entry point {spec.vector_entry_point!r} for {spec.id!r} is not the registered {registered.vector_entry_point!r}"
    if spec.additional_wrappers not in ((), registered.additional_wrappers):
        return f"it wraps {spec.id!r} in {', '.join(repr(wrapper.entry_point) for wrapper in spec.additional_wrappers)}"
    return None


# Keys of a spec's kwargs that `gymnasium.make_vec` takes for itself, not handed to the env.
_MAKE_VEC_KEYS = frozenset({"num_envs", "vectorization_mode", "vector_kwargs", "wrappers"})


def _unknown_kwargs(spec: EnvSpec) -> tuple[str, list[str]] | None:
    """(constructor, names) when the spec's kwargs name arguments that its env's constructor
    (the entry point; the vector entry point when it has none) does not take, which building it
    would fail on; None when they all fit or cannot be told (a constructor taking ``**kwargs``,
    one not importable here: building it says why). Only for specs already trusted: it imports
    their modules. (A vector entry point that takes less than its entry point fails when built:
    `_building`.)"""
    names = set(spec.kwargs) - _MAKE_VEC_KEYS
    entry_point = spec.entry_point if spec.entry_point is not None else spec.vector_entry_point
    if not names or not isinstance(entry_point, str):
        return None
    try:
        parameters = inspect.signature(load_env_creator(entry_point)).parameters.values()
    except Exception:  # an import error or a constructor without a signature: building it reports that
        return None
    if any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters):
        return None
    keywords = {parameter.name for parameter in parameters if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)}
    unknown = sorted(names - keywords)
    return (entry_point, unknown) if unknown else None


def trusted_env_spec(spec_json: str, source: str, where: str | None = None) -> EnvSpec:
    """The env spec that `source` (a dataset or run, for the message) recorded, refused with
    one line when it names code that is not registered here, unless env specs are trusted,
    or when it is not a readable spec (the message names `where`, the file and field it was
    read from, when given). Checked before anything is imported: importing a spec's module
    already runs its code."""
    try:
        spec = parse_env_spec(spec_json)
    except RlpipeError as exc:
        raise RlpipeError(f"{where or source}: {exc}") from None
    problem = _unregistered_code(spec)
    if problem is not None and not env_specs_trusted():
        raise RlpipeError(f"{source} has an untrusted env spec: {problem}; {TRUST_HINT}")
    return spec


def trusted_env_id(env_id: str, source: str) -> str:
    """`env_id` as `source` recorded it, refused with one line when it names a module to import
    (gymnasium's `module:Env-v0` form), unless env specs are trusted."""
    if ":" in env_id and not env_specs_trusted():
        raise RlpipeError(f"{source} names env {env_id!r}, which would import module {env_id.split(':')[0]!r}; {TRUST_HINT}")
    return env_id


def recorded_env_id(env_id: str, spec_json: str | None, source: str, where: str | None = None) -> str:
    """The registered id under which to build the env that `source` (a dataset or run)
    recorded: from its spec when it has one (`env_id_for_spec`, `where` naming the file and
    field it was read from; the spec must be of `env_id`), else its id, each refused when it
    would run unregistered code and env specs are not trusted."""
    if not spec_json:
        return trusted_env_id(env_id, source)
    built = env_id_for_spec(spec_json, source, where)
    if base_env_id(built) != base_env_id(env_id):
        raise RlpipeError(f"{source} names env {env_id!r}, but its env spec is of {base_env_id(built)!r}")
    return built


def _spec_json(spec: EnvSpec) -> str | None:
    try:
        return spec.to_json()
    except (TypeError, ValueError):  # a callable entry point or kwargs JSON cannot hold
        return None


def env_id_for_spec(spec_json: str, source: str = "the environment spec", where: str | None = None) -> str:
    """A registered gymnasium id whose env is exactly the one `spec_json` describes.

    The spec's own id when the local registry holds the same spec; otherwise the spec is
    registered as `dataset-<sha256[:8]>/<name>-v<N>` (say `max_episode_steps` differs;
    `dataset-<sha256[:8]>-<namespace>/...` for a namespaced id), the same id for the same spec
    in every process. A spec whose code is not the registered env's (an id unknown here,
    another entry point or wrappers) is refused by
    `trusted_env_spec` unless env specs are trusted; a trusted one of an unknown id is
    registered under its own id. Kwargs that the env's constructor does not take are refused
    in one line naming `where` (the file and field the spec was read from) or `source`.
    """
    spec = trusted_env_spec(spec_json, source, where)
    unknown = _unknown_kwargs(spec)
    if unknown is not None:
        entry_point, names = unknown
        raise RlpipeError(
            f"{where or f'{source} (its env_spec)'}: the env spec of {spec.id!r} passes keyword arguments that "
            f"{entry_point} does not take: {', '.join(names)}"
        )
    wanted = _spec_json(spec)
    registered = gym.registry.get(spec.id)
    if registered is not None and _spec_json(registered) == wanted:
        return spec.id
    if registered is not None:
        digest = hashlib.sha256(str(wanted).encode()).hexdigest()[:_DIGEST_CHARS]
        version = "" if spec.version is None else f"-v{spec.version}"
        namespace = f"{SPEC_NAMESPACE}{digest}" + (f"-{spec.namespace}" if spec.namespace else "")
        spec = dataclasses.replace(spec, id=f"{namespace}/{spec.name}{version}")
    if spec.id not in gym.registry:
        try:
            if isinstance(spec.entry_point, str):
                load_env_creator(spec.entry_point)
        except (ImportError, AttributeError, ValueError) as exc:
            raise RlpipeError(f"environment {spec.id!r} cannot be built here ({spec.entry_point}): {exc}") from None
        gym.registry[spec.id] = spec
    return spec.id


def base_env_id(env_id: str) -> str:
    """The id a spec was registered from: `dataset-<hash>/CartPole-v1` -> `CartPole-v1`,
    `dataset-<hash>-MinAtar/Breakout-v1` -> `MinAtar/Breakout-v1`."""
    namespace, _, rest = env_id.partition("/")
    if not (rest and namespace.startswith(SPEC_NAMESPACE)):
        return env_id
    original = namespace[len(SPEC_NAMESPACE) + _DIGEST_CHARS + 1 :]
    return f"{original}/{rest}" if original else rest


def env_spec_json(env_id: str) -> str | None:
    """The registered spec of `env_id` as JSON (None when it is unknown or not serialisable).
    An id of an optional family that registers on first use is registered here."""
    register_optional(base_env_id(env_id))
    return _spec_json(gym.spec(env_id)) if env_id in gym.registry else None
