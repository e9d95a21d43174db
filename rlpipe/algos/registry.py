"""The algorithm registry: one :class:`AlgoSpec` per algorithm name.

The CLI, the pipeline and policy loading read what an algorithm can do from here (online
or offline, the action and observation kinds it accepts, single- or multi-agent, whether
it can stream its training transitions) instead of from the module. Adding an algorithm
is one module in ``rlpipe/algos/`` (a ``Config`` extending :class:`OnlineConfig` or
:class:`OfflineConfig`, a ``TUNED`` table, a ``train``, its ``ACTION_SPACES``) plus one
entry in :data:`SPECS`.

Importing this module does not import torch: an entry names its algorithm's module, which
is imported the first time a spec's config class, tuned values, ``train``, space kinds or
policy loader are read. So ``rlpipe --help`` and the collect/dataset commands, which only
list the registry, start without torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rlpipe.envs.spaces import BOX, require_spaces
from rlpipe.errors import RlpipeError

if TYPE_CHECKING:
    from gymnasium import spaces

    from rlpipe.algos.policy import LoadedPolicy
    from rlpipe.training.config import RunConfig
    from rlpipe.training.run import TrainResult


class TrainFn(Protocol):
    """``train(config, out_dir=None, *, progress=True[, step_sink=None]) -> TrainResult``."""

    def __call__(self, config: Any, out_dir: str | Path | None = None, *, progress: bool = True, **kwargs: Any) -> TrainResult: ...


PolicyLoader = Callable[..., "LoadedPolicy"]
"""``load(run_dir, device="cpu", deterministic=True) -> LoadedPolicy``."""

OFFLINE_OBSERVATION_KINDS = "rlpipe.training.offline:OBSERVATION_KINDS"  # what load_offline accepts
CHECKPOINT_LOADER = "rlpipe.algos.policy:load_checkpoint_policy"
PLANNER_LOADER = "rlpipe.algos.policy:refuse_planner_policy"  # runs that act by planning save no policy network


def resolve(reference: str) -> Any:
    """The object a ``"package.module:NAME"`` reference names (importing the module)."""
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


class Family(str, Enum):
    """How an algorithm learns (``rlpipe train --help`` groups them so)."""

    ON_POLICY = "on-policy"
    OFF_POLICY = "off-policy"
    OFFLINE = "offline"
    IMITATION = "imitation"
    MODEL_BASED = "model-based"
    MULTI_AGENT = "multi-agent"


@dataclass(frozen=True, kw_only=True)
class AlgoSpec:
    """What the rest of rlpipe needs to know about one algorithm.

    The capabilities (``family`` .. ``summary``) are plain data; ``config_class``, ``tuned``,
    ``train``, ``action_kinds``, ``observation_kinds`` and ``load_policy`` are read from
    ``module`` on first use (and kept).
    """

    name: str
    family: Family
    online: bool  # learns by acting in ``--env``; False: learns from ``--dataset`` (its env from the metadata)
    module: str  # the algorithm's module: its config class, TUNED, train and ACTION_SPACES
    config_name: str = "Config"  # the config class's name in ``module``
    observation_kinds_ref: str = ""  # "module:NAME" of the accepted observation kinds (BOX, GOAL); "": BOX only
    multi_agent: bool = False  # trains on the multi-agent env ids of its TUNED table (rlpipe.envs.multiagent)
    records_training: bool = False  # ``train`` takes ``step_sink`` and streams every transition to it
    batched_seeds: bool = False  # ``train_seeds(configs, out_dirs, *, progress)`` trains K seeds as one computation
    resumable: bool = False  # ``train`` honours ``checkpoint_every`` and resumes exactly (rlpipe.training.resume)
    loader_ref: str = CHECKPOINT_LOADER  # "module:NAME" of its ``load_policy``
    summary: str = ""  # one line for ``rlpipe train --help``

    @cached_property
    def config_class(self) -> type[RunConfig]:
        return resolve(f"{self.module}:{self.config_name}")

    @cached_property
    def tuned(self) -> Mapping[str, Mapping[str, Any]]:
        """Env id -> tuned config values."""
        return resolve(f"{self.module}:TUNED")

    @cached_property
    def train(self) -> TrainFn:
        return resolve(f"{self.module}:train")

    @cached_property
    def train_seeds(self) -> Callable[..., list[TrainResult]]:
        """``train_seeds(configs, out_dirs, *, progress=True) -> [TrainResult]`` (``batched_seeds`` only)."""
        if not self.batched_seeds:
            batched = ", ".join(spec.name for spec in SPECS if spec.batched_seeds)
            raise RlpipeError(f"{self.name} cannot train seeds batched (algorithms that can: {batched})")
        return resolve(f"{self.module}:train_seeds")

    @cached_property
    def action_kinds(self) -> tuple[str, ...]:
        """rlpipe.envs.spaces kinds: BOX, DISCRETE."""
        return resolve(f"{self.module}:ACTION_SPACES")

    @cached_property
    def observation_kinds(self) -> tuple[str, ...]:
        return resolve(self.observation_kinds_ref) if self.observation_kinds_ref else (BOX,)

    @cached_property
    def load_policy(self) -> PolicyLoader:
        return resolve(self.loader_ref)

    @property
    def budget(self) -> str:
        """The config field that sets the run's length: ``env_steps`` or ``updates``."""
        from rlpipe.training.config import OnlineConfig

        return "env_steps" if issubclass(self.config_class, OnlineConfig) else "updates"

    def make_config(self, env_id: str, **overrides: Any) -> Any:
        """The tuned config for ``env_id`` with ``overrides`` (None values ignored) applied."""
        from rlpipe.training.config import config_for_env

        return config_for_env(self.config_class, self.tuned, env_id, **overrides)

    def check_spaces(self, where: str, observation_space: spaces.Space, action_space: spaces.Space) -> None:
        """Raise an RlpipeError unless this algorithm accepts these spaces (of ``where``:
        an env id or a dataset)."""
        require_spaces(self.name, where, observation_space, action_space, self.action_kinds, self.observation_kinds)


def _her(base: str) -> AlgoSpec:
    return AlgoSpec(
        name=f"{base}-her",
        family=Family.OFF_POLICY,
        online=True,
        module="rlpipe.algos.her",
        config_name=f"{base.upper()}HerConfig",
        observation_kinds_ref="rlpipe.algos.her:OBSERVATION_SPACES",
        records_training=True,
        summary=f"{base.upper()} with hindsight experience replay, on goal envs",
    )


SPECS: tuple[AlgoSpec, ...] = (
    AlgoSpec(
        name="ppo",
        family=Family.ON_POLICY,
        online=True,
        module="rlpipe.algos.ppo",
        records_training=True,
        resumable=True,
        summary="clipped PPO with GAE",
    ),
    AlgoSpec(
        name="sac",
        family=Family.OFF_POLICY,
        online=True,
        module="rlpipe.algos.sac",
        records_training=True,
        resumable=True,
        batched_seeds=True,
        summary="soft actor-critic",
    ),
    AlgoSpec(
        name="ddpg",
        family=Family.OFF_POLICY,
        online=True,
        module="rlpipe.algos.ddpg",
        records_training=True,
        summary="deep deterministic policy gradient",
    ),
    AlgoSpec(
        name="td3", family=Family.OFF_POLICY, online=True, module="rlpipe.algos.td3", records_training=True, summary="twin delayed DDPG"
    ),
    _her("ddpg"),
    _her("td3"),
    _her("sac"),
    AlgoSpec(
        name="bc",
        family=Family.IMITATION,
        online=False,
        module="rlpipe.algos.bc",
        observation_kinds_ref=OFFLINE_OBSERVATION_KINDS,
        resumable=True,
        summary="behaviour cloning",
    ),
    AlgoSpec(
        name="gail",
        family=Family.IMITATION,
        online=False,
        module="rlpipe.algos.gail",
        summary="generative adversarial imitation (PPO generator, env-steps budget)",
    ),
    AlgoSpec(
        name="dac",
        family=Family.IMITATION,
        online=False,
        module="rlpipe.algos.dac",
        summary="discriminator-actor-critic: adversarial imitation with a SAC learner (env-steps budget)",
    ),
    AlgoSpec(
        name="cql",
        family=Family.OFFLINE,
        online=False,
        module="rlpipe.algos.cql",
        observation_kinds_ref=OFFLINE_OBSERVATION_KINDS,
        batched_seeds=True,
        summary="conservative Q-learning",
    ),
    AlgoSpec(
        name="bcq",
        family=Family.OFFLINE,
        online=False,
        module="rlpipe.algos.bcq",
        observation_kinds_ref=OFFLINE_OBSERVATION_KINDS,
        summary="batch-constrained Q-learning",
    ),
    AlgoSpec(
        name="td3bc",
        family=Family.OFFLINE,
        online=False,
        module="rlpipe.algos.td3_bc",
        observation_kinds_ref=OFFLINE_OBSERVATION_KINDS,
        summary="TD3 with a behaviour-cloning term",
    ),
    AlgoSpec(
        name="iql",
        family=Family.OFFLINE,
        online=False,
        module="rlpipe.algos.iql",
        observation_kinds_ref=OFFLINE_OBSERVATION_KINDS,
        summary="implicit Q-learning",
    ),
    AlgoSpec(
        name="ippo",
        family=Family.MULTI_AGENT,
        online=True,
        module="rlpipe.algos.ippo",
        multi_agent=True,
        summary="independent PPO, one policy shared by a team (Combat-v0)",
    ),
    AlgoSpec(
        name="maddpg",
        family=Family.MULTI_AGENT,
        online=True,
        module="rlpipe.algos.maddpg",
        multi_agent=True,
        summary="MADDPG: centralised critics, Gumbel-softmax actors (MPE)",
    ),
    AlgoSpec(
        name="pets",
        family=Family.MODEL_BASED,
        online=True,
        module="rlpipe.algos.pets",
        loader_ref=PLANNER_LOADER,
        summary="dynamics ensemble + CEM planning (no policy network)",
    ),
    AlgoSpec(
        name="mbpo", family=Family.MODEL_BASED, online=True, module="rlpipe.algos.mbpo", summary="SAC on real and short model rollouts"
    ),
    AlgoSpec(
        name="dynamics",
        family=Family.MODEL_BASED,
        online=False,
        module="rlpipe.algos.dynamics",
        loader_ref=PLANNER_LOADER,
        summary="fit a dynamics ensemble to a dataset (reused by mopo)",
    ),
    AlgoSpec(
        name="mopo", family=Family.MODEL_BASED, online=False, module="rlpipe.algos.mopo", summary="offline MBPO with an uncertainty penalty"
    ),
)
REGISTRY: dict[str, AlgoSpec] = {spec.name: spec for spec in SPECS}
ONLINE: tuple[str, ...] = tuple(spec.name for spec in SPECS if spec.online)
OFFLINE: tuple[str, ...] = tuple(spec.name for spec in SPECS if not spec.online)
RESUMABLE: tuple[str, ...] = tuple(spec.name for spec in SPECS if spec.resumable)


def get_algo(name: str) -> AlgoSpec:
    """The spec registered as ``name``; unknown names are an RlpipeError listing the known ones."""
    if name not in REGISTRY:
        raise RlpipeError(f"unknown algorithm {name!r}; choose from {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]


def import_algorithm(name: str) -> AlgoSpec:
    """``get_algo(name)`` with its module imported: the policy classes it defines (or imports)
    register themselves, so the checkpoints it writes can be rebuilt."""
    spec = get_algo(name)
    importlib.import_module(spec.module)
    return spec


def load_policy(run_dir: str | Path, device: str = "cpu", deterministic: bool = True) -> LoadedPolicy:
    """Load the policy of any saved run (``rlpipe train ... --out RUN_DIR``) with the loader
    its algorithm registers.

    The result maps a batch of observations ``[B, obs_dim]`` (or a goal env's Dict of
    batches, flattened as in training) to a batch of env actions (scaled to the env's
    bounds / Discrete indices); ``.env_id`` and ``.checkpoint_sha256`` identify it.
    """
    from rlpipe.envs.multiagent import is_multi_agent
    from rlpipe.models.checkpoint import read_meta

    meta = read_meta(run_dir)
    spec = import_algorithm(meta.get("algo", ""))
    if spec.multi_agent or is_multi_agent(meta.get("env_id", "")):  # a team's policy has no single observation -> action map
        raise RlpipeError(f"{run_dir} is a multi-agent {spec.name} run: evaluate it with `rlpipe eval`")
    return spec.load_policy(run_dir, device=device, deterministic=deterministic)


__all__ = ["AlgoSpec", "OFFLINE", "ONLINE", "REGISTRY", "RESUMABLE", "SPECS", "get_algo", "import_algorithm", "load_policy"]
