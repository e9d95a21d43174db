"""Typed run configuration: the fields every training run shares, the per-env tuned
defaults, and ``KEY=VALUE`` overrides parsed and checked against a config's field types.

Every algorithm's ``Config`` extends :class:`OnlineConfig` (budget: env steps) or
:class:`OfflineConfig` (budget: gradient updates on a stored dataset); GAIL, which learns
from a dataset but trains in the env, extends PPO's config with :class:`DatasetFields`.
"""

from __future__ import annotations

import math
import types
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml

from rlpipe.envs import base_env_id
from rlpipe.errors import ArgumentError, ArgumentTypeError, RlpipeError
from rlpipe.limits import (
    MAX_BATCH_SIZE,
    MAX_BUFFER_SIZE,
    MAX_COPIES,
    MAX_ENV_STEPS,
    MAX_EPISODES,
    MAX_LAYER_WIDTH,
    MAX_LAYERS,
    MAX_RANKS,
    MAX_SEED,
    MAX_UPDATES,
    check_num_envs,
    check_seed,
    max_torch_threads,
)

C = TypeVar("C", bound="RunConfig")
T = TypeVar("T")

POSITIVE = types.MappingProxyType({"positive": True})  # field metadata: the value (each element of a tuple) must be > 0


# Bounds of fields that every algorithm redeclares with its own default (so not in their
# metadata), and of the counts that size an update's tensors or repeat its steps. Any other
# integer field (a schedule in steps, such as eval_every) is at most MAX_ENV_STEPS.
FIELD_LIMITS: dict[str, int | None] = {
    "updates": MAX_UPDATES,
    "env_steps": MAX_ENV_STEPS,
    "batch_size": MAX_BATCH_SIZE,
    "eval_episodes": MAX_EPISODES,
    "heldout_eval_episodes": MAX_EPISODES,
    "seed": MAX_SEED,  # check_seed's range
    "num_envs": None,  # check_num_envs's range, in its words
    **dict.fromkeys(("num_epochs", "iterations", "model_patience", "disc_updates"), MAX_UPDATES),
    **dict.fromkeys(
        (
            "members",
            "elites",
            "n_critics",
            "quantiles",
            "num_sampled_actions",
            "n_candidates",
            "act_candidates",
            "population",
            "particles",
            "horizon",
        ),
        MAX_COPIES,
    ),
    **dict.fromkeys(("recurrent_hidden", "embedding_dim"), MAX_LAYER_WIDTH),
    **dict.fromkeys(("layers", "heads"), MAX_LAYERS),
    **dict.fromkeys(("model_batch_size", "rollout_batch", "minibatch_size"), MAX_BATCH_SIZE),
    **dict.fromkeys(("num_steps", "model_retain", "rollout_length"), MAX_BUFFER_SIZE),
}


def check_fractions(config: object, *names: str) -> None:
    """An RlpipeError unless each named field of ``config`` is a number in [0, 1] (None: unset)."""
    for name in names:
        value = getattr(config, name)
        if value is not None and not 0.0 <= value <= 1.0:
            raise RlpipeError(f"setting {name}={value!r}: expected a number in [0, 1]")


def positive(default: T, at_most: int | None = None) -> T:
    """A config field whose value (each element, for layer sizes) must be > 0 (and at most
    ``at_most``): budgets, sizes, rates, schedules. A subclass that changes the default
    declares it so again."""
    return field(default=default, metadata=POSITIVE if at_most is None else {**POSITIVE, "at_most": at_most})


def layer_sizes(default: tuple[int, ...]) -> tuple[int, ...]:
    """A hidden-layer sizes field: each width from 1 to rlpipe.limits.MAX_LAYER_WIDTH."""
    return positive(default, at_most=MAX_LAYER_WIDTH)


def buffer_capacity(default: int) -> int:
    """A replay buffer's rows: from 1 to rlpipe.limits.MAX_BUFFER_SIZE."""
    return positive(default, at_most=MAX_BUFFER_SIZE)


# Where a run's curve goes (rlpipe.training.loggers); TensorBoard and W&B need their extras.
LoggerName = Literal["dvclive", "tensorboard", "wandb"]
# Which checkpoint a run on data with no environment keeps: its last, the lowest validation
# action error, or the highest FQE estimate (rlpipe.training.validation).
SelectBy = Literal["last", "val_loss", "fqe"]
# The arithmetic of a run's updates: float32, or the networks' matrix products in bfloat16
# (rlpipe.training.optim.autocast; weights, optimiser state, output layers and losses in float32).
Precision = Literal["fp32", "bf16"]

# Fields set only by their own command option, never by a setting: field -> that option.
NOT_SETTABLE = {"env_id": "--env (offline: the dataset's metadata)", "dataset": "--dataset", "store": "--store"}


@dataclass
class RunConfig:
    """What every training run has: where, how seeded, on what device, how evaluated."""

    env_id: str = ""  # online: the env trained in; offline: filled from the dataset's metadata
    seed: int = 0
    device: str = "cpu"
    torch_threads: int = positive(1)
    precision: Precision = "fp32"  # bf16: mixed precision, where the CPU (AMX, AVX512-BF16) or GPU multiplies bf16 faster
    eval_every: int = positive(1_000)  # in the run's unit: env steps online, gradient updates offline
    eval_episodes: int = positive(10)
    # After training, this many episodes on seeds neither training nor the periodic evaluation
    # (which settings were tuned and early stopping decided on) used: the figure to report.
    # 0 skips it (a costly evaluator, e.g. a planner).
    heldout_eval_episodes: int = 100
    stop_at_return: float | None = None  # stop early once the eval mean return reaches this
    checkpoint_every: int | None = positive(None)  # save the full training state this often (run's unit): resumable
    loggers: tuple[LoggerName, ...] = ("dvclive",)  # the eval curve's sinks, each at most once; () logs none

    def __post_init__(self) -> None:
        if isinstance(self.loggers, str):  # loggers="tensorboard" from Python
            self.loggers = (self.loggers,)
        self.loggers = tuple(dict.fromkeys(self.loggers))
        check_device(self.device)
        check_values(self)


def check_device(device: str) -> None:
    """``auto``, ``cpu`` or ``cuda[:N]``, else an RlpipeError: checked when a config is built, so
    a sweep refuses a misspelt device before it writes anything (whether CUDA is there is
    :func:`rlpipe.training.env.resolve_device`'s check, where the run starts)."""
    if not isinstance(device, str):
        raise ArgumentTypeError(f"device={device!r}: expected auto, cpu or cuda")
    if device not in ("auto", "cpu") and not device.startswith("cuda"):
        raise ArgumentError(f"unknown device {device!r}; use auto, cpu or cuda")


@dataclass
class OnlineConfig(RunConfig):
    """A run that learns by acting in ``num_envs`` vectorised envs for ``env_steps`` steps."""

    env_steps: int = positive(10_000)
    num_envs: int = positive(1)
    # Evaluate (and stop at stop_at_return) on the policy's sampled actions instead of its mode:
    # D4RL chose its medium policies by the return of the actions they then collected with.
    eval_sampled_actions: bool = False


@dataclass
class DatasetFields:
    """Which stored dataset a run learns from."""

    dataset: str = ""
    store: str | None = None  # default: $RLPIPE_DATASETS or ./datasets
    max_samples: int | None = positive(None)  # train on a subset (leading whole episodes; the text: 30 pairs)


@dataclass
class OfflineConfig(DatasetFields, RunConfig):
    """A run of ``updates`` gradient updates on a stored dataset."""

    updates: int = positive(10_000)
    # Processes of one data-parallel run (rlpipe.training.distributed), batch_size split among them.
    nproc: int = positive(1, at_most=MAX_RANKS)
    # On data with no environment (rlpipe.training.validation): the share of episodes held out,
    # FQE's updates over the checkpoints (0: none), and which checkpoint the run keeps.
    validation_fraction: float = 0.1
    fqe_updates: int = field(default=15_000, metadata={"at_most": MAX_UPDATES})
    select_by: SelectBy = "last"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 < self.validation_fraction < 1.0:
            raise RlpipeError(f"setting validation_fraction={self.validation_fraction!r}: expected a number between 0 and 1")
        if self.fqe_updates < 0:
            raise RlpipeError(f"setting fqe_updates={self.fqe_updates!r}: expected an integer >= 0")
        if self.select_by == "fqe" and self.fqe_updates == 0:
            raise RlpipeError("select_by=fqe needs fqe_updates > 0")


@dataclass
class FinetuneFields:
    """Offline-to-online: after its ``updates``, the run goes on in the dataset's env for
    ``finetune_env_steps`` steps (one update per step on the dataset plus what it collected)."""

    # 0: offline only. Each step is a row of the online buffer (rlpipe.limits.MAX_BUFFER_SIZE at most).
    finetune_env_steps: int = field(default=0, metadata={"at_most": MAX_BUFFER_SIZE})
    finetune_eval_every: int = 1_000  # env steps between evaluations while fine-tuning
    # The share of each fine-tuning minibatch drawn from the dataset, the rest from the online
    # rows (CORL's mixing_ratio, 0.5 in its configs); None: uniform over both, as if appended.
    finetune_mixing_ratio: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[misc]
        if self.finetune_env_steps < 0:
            raise RlpipeError(f"setting finetune_env_steps={self.finetune_env_steps!r}: expected a number >= 0")
        if self.finetune_eval_every < 1:
            raise RlpipeError(f"setting finetune_eval_every={self.finetune_eval_every!r}: expected a positive number")
        check_fractions(self, "finetune_mixing_ratio")


def _type_name(tp: Any) -> str:
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        return " or ".join(repr(a) for a in args)
    if origin in (Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _type_name(a) for a in args)
    if origin is tuple:
        return f"list of {_type_name(args[0])}"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any) -> Any:
    """``value`` (as YAML read it) as type ``tp``; raises ValueError when it is not one."""
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        if value not in args:
            raise ValueError
        return value
    if origin in (Union, types.UnionType):
        return _coerce_union(value, args)
    if origin is tuple:
        items = value if isinstance(value, (list, tuple)) else [value]
        return tuple(_coerce(item, args[0]) for item in items)
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 3e-4 as a string
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError
        return float(value)
    # bool, int and str as themselves (a bool is not an int here)
    if tp in (bool, int, str) and isinstance(value, tp) and (tp is bool or not isinstance(value, bool)):
        return value
    raise ValueError


def _coerce_union(value: Any, args: tuple[Any, ...]) -> Any:
    """``value`` as the first member of a union that takes it (null where the union allows it)."""
    if value is None and type(None) in args:
        return None
    for arg in (a for a in args if a is not type(None)):
        try:
            return _coerce(value, arg)
        except ValueError:
            pass
    raise ValueError


def field_types(cls: type) -> dict[str, Any]:
    """Field name -> declared type of a config dataclass."""
    hints = get_type_hints(cls, include_extras=False)
    return {f.name: hints[f.name] for f in fields(cls)}


def typed_value(cls: type, key: str, value: Any) -> Any:
    """``value`` for field ``key`` of config class ``cls``, checked against its declared type;
    an unknown key or a value of the wrong type is an `ArgumentError` (an RlpipeError, and a
    ValueError to Python callers) naming both."""
    types_ = field_types(cls)
    if key in NOT_SETTABLE and key in types_:
        raise ArgumentError(f"setting {key}: not a setting, use {NOT_SETTABLE[key]}")
    if key not in types_:
        raise ArgumentError(f"unknown setting {key!r}; known: {', '.join(sorted(set(types_) - set(NOT_SETTABLE)))}")
    try:
        return _coerce(value, types_[key])
    except (ValueError, TypeError):
        raise ArgumentError(f"setting {key}={value!r}: expected {_type_name(types_[key])}") from None


@contextmanager
def refused_settings() -> Iterator[None]:
    """Build or replace a config inside this block: what its own checks (``__post_init__``)
    refuse, plain RlpipeErrors, leaves as an `ArgumentError` (a ValueError to Python callers)
    with the same words; a subclass (an output's kind) leaves as it is."""
    try:
        yield
    except RlpipeError as exc:
        if type(exc) is not RlpipeError:
            raise
        raise ArgumentError(str(exc)) from None


def parse_settings(pairs: list[str], cls: type) -> dict[str, Any]:
    """``KEY=VALUE`` strings -> typed overrides for ``cls`` (values read as YAML: 3e-4,
    [64, 64], null, true); a bad pair, unknown key or wrong type is an RlpipeError."""
    settings: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise RlpipeError(f"--set expects KEY=VALUE, got {pair!r}")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        settings[key] = typed_value(cls, key, value)
    return settings


def check_values(config: RunConfig) -> None:
    """Raise an RlpipeError naming the first field out of range: a :func:`positive` field
    must be > 0 (each element, for layer sizes), floats finite, ``heldout_eval_episodes`` >= 0,
    ``seed`` and ``num_envs`` within rlpipe.limits, and a Literal field (each element, for a tuple of them) one of its choices."""
    check_seed(config.seed, "setting seed")
    if config.heldout_eval_episodes < 0:
        raise RlpipeError(f"setting heldout_eval_episodes={config.heldout_eval_episodes!r}: expected an integer >= 0")
    types_ = field_types(type(config))
    for declared in fields(config):
        name, tp, value = declared.name, types_[declared.name], getattr(config, declared.name)
        element = get_args(tp)[0] if get_origin(tp) is tuple else None  # tuple[Literal[...], ...]: each element one of them
        if (get_origin(tp) is Literal and value not in get_args(tp)) or (
            get_origin(element) is Literal and not (isinstance(value, tuple) and all(item in get_args(element) for item in value))
        ):
            raise RlpipeError(f"setting {name}={value!r}: expected {_type_name(tp)}")
        items = value if isinstance(value, tuple) else (value,)
        for item in items:
            if isinstance(item, float) and not math.isfinite(item):
                raise RlpipeError(f"setting {name}={value!r}: expected a finite number")
            if declared.metadata.get("positive") and isinstance(item, (int, float)) and not isinstance(item, bool) and item <= 0:
                raise RlpipeError(f"setting {name}={value!r}: expected a positive number")
            if isinstance(item, int) and not isinstance(item, bool) and item < 0:  # no count is negative
                raise RlpipeError(f"setting {name}={value!r}: expected an integer >= 0")
            at_most = (
                max_torch_threads() if name == "torch_threads" else declared.metadata.get("at_most", FIELD_LIMITS.get(name, MAX_ENV_STEPS))
            )
            if isinstance(item, int) and at_most is not None and item > at_most:
                raise RlpipeError(
                    f"setting {name}={value!r}: expected at most {at_most}" + (" per layer" if isinstance(value, tuple) else "")
                )
    if hasattr(config, "num_envs"):
        check_num_envs(config.num_envs, "setting num_envs")


def config_for_env(cls: type[C], tuned: Mapping[str, Mapping[str, Any]], env_id: str, **overrides: Any) -> C:
    """Build ``cls(env_id=..)`` from the per-env tuned table, then non-None ``overrides``.

    Unknown keys and values a field refuses are an `ArgumentError` (an RlpipeError, and a
    ValueError to Python callers) naming the field: typos must not be silently ignored.
    """
    names = {f.name for f in fields(cls)}
    values = {**tuned.get(base_env_id(env_id), {}), **{k: v for k, v in overrides.items() if v is not None}}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ArgumentError(f"unknown {cls.__module__.rsplit('.', 1)[-1]} option(s): {', '.join(unknown)}")
    with refused_settings():
        return cls(env_id=env_id, **values)


__all__ = [
    "DatasetFields",
    "LoggerName",
    "OfflineConfig",
    "OnlineConfig",
    "RunConfig",
    "buffer_capacity",
    "layer_sizes",
    "check_device",
    "check_values",
    "config_for_env",
    "field_types",
    "parse_settings",
    "positive",
    "typed_value",
]
