"""Env families as plug-ins: what generic training, evaluation and collection ask of a
family of multi-agent envs.

A family is registered by one :class:`rlpipe.envs.multiagent.EnvFamily` entry (its env ids
and the name of its plug-in module); the module defines ``PLUGIN``, a :class:`FamilyPlugin`
whose hooks hold everything family-specific. The generic layers call
:func:`family_plugin` with an env id and never name one: ``rlpipe eval`` of a saved run,
offline training on the family's multi-agent datasets, and ``rlpipe collect``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from gymnasium import spaces
from torch import nn

from rlpipe.datasets.store import DatasetInfo
from rlpipe.envs.multiagent import env_family
from rlpipe.errors import RlpipeError
from rlpipe.training.evaluation import EvalResult


@dataclass(frozen=True)
class SavedActor:
    """The policy network of a saved run, with its checkpoint record and weights' hash."""

    actor: nn.Module
    meta: dict[str, Any]
    sha256: str
    run_dir: Path


class EvaluateRun(Protocol):
    """Evaluate a saved run of the family: the report ``rlpipe eval --json`` prints (without
    the head every report shares). ``adversary`` loads another run whose adversaries play
    against this run's agents (cross-play), for families with adversaries."""

    def __call__(
        self,
        saved: SavedActor,
        episodes: int,
        seed: int,
        deterministic: bool,
        device: Any,
        adversary: Callable[[], SavedActor] | None,
    ) -> dict[str, Any]: ...


class DatasetEvaluator(Protocol):
    """How a policy learnt from a family's multi-agent dataset (one row per agent and step)
    is evaluated: a ``Run`` evaluator under the options the data was collected with."""

    env_kwargs: dict[str, Any]  # the env's options, kept in the checkpoint's meta

    def spaces(self) -> tuple[spaces.Space, spaces.Space]:
        """One agent's (observation, action) spaces: what the dataset's rows must have."""
        ...

    def __call__(self, policy: Callable[[np.ndarray], np.ndarray], episodes: int, seed: int) -> EvalResult: ...

    def metrics(self) -> dict[str, Any]:
        """The family's keys of ``metrics.json`` from the latest evaluation."""
        ...


RowSink = Callable[[dict[str, Any]], None]


class Collection(Protocol):
    """A multi-agent dataset in the making: its spaces, its producer record, and ``play``,
    which passes each finished episode's rows (an ``agent`` column) to ``sink``."""

    observation_space: spaces.Space
    action_space: spaces.Space
    producer: dict[str, Any]

    def play(self, sink: RowSink, episodes: int, num_envs: int, seed: int) -> None: ...


@dataclass(frozen=True, kw_only=True)
class FamilyPlugin:
    """The hooks of one env family; a family without datasets leaves theirs None."""

    evaluate_run: EvaluateRun
    headline: tuple[str, ...]  # the report keys the one-line `rlpipe eval` prints
    dataset_evaluator: Callable[[DatasetInfo], DatasetEvaluator] | None = None
    experts: tuple[str, ...] = ()  # the algorithms whose runs can collect data (``--expert``)
    collection: Callable[[SavedActor | None, bool, int], Collection] | None = None  # (expert, stochastic, seed)


def family_plugin(env_id: str) -> FamilyPlugin:
    """The plug-in of the family that serves ``env_id`` (importing its module)."""
    plugin = importlib.import_module(env_family(env_id).plugin).PLUGIN
    if not isinstance(plugin, FamilyPlugin):
        raise RlpipeError(f"{env_family(env_id).plugin}.PLUGIN is not a FamilyPlugin")
    return plugin


def dataset_evaluator(info: DatasetInfo) -> DatasetEvaluator:
    """The evaluator of a policy learnt from the multi-agent dataset ``info``."""
    make = family_plugin(info.env_id or "").dataset_evaluator
    if make is None:
        raise RlpipeError(f"dataset {info.name!r}: offline training on multi-agent data of {info.env_id} is not supported")
    return make(info)


__all__ = [
    "Collection",
    "DatasetEvaluator",
    "EvaluateRun",
    "FamilyPlugin",
    "SavedActor",
    "dataset_evaluator",
    "family_plugin",
]
