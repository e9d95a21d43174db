"""The algorithm registry: one :class:`AlgoSpec` per algorithm name.

The CLI, the pipeline and policy loading read what an algorithm can do from here (online
or offline, the action and observation kinds it accepts, single- or multi-agent, whether
it can stream its training transitions) instead of from the module. Adding an algorithm
is one module in ``rlpipe/algos/`` (a ``Config`` extending :class:`OnlineConfig` or
:class:`OfflineConfig`, a ``TUNED`` table, a ``train``) plus one entry in :data:`SPECS`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gymnasium import spaces

from rlpipe.algos import bc, bcq, cql, ddpg, gail, her, iql, ppo, sac, td3, td3_bc
from rlpipe.algos.policy import LoadedPolicy, load_checkpoint_policy
from rlpipe.errors import RlpipeError
from rlpipe.models.checkpoint import read_meta
from rlpipe.training.config import OnlineConfig, RunConfig, config_for_env
from rlpipe.training import offline
from rlpipe.training.env import BOX, require_spaces
from rlpipe.training.run import TrainResult


class TrainFn(Protocol):
    """``train(config, out_dir=None, *, progress=True[, step_sink=None]) -> TrainResult``."""

    def __call__(self, config: Any, out_dir: str | Path | None = None, *, progress: bool = True,
                 **kwargs: Any) -> TrainResult: ...


PolicyLoader = Callable[..., LoadedPolicy]
"""``load(run_dir, device="cpu", deterministic=True) -> LoadedPolicy``."""


@dataclass(frozen=True)
class AlgoSpec:
    """What the rest of rlpipe needs to know about one algorithm."""

    name: str
    family: str  # on-policy, off-policy, offline, imitation (next: model-based, multi-agent)
    online: bool  # learns by acting in ``--env``; False: learns from ``--dataset`` (its env from the metadata)
    config_class: type[RunConfig]
    tuned: Mapping[str, Mapping[str, Any]]  # env id -> tuned config values
    train: TrainFn
    action_kinds: tuple[str, ...]  # rlpipe.training.env kinds: BOX, DISCRETE
    observation_kinds: tuple[str, ...] = (BOX,)  # BOX, GOAL
    multi_agent: bool = False
    records_training: bool = False  # ``train`` takes ``step_sink`` and streams every transition to it
    load_policy: PolicyLoader = load_checkpoint_policy
    summary: str = ""  # one line for ``rlpipe train --help``

    @property
    def budget(self) -> str:
        """The config field that sets the run's length: ``env_steps`` or ``updates``."""
        return "env_steps" if issubclass(self.config_class, OnlineConfig) else "updates"

    def make_config(self, env_id: str, **overrides: Any) -> Any:
        """The tuned config for ``env_id`` with ``overrides`` (None values ignored) applied."""
        return config_for_env(self.config_class, self.tuned, env_id, **overrides)

    def check_spaces(self, where: str, observation_space: spaces.Space, action_space: spaces.Space) -> None:
        """Raise an RlpipeError unless this algorithm accepts these spaces (of ``where``:
        an env id or a dataset)."""
        require_spaces(self.name, where, observation_space, action_space, self.action_kinds, self.observation_kinds)


def _her(base: str, config_class: type[RunConfig]) -> AlgoSpec:
    return AlgoSpec(
        f"{base}-her", "off-policy", True, config_class, her.TUNED, her.train, her.ACTION_SPACES, her.OBSERVATION_SPACES,
        records_training=True, summary=f"{base.upper()} with hindsight experience replay, on goal envs",
    )


SPECS: tuple[AlgoSpec, ...] = (
    AlgoSpec("ppo", "on-policy", True, ppo.Config, ppo.TUNED, ppo.train, ppo.ACTION_SPACES, records_training=True,
             summary="clipped PPO with GAE"),
    AlgoSpec("sac", "off-policy", True, sac.Config, sac.TUNED, sac.train, sac.ACTION_SPACES, records_training=True,
             summary="soft actor-critic"),
    AlgoSpec("ddpg", "off-policy", True, ddpg.Config, ddpg.TUNED, ddpg.train, ddpg.ACTION_SPACES, records_training=True,
             summary="deep deterministic policy gradient"),
    AlgoSpec("td3", "off-policy", True, td3.Config, td3.TUNED, td3.train, td3.ACTION_SPACES, records_training=True,
             summary="twin delayed DDPG"),
    _her("ddpg", her.DDPGHerConfig),
    _her("td3", her.TD3HerConfig),
    _her("sac", her.SACHerConfig),
    AlgoSpec("bc", "imitation", False, bc.Config, bc.TUNED, bc.train, bc.ACTION_SPACES, offline.OBSERVATION_KINDS,
             summary="behaviour cloning"),
    AlgoSpec("gail", "imitation", False, gail.Config, gail.TUNED, gail.train, gail.ACTION_SPACES,
             summary="generative adversarial imitation (PPO generator, env-steps budget)"),
    AlgoSpec("cql", "offline", False, cql.Config, cql.TUNED, cql.train, cql.ACTION_SPACES, offline.OBSERVATION_KINDS,
             summary="conservative Q-learning"),
    AlgoSpec("bcq", "offline", False, bcq.Config, bcq.TUNED, bcq.train, bcq.ACTION_SPACES, offline.OBSERVATION_KINDS,
             summary="batch-constrained Q-learning"),
    AlgoSpec("td3bc", "offline", False, td3_bc.Config, td3_bc.TUNED, td3_bc.train, td3_bc.ACTION_SPACES,
             offline.OBSERVATION_KINDS, summary="TD3 with a behaviour-cloning term"),
    AlgoSpec("iql", "offline", False, iql.Config, iql.TUNED, iql.train, iql.ACTION_SPACES, offline.OBSERVATION_KINDS,
             summary="implicit Q-learning"),
)
REGISTRY: dict[str, AlgoSpec] = {spec.name: spec for spec in SPECS}
ONLINE: tuple[str, ...] = tuple(spec.name for spec in SPECS if spec.online)
OFFLINE: tuple[str, ...] = tuple(spec.name for spec in SPECS if not spec.online)


def get_algo(name: str) -> AlgoSpec:
    """The spec registered as ``name``; unknown names are an RlpipeError listing the known ones."""
    if name not in REGISTRY:
        raise RlpipeError(f"unknown algorithm {name!r}; choose from {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]


def load_policy(run_dir: str | Path, device: str = "cpu", deterministic: bool = True) -> LoadedPolicy:
    """Load the policy of any saved run (``rlpipe train ... --out RUN_DIR``) with the loader
    its algorithm registers.

    The result maps a batch of observations ``[B, obs_dim]`` (or a goal env's Dict of
    batches, flattened as in training) to a batch of env actions (scaled to the env's
    bounds / Discrete indices); ``.env_id`` and ``.checkpoint_sha256`` identify it.
    """
    return get_algo(read_meta(run_dir).get("algo", "")).load_policy(run_dir, device=device, deterministic=deterministic)


__all__ = ["AlgoSpec", "OFFLINE", "ONLINE", "REGISTRY", "SPECS", "get_algo", "load_policy"]
