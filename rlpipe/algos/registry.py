"""The algorithm registry: one :class:`AlgoSpec` per algorithm name.

The CLI, the pipeline and policy loading read what an algorithm can do from here (online
or offline, the action and observation kinds it accepts, single- or multi-agent, whether
it can stream its training transitions) instead of from the module. Adding an algorithm
is one module in ``rlpipe/algos/`` (a ``Config`` extending :class:`OnlineConfig` or
:class:`OfflineConfig`, a ``TUNED`` table, a ``train``, its ``ACTION_SPACES`` and its
``SPEC = AlgoSpec(...)``) plus its name in :data:`ALGORITHM_MODULES`.

Importing this module does not import torch: the specs are read from the modules' source
(:func:`declared_specs`), and a module is imported the first time a spec's config class,
tuned values, ``train``, space kinds or policy loader are read. So ``rlpipe --help`` and
the collect/dataset commands, which only list the registry, start without torch.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

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
    module: str = ""  # filled by the registry: the declaring module (config class, TUNED, train, ACTION_SPACES)
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


# The modules that declare algorithms, in ``rlpipe train --help`` order.
ALGORITHM_MODULES: tuple[str, ...] = tuple(
    f"rlpipe.algos.{name}"
    for name in (
        "ppo",
        "sac",
        "ddpg",
        "td3",
        "her",
        "dqn",
        "qrdqn",
        "bc",
        "gail",
        "dac",
        "cql",
        "calql",
        "bcq",
        "td3_bc",
        "iql",
        "awac",
        "rebrac",
        "dt",
        "edac",
        "ippo",
        "maddpg",
        "pets",
        "mbpo",
        "dynamics",
        "mopo",
    )
)
# Names a declaration may use besides literals and ``Family.X``.
_DECLARATION_NAMES: dict[str, str] = {
    "OFFLINE_OBSERVATION_KINDS": OFFLINE_OBSERVATION_KINDS,
    "OFFLINE_IMAGE_OBSERVATION_KINDS": OFFLINE_IMAGE_OBSERVATION_KINDS,
    "CHECKPOINT_LOADER": CHECKPOINT_LOADER,
    "PLANNER_LOADER": PLANNER_LOADER,
}


def declared_specs(module: str) -> tuple[AlgoSpec, ...]:
    """The specs ``module`` declares before its first class or function, ``SPEC = AlgoSpec(...)`` (or a tuple
    ``SPECS = (AlgoSpec(...), ...)``), read from its source without importing it (so no torch):
    each keyword a literal, ``Family.X`` or one of this module's reference constants, and
    ``**NAME`` the keywords of a top-level ``NAME = dict(...)`` (what several specs share)."""
    found = importlib.util.find_spec(module)
    if found is None or not found.origin:
        raise RlpipeError(f"algorithm module {module} not found")
    # The declarations precede the module's first class or function: only that head is parsed.
    head = re.split(r"^(?=@|class |def |async def )", Path(found.origin).read_text(encoding="utf-8"), maxsplit=1, flags=re.M)[0]
    try:
        tree = ast.parse(head, found.origin)
    except SyntaxError as exc:
        raise RlpipeError(f"cannot read the SPEC of {module}: {exc}") from None
    assigned = cast(  # annotated names without a value are left out
        "dict[str, ast.expr]",
        {
            ast.unparse(node.targets[0] if isinstance(node, ast.Assign) else node.target): node.value
            for node in tree.body
            if (isinstance(node, ast.Assign) and len(node.targets) == 1) or (isinstance(node, ast.AnnAssign) and node.value is not None)
        },
    )
    for name in ("SPEC", "SPECS"):
        if name in assigned:
            value = assigned[name]
            return tuple(_spec_of(call, module, assigned) for call in (value.elts if isinstance(value, ast.Tuple) else [value]))
    raise RlpipeError(f"{module} declares no SPEC = AlgoSpec(...) before its first class or function")


def _keywords(call: ast.expr, func: str, module: str, assigned: Mapping[str, ast.expr]) -> list[ast.keyword]:
    """The keywords of ``func(keyword=value, ..., **NAME)``, NAME's ``dict(...)`` expanded."""
    if not (isinstance(call, ast.Call) and ast.unparse(call.func) == func and not call.args):
        raise RlpipeError(f"{module}: SPEC must be AlgoSpec(keyword=value, ...), got {ast.unparse(call)}")
    expanded = []
    for keyword in call.keywords:
        if keyword.arg is None:
            expanded += _keywords(assigned.get(ast.unparse(keyword.value), keyword.value), "dict", module, assigned)
        else:
            expanded.append(keyword)
    return expanded


def _spec_of(call: ast.expr, module: str, assigned: Mapping[str, ast.expr]) -> AlgoSpec:
    keywords = _keywords(call, "AlgoSpec", module, assigned)
    return AlgoSpec(module=module, **{str(keyword.arg): _declared_value(keyword.value, module) for keyword in keywords})


def _declared_value(node: ast.expr, module: str) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    text = ast.unparse(node)
    if text.startswith("Family.") and text.removeprefix("Family.") in Family.__members__:
        return Family[text.removeprefix("Family.")]
    if text in _DECLARATION_NAMES:
        return _DECLARATION_NAMES[text]
    raise RlpipeError(f"{module}: SPEC value {text} must be a literal, Family.X or one of {', '.join(_DECLARATION_NAMES)}")


SPECS: tuple[AlgoSpec, ...] = tuple(spec for module in ALGORITHM_MODULES for spec in declared_specs(module))
REGISTRY: dict[str, AlgoSpec] = {spec.name: spec for spec in SPECS}
ONLINE: tuple[str, ...] = tuple(spec.name for spec in SPECS if spec.online)
OFFLINE: tuple[str, ...] = tuple(spec.name for spec in SPECS if not spec.online)
RESUMABLE: tuple[str, ...] = tuple(spec.name for spec in SPECS if spec.resumable)


def register(module: str) -> tuple[AlgoSpec, ...]:
    """Add the algorithms ``module`` declares (as :data:`ALGORITHM_MODULES` entries do) to
    :data:`REGISTRY`, for ``get_algo`` and ``rlpipe train``: an algorithm kept outside rlpipe."""
    specs = declared_specs(module)
    taken = [spec.name for spec in specs if spec.name in REGISTRY]
    if taken:
        raise RlpipeError(f"{module}: algorithm name {', '.join(taken)} is taken")
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
    from rlpipe.models.checkpoint import read_meta

    meta = read_meta(run_dir)
    spec = import_algorithm(meta.get("algo", ""))
    if spec.multi_agent or is_multi_agent(meta.get("env_id", "")):  # a team's policy has no single observation -> action map
        raise RlpipeError(f"{run_dir} is a multi-agent {spec.name} run: evaluate it with `rlpipe eval`")
    return spec.load_policy(run_dir, device=device, deterministic=deterministic)


__all__ = [
    "ALGORITHM_MODULES",
    "AlgoSpec",
    "Family",
    "OFFLINE",
    "ONLINE",
    "REGISTRY",
    "RESUMABLE",
    "SPECS",
    "declared_specs",
    "get_algo",
    "import_algorithm",
    "load_policy",
    "register",
]
