"""The algorithm registry: one :class:`AlgoSpec` per algorithm name.

The CLI, the pipeline and policy loading read what an algorithm can do from here (online
or offline, the action and observation kinds it accepts, single- or multi-agent, whether
it can stream its training transitions) instead of from the module. Adding an algorithm
is one module in ``rlpipe/algos/`` (a ``Config`` extending :class:`OnlineConfig` or
:class:`OfflineConfig`, a ``TUNED`` table, a ``train`` and its ``ACTION_SPACES``) plus its
``AlgoSpec`` row in :data:`SPECS`; the module reads its own row back (``SPEC = REGISTRY[NAME]``).

Importing this module does not import torch: :data:`SPECS` is a static table, and a module is
imported the first time a spec's config class, tuned values, ``train``, space kinds or policy
loader are read. So ``rlpipe --help`` and
the collect/dataset commands, which only list the registry, start without torch.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rlpipe.envs.spaces import BOX, require_spaces
from rlpipe.errors import ArgumentError, RlpipeError

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
OFFLINE_IMAGE_OBSERVATION_KINDS = "rlpipe.training.offline:IMAGE_OBSERVATION_KINDS"  # and images (discrete actions only)
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
    module: str  # the module of its config class, TUNED, train and ACTION_SPACES
    config_name: str = "Config"  # the config class's name in ``module``
    observation_kinds_ref: str = ""  # "module:NAME" of the accepted observation kinds (BOX, GOAL, IMAGE); "": BOX only
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


# Every algorithm rlpipe ships, in ``rlpipe train --help`` order: plain data, so that reading it
# imports neither torch nor the algorithm modules (the CLI's start-up and ``make deps`` read it).
SPECS: tuple[AlgoSpec, ...] = (
    AlgoSpec(
        name="ppo",
        module="rlpipe.algos.ppo",
        family=Family.ON_POLICY,
        online=True,
        records_training=True,
        resumable=True,
        summary="clipped PPO with GAE",
    ),
    AlgoSpec(
        name="sac",
        module="rlpipe.algos.sac",
        family=Family.OFF_POLICY,
        online=True,
        records_training=True,
        batched_seeds=True,
        resumable=True,
        summary="soft actor-critic",
    ),
    AlgoSpec(
        name="ddpg",
        module="rlpipe.algos.ddpg",
        family=Family.OFF_POLICY,
        online=True,
        records_training=True,
        summary="deep deterministic policy gradient",
    ),
    AlgoSpec(
        name="td3", module="rlpipe.algos.td3", family=Family.OFF_POLICY, online=True, records_training=True, summary="twin delayed DDPG"
    ),
    AlgoSpec(
        name="ddpg-her",
        module="rlpipe.algos.her",
        family=Family.OFF_POLICY,
        online=True,
        config_name="DDPGHerConfig",
        observation_kinds_ref="rlpipe.algos.her:OBSERVATION_SPACES",
        records_training=True,
        summary="DDPG with hindsight experience replay, on goal envs",
    ),
    AlgoSpec(
        name="td3-her",
        module="rlpipe.algos.her",
        family=Family.OFF_POLICY,
        online=True,
        config_name="TD3HerConfig",
        observation_kinds_ref="rlpipe.algos.her:OBSERVATION_SPACES",
        records_training=True,
        summary="TD3 with hindsight experience replay, on goal envs",
    ),
    AlgoSpec(
        name="sac-her",
        module="rlpipe.algos.her",
        family=Family.OFF_POLICY,
        online=True,
        config_name="SACHerConfig",
        observation_kinds_ref="rlpipe.algos.her:OBSERVATION_SPACES",
        records_training=True,
        summary="SAC with hindsight experience replay, on goal envs",
    ),
    AlgoSpec(
        name="dqn",
        module="rlpipe.algos.dqn",
        family=Family.OFF_POLICY,
        online=True,
        observation_kinds_ref="rlpipe.algos.dqn:OBSERVATION_KINDS",
        records_training=True,
        resumable=True,
        summary="deep Q-network: double-Q target, optional dueling head",
    ),
    AlgoSpec(
        name="qrdqn",
        module="rlpipe.algos.qrdqn",
        family=Family.OFF_POLICY,
        online=True,
        observation_kinds_ref="rlpipe.algos.dqn:OBSERVATION_KINDS",
        records_training=True,
        resumable=True,
        summary="quantile-regression DQN",
    ),
    AlgoSpec(
        name="bc",
        module="rlpipe.algos.bc",
        family=Family.IMITATION,
        online=False,
        observation_kinds_ref=OFFLINE_IMAGE_OBSERVATION_KINDS,
        resumable=True,
        summary="behaviour cloning",
    ),
    AlgoSpec(
        name="gail",
        module="rlpipe.algos.gail",
        family=Family.IMITATION,
        online=False,
        summary="generative adversarial imitation (PPO generator, env-steps budget)",
    ),
    AlgoSpec(
        name="dac",
        module="rlpipe.algos.dac",
        family=Family.IMITATION,
        online=False,
        summary="discriminator-actor-critic: adversarial imitation with a SAC learner (env-steps budget)",
    ),
    AlgoSpec(
        name="cql",
        module="rlpipe.algos.cql",
        family=Family.OFFLINE,
        online=False,
        observation_kinds_ref=OFFLINE_IMAGE_OBSERVATION_KINDS,
        batched_seeds=True,
        summary="conservative Q-learning",
    ),
    AlgoSpec(
        name="calql",
        module="rlpipe.algos.calql",
        family=Family.OFFLINE,
        online=False,
        observation_kinds_ref=OFFLINE_OBSERVATION_KINDS,
        summary="calibrated CQL (Cal-QL), for offline-to-online fine-tuning",
    ),
    AlgoSpec(
        name="bcq",
        module="rlpipe.algos.bcq",
        family=Family.OFFLINE,
        online=False,
        observation_kinds_ref=OFFLINE_IMAGE_OBSERVATION_KINDS,
        summary="batch-constrained Q-learning",
    ),
    AlgoSpec(
        name="td3bc",
        module="rlpipe.algos.td3_bc",
        family=Family.OFFLINE,
        online=False,
        observation_kinds_ref=OFFLINE_OBSERVATION_KINDS,
        summary="TD3 with a behaviour-cloning term",
    ),
    AlgoSpec(
        name="iql",
        module="rlpipe.algos.iql",
        family=Family.OFFLINE,
        online=False,
        observation_kinds_ref=OFFLINE_OBSERVATION_KINDS,
        summary="implicit Q-learning",
    ),
    AlgoSpec(
        name="awac",
        module="rlpipe.algos.awac",
        family=Family.OFFLINE,
        online=False,
        observation_kinds_ref=OFFLINE_OBSERVATION_KINDS,
        summary="advantage-weighted actor-critic",
    ),
    AlgoSpec(
        name="rebrac",
        module="rlpipe.algos.rebrac",
        family=Family.OFFLINE,
        online=False,
        observation_kinds_ref=OFFLINE_OBSERVATION_KINDS,
        summary="TD3+BC with behaviour penalties in actor and critic, LayerNorm critics",
    ),
    AlgoSpec(
        name="dt",
        module="rlpipe.algos.dt",
        family=Family.OFFLINE,
        online=False,
        loader_ref="rlpipe.algos.dt:load_policy",
        summary="decision transformer (return-conditioned sequence model)",
    ),
    AlgoSpec(
        name="edac",
        module="rlpipe.algos.edac",
        family=Family.OFFLINE,
        online=False,
        observation_kinds_ref=OFFLINE_OBSERVATION_KINDS,
        summary="SAC with N diversified critics (SAC-N with eta=0)",
    ),
    AlgoSpec(
        name="ippo",
        module="rlpipe.algos.ippo",
        family=Family.MULTI_AGENT,
        online=True,
        multi_agent=True,
        summary="independent PPO, one policy shared by a team (Combat-v0)",
    ),
    AlgoSpec(
        name="maddpg",
        module="rlpipe.algos.maddpg",
        family=Family.MULTI_AGENT,
        online=True,
        multi_agent=True,
        summary="MADDPG: centralised critics, Gumbel-softmax actors (MPE)",
    ),
    AlgoSpec(
        name="pets",
        module="rlpipe.algos.pets",
        family=Family.MODEL_BASED,
        online=True,
        loader_ref=PLANNER_LOADER,
        summary="dynamics ensemble + CEM planning (no policy network)",
    ),
    AlgoSpec(
        name="mbpo", module="rlpipe.algos.mbpo", family=Family.MODEL_BASED, online=True, summary="SAC on real and short model rollouts"
    ),
    AlgoSpec(
        name="dynamics",
        module="rlpipe.algos.dynamics",
        family=Family.MODEL_BASED,
        online=False,
        loader_ref=PLANNER_LOADER,
        summary="fit a dynamics ensemble to a dataset (reused by mopo)",
    ),
    AlgoSpec(
        name="mopo", module="rlpipe.algos.mopo", family=Family.MODEL_BASED, online=False, summary="offline MBPO with an uncertainty penalty"
    ),
)
REGISTRY: dict[str, AlgoSpec] = {spec.name: spec for spec in SPECS}
ONLINE: tuple[str, ...] = tuple(spec.name for spec in SPECS if spec.online)
OFFLINE: tuple[str, ...] = tuple(spec.name for spec in SPECS if not spec.online)
RESUMABLE: tuple[str, ...] = tuple(spec.name for spec in SPECS if spec.resumable)


def register(*specs: AlgoSpec) -> tuple[AlgoSpec, ...]:
    """Add algorithms kept outside rlpipe to :data:`REGISTRY`, for ``get_algo`` and ``rlpipe
    train``: each spec names its ``module`` (config class, TUNED, train, ACTION_SPACES)."""
    missing = [spec.name for spec in specs if not spec.module]
    if missing:
        raise RlpipeError(f"algorithm {', '.join(missing)}: its AlgoSpec names no module")
    taken = [spec.name for spec in specs if spec.name in REGISTRY]
    if taken:
        raise RlpipeError(f"algorithm name {', '.join(taken)} is taken")
    REGISTRY.update((spec.name, spec) for spec in specs)
    return specs


def get_algo(name: str) -> AlgoSpec:
    """The spec registered as ``name``; an unknown name is an `ArgumentError` (a ValueError, one
    line in the CLI) listing the known ones."""
    if not isinstance(name, str) or name not in REGISTRY:
        raise ArgumentError(f"unknown algorithm {name!r}; choose from {', '.join(sorted(REGISTRY))}")
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
    from rlpipe.nets.checkpoint import read_meta

    meta = read_meta(run_dir)
    spec = import_algorithm(meta.get("algo", ""))
    if spec.multi_agent or is_multi_agent(meta.get("env_id", "")):  # a team's policy has no single observation -> action map
        raise RlpipeError(f"{run_dir} is a multi-agent {spec.name} run: evaluate it with `rlpipe eval`")
    return spec.load_policy(run_dir, device=device, deterministic=deterministic)


__all__ = [
    "AlgoSpec",
    "Family",
    "OFFLINE",
    "ONLINE",
    "REGISTRY",
    "RESUMABLE",
    "SPECS",
    "get_algo",
    "import_algorithm",
    "load_policy",
    "register",
]
