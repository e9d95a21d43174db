"""What offline algorithms (BC, CQL, BCQ, TD3+BC, IQL, and GAIL's expert data) share:
opening a stored dataset, checking it fits the algorithm, sampling it on the training
device, and the sample-update-evaluate loop. Evaluation runs in the env named by the
dataset's metadata.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property, partial
from pathlib import Path
from typing import Any, Protocol, cast, runtime_checkable

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from rlpipe.datasets.loader import TransitionArrays, load_shards, shards_digest
from rlpipe.datasets.mapped import MappedTransitions
from rlpipe.datasets.schema import map_columnar
from rlpipe.datasets.store import METADATA_FILE, DatasetInfo, open_dataset
from rlpipe.envs import env_id_for_spec, trusted_env_id
from rlpipe.envs.extras import register_optional
from rlpipe.envs.goals import flat_observation_space, flatten_obs, is_goal_space
from rlpipe.envs.spaces import is_image_space
from rlpipe.envs.stepper import VecStepper
from rlpipe.errors import RlpipeError
from rlpipe.nets.networks import ObsNormalizer
from rlpipe.nets.recurrent import RecurrentPolicy
from rlpipe.training import distributed
from rlpipe.training.buffer import Batch, ReplayBuffer, ReturnsToGo, Update, join_batches
from rlpipe.training.config import FinetuneFields, OfflineConfig
from rlpipe.training.diagnostics import Diagnosed
from rlpipe.training.env import BOX, GOAL, IMAGE, ActionScaler, action_dim, env_spaces, make_vec_env, require_spaces, resolve_device
from rlpipe.training.evaluation import Acting, PolicyFn, policy_fn
from rlpipe.training.fqe import FQEConfig, fitted_q_evaluation
from rlpipe.training.graphs import UpdateStepper, graphs_enabled
from rlpipe.training.losses import TDErrors
from rlpipe.training.multiagent import dataset_evaluator
from rlpipe.training.optim import mixed_precision
from rlpipe.training.resume import Checkpointer
from rlpipe.training.run import Run, TrainResult
from rlpipe.training.sampler import MappedSampler, TransitionSampler
from rlpipe.training.seeding import seed_everything
from rlpipe.training.validation import SnapshotPolicy, Snapshots, ValidationSet, split_episodes

# Offline algorithms train on flat Box observations or goal Dicts (flattened when loaded);
# those whose networks take an encoder (the discrete-action ones) also on images.
OBSERVATION_KINDS = (BOX, GOAL)
IMAGE_OBSERVATION_KINDS = (BOX, GOAL, IMAGE)
FINETUNE_SEED_OFFSET = 30_000  # the fine-tuning env's seeds: disjoint from every evaluation's


def dataset_env_id(dataset: str | DatasetInfo, store: str | os.PathLike | None = None) -> str:
    """The env a dataset (a name in ``store``, or one already opened) was collected in, where
    offline policies are evaluated, built from its recorded spec (time limit, kwargs) when it
    has one: see `rlpipe.envs.env_id_for_spec`. A spec or id naming code not registered here
    needs `--trust-env-spec`."""
    info = open_dataset(dataset, store) if isinstance(dataset, str) else dataset
    name = info.name
    if not info.env_id:
        raise RlpipeError(f"dataset {name!r} names no environment, so a policy trained on it cannot be evaluated")
    if info.metadata.get("multi_agent", False):
        return info.env_id  # a PettingZoo env of an env family (rlpipe.envs.multiagent), its options in the producer record
    key = "eval_env_spec" if info.metadata.get("eval_env_spec") else "env_spec"  # Minari's env meant for evaluation first
    if info.metadata.get(key):
        return env_id_for_spec(info.metadata[key], f"dataset {name!r}", f"{info.path / METADATA_FILE} {key!r}")
    env_id = trusted_env_id(info.env_id, f"dataset {name!r}")
    try:
        register_optional(env_id)  # an optional family's id registers on first use (FetchReach-v4)
        gym.spec(env_id)
    except gym.error.Error:
        raise RlpipeError(f"dataset {name!r} was collected in {info.env_id!r}, which is not registered here") from None
    return info.env_id


class DatasetRun(Protocol):
    """What `load_offline` reads of a config: `DatasetFields` and the run's seed, threads and
    device (an `OfflineConfig`, or the imitation configs that train online on a dataset)."""

    dataset: str
    store: str | None
    max_samples: int | None
    seed: int
    torch_threads: int
    device: str


def validated(info: DatasetInfo, config: DatasetRun) -> bool:
    """Whether an offline run scores its policy on held-out episodes (`rlpipe.training.validation`)
    because its dataset names no environment to play it in (GAIL's expert data needs none: it
    trains in its own env)."""
    return not info.env_id and isinstance(config, OfflineConfig)


def _layout(space: gym.Space) -> Any:
    """What must agree between a dataset's space and its env's: kind, shape (per Dict key), size."""
    if isinstance(space, spaces.Dict):
        return {key: _layout(sub) for key, sub in space.spaces.items()}
    return (type(space).__name__, getattr(space, "n", None), space.shape)


def require_dataset_fits_env(info: DatasetInfo) -> None:
    """Raise before training if the dataset's spaces differ from those of the env it names
    (the policy would fail only at its first evaluation). A multi-agent dataset's rows hold
    one agent's spaces, as its env family's evaluator sees them."""
    if info.metadata.get("multi_agent", False):
        env_obs, env_act = dataset_evaluator(info).spaces()
    else:
        assert info.env_id is not None  # the dataset names its env: load_offline checks only those
        env_obs, env_act = env_spaces(trusted_env_id(info.env_id, f"dataset {info.name!r}"))
    for what, stored, actual in (("observation", info.observation_space, env_obs), ("action", info.action_space, env_act)):
        if _layout(stored) != _layout(actual):
            raise RlpipeError(f"dataset {info.name!r} has {what}s {stored}, but its env {info.env_id} has {actual}")


def subset_rows(data: TransitionArrays, max_samples: int, seed: int) -> np.ndarray:
    """Rows of a `max_samples` subset: drawn without replacement from the fewest leading
    whole episodes that hold that many transitions (the reference text's "30 pairs from
    one expert episode")."""
    if max_samples < 1:
        raise RlpipeError(f"--max-samples must be at least 1, got {max_samples}")
    ends = np.r_[data.episode_starts()[1:], len(data)]
    prefix = int(ends[np.searchsorted(ends, min(max_samples, len(data)))])
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(prefix, size=min(max_samples, prefix), replace=False))


def take_rows(data: TransitionArrays, rows: np.ndarray) -> TransitionArrays:
    """A new TransitionArrays holding `rows` of `data`."""
    columns = {name: None if values is None else map_columnar(values, lambda a: a[rows]) for name, values in vars(data).items()}
    return TransitionArrays(**cast("dict[str, Any]", columns))  # each column of the kind it was


@dataclass
class OfflineData:
    """A dataset opened for training: arrays, a device sampler, spaces and sizes.

    For goal-conditioned datasets ``arrays`` and ``observation_space`` hold the flattened
    observations the networks see (rlpipe.envs.goals); ``info`` keeps the stored Dict space.
    """

    info: DatasetInfo
    arrays: TransitionArrays | MappedTransitions
    make_sampler: Callable[[], TransitionSampler | MappedSampler] = field(repr=False)
    observation_space: spaces.Box
    action_space: spaces.Space
    obs_dim: int
    act_dim: int
    device: torch.device
    frame_stack: int = 1  # batches' obs and next_obs are [B, frame_stack, *frame] stacks when > 1
    # Data with no environment: the held-out episodes (``arrays`` holds the others) and the
    # whole dataset, which FQE fits on (rlpipe.training.validation).
    validation: ValidationSet | None = None
    all_rows: TransitionArrays | None = field(default=None, repr=False)

    @property
    def discrete(self) -> bool:
        return isinstance(self.action_space, spaces.Discrete)

    @cached_property
    def sampler(self) -> TransitionSampler | MappedSampler:
        """The transition sampler, built on first use: its device copy of every column is never
        made for a sequence model, which samples windows of ``arrays`` instead."""
        return self.make_sampler()


MAPPED_SAMPLING_BYTES = 1 << 30  # step shards larger than this in all, once read, are sampled from their maps, not loaded


def sample_from_maps(info: DatasetInfo) -> bool:
    """Whether minibatches of this dataset are gathered from its memory-mapped shards
    (`MappedSampler`) instead of loading it into RAM: its step shards, with compressed frames
    counted decoded (`DatasetInfo.step_bytes`), are over `MAPPED_SAMPLING_BYTES`."""
    return info.step_bytes > MAPPED_SAMPLING_BYTES


def _sample_from_maps(info: DatasetInfo, config: DatasetRun) -> bool:
    """`sample_from_maps`, unless a subset or goal flattening needs the arrays in RAM."""
    in_ram_only = config.max_samples is not None or is_goal_space(info.observation_space)
    return sample_from_maps(info) and not in_ram_only


def load_offline(
    algo: str,
    config: DatasetRun,
    action_kinds: tuple[str, ...],
    next_actions: bool = False,
    observation_kinds: tuple[str, ...] = OBSERVATION_KINDS,
    returns_to_go: ReturnsToGo | None = None,
    windows: bool = False,
) -> OfflineData:
    """Open `config.dataset`, check the spaces suit `algo`, seed, and build the sampler.

    Continuous actions are mapped to the policy's [-1, 1] range once, here; so are goal
    Dict observations to ``concat(observation, desired_goal)``. Datasets over
    `MAPPED_SAMPLING_BYTES` stay in their memory-mapped shards (`MappedSampler`; actions are
    then mapped per batch) and ``arrays`` is their `MappedTransitions`. With `next_actions`
    batches carry the dataset's next actions, with `returns_to_go` each row's discounted
    return-to-go (`TransitionSampler`; neither from the maps).
    ``obs_dim`` is the size of one observation (an image's H * W * C). A config's
    ``frame_stack`` k > 1 makes batches' obs and next_obs stacks of the last k frames.
    With ``windows`` (a sequence model, which samples windows of ``arrays``) the transition
    sampler is not built unless ``sampler`` is read.
    """
    seed_everything(config.seed, config.torch_threads)
    distributed.join(getattr(config, "nproc", 1), config.device)  # before the device is resolved: a rank's GPU is its own
    info = open_dataset(config.dataset, config.store)
    obs_space, act_space = info.observation_space, info.action_space
    require_spaces(algo, f"dataset {info.name!r}", obs_space, act_space, action_kinds, observation_kinds)
    if info.env_id:
        require_dataset_fits_env(info)
    device = resolve_device(config.device)
    scaler = ActionScaler(act_space)
    frame_stack = getattr(config, "frame_stack", 1)  # only algorithms whose config declares it get stacks
    if _sample_from_maps(info, config):
        if validated(info, config):
            raise RlpipeError(
                f"dataset {info.name!r} names no environment and is sampled from its memory maps: its validation split needs it in memory"
            )
        column = "next actions" if next_actions else "returns-to-go" if returns_to_go is not None else None
        if column:
            raise RlpipeError(f"{algo} needs the dataset's {column}: not gathered from the memory maps of {info.name!r}")
        mapped = MappedTransitions(info)
        make_sampler = partial(MappedSampler, mapped, device, seed=config.seed, action_map=scaler.from_env, frame_stack=frame_stack)
        box = cast(spaces.Box, obs_space)  # not a goal Dict (those load in RAM): a Box, as require_spaces checked
        opened = OfflineData(info, mapped, make_sampler, box, act_space, math.prod(box.shape), action_dim(act_space), device, frame_stack)
    else:
        opened = _load_in_ram(info, config, device, scaler, frame_stack, next_actions, returns_to_go)
    if not windows:
        _ = opened.sampler  # built now, so that a column it refuses stops the run before it starts
    return opened


def _load_in_ram(
    info: DatasetInfo,
    config: DatasetRun,
    device: torch.device,
    scaler: ActionScaler,
    frame_stack: int,
    next_actions: bool,
    returns_to_go: ReturnsToGo | None,
) -> OfflineData:
    """`load_offline`'s dataset read into RAM: a subset of ``config.max_samples`` rows and goal
    observations flattened where asked, sampled by a `TransitionSampler`."""
    obs_space, act_space = info.observation_space, info.action_space
    data = load_shards(info)
    if len(data) == 0:
        raise RlpipeError(f"dataset {info.name!r} is empty")
    if config.max_samples is not None:
        data = take_rows(data, subset_rows(data, config.max_samples, config.seed))
    if is_goal_space(obs_space):
        data = replace(data, obs=flatten_obs(data.obs), next_obs=flatten_obs(data.next_obs))
        obs_space = flat_observation_space(obs_space)
    sampler_of = partial(
        TransitionSampler,
        device=device,
        seed=config.seed,
        action_map=scaler.from_env,
        next_actions=next_actions,
        frame_stack=frame_stack,
        returns_to_go=returns_to_go,
    )
    validation, all_rows = None, None
    if validated(info, config):
        fraction = cast(OfflineConfig, config).validation_fraction  # validated(): an OfflineConfig
        train_rows, validation_rows = split_episodes(data, fraction, config.seed, info.name)
        all_rows, data = data, take_rows(data, train_rows)
        validation = ValidationSet(take_rows(all_rows, validation_rows), act_space, sampler_of)
    make_sampler = partial(sampler_of, data)
    box = cast(spaces.Box, obs_space)  # a goal Dict flattened above; else a Box, as require_spaces checked
    dims = math.prod(box.shape), action_dim(act_space)
    return OfflineData(info, data, make_sampler, box, act_space, *dims, device, frame_stack, validation, all_rows)


def require_flat_observations(algo: str, config: OfflineConfig, data: OfflineData) -> None:
    """Refuse images and frame stacks where the networks read one flat observation (the
    continuous-action variants, whose actors and critics take no encoder)."""
    if is_image_space(data.observation_space) or getattr(config, "frame_stack", 1) > 1:
        raise RlpipeError(
            f"{algo} reads images and frame stacks with discrete actions only; dataset {data.info.name!r} has {data.action_space} actions"
        )


def returns_range_scale(data: OfflineData, span: float = 1000.0) -> float:
    """``span / (max - min episode return)`` of the dataset: the reward scale IQL (and CORL)
    use on locomotion datasets, so that returns span ``span`` whatever the env's units."""
    if not isinstance(data.arrays, TransitionArrays):
        raise RlpipeError(f"dataset {data.info.name!r} is sampled from its memory maps: reward scaling needs it in memory")
    returns = data.arrays.episode_returns()
    if len(returns) < 2 or returns.max() == returns.min():
        raise RlpipeError(f"dataset {data.info.name!r}: reward scaling needs episodes of different returns")
    return float(span / (returns.max() - returns.min()))


def fit_obs_normalizer(actor: nn.Module, data: OfflineData) -> None:
    """Set ``actor.obs_norm``, where it is an `ObsNormalizer`, to the dataset's observation mean
    and variance (TD3+BC, IQL, ReBRAC; the saved policy then normalises as in training)."""
    if isinstance(actor.obs_norm, ObsNormalizer):
        actor.obs_norm.update(torch.as_tensor(np.asarray(data.arrays.obs, np.float32), device=data.device))


def dataset_metrics(data: OfflineData) -> dict[str, Any]:
    """What a run's metrics record about the dataset it learned from."""
    return {
        "dataset": data.info.name,
        "dataset_content_hash": data.info.metadata["content_hash"],
        "dataset_shards_sha256": shards_digest(data.info),  # of the shards as read and verified
        "dataset_transitions": len(data.arrays),
    }


class DatasetAndOnline:
    """Minibatches of the dataset's rows and the transitions collected online: drawn uniformly
    from both, as if these were appended to the dataset, or with ``mixing_ratio`` that share of
    each batch from the dataset and the rest from the online rows (CORL's offline-to-online
    settings; the dataset alone while nothing has been collected)."""

    def __init__(
        self, dataset: TransitionSampler | MappedSampler, online: ReplayBuffer, seed: int, mixing_ratio: float | None = None
    ) -> None:
        self.dataset, self.online, self.mixing_ratio = dataset, online, mixing_ratio
        self.generator = torch.Generator(device=dataset.device).manual_seed(seed)

    def _draw(self, high: int, size: int) -> torch.Tensor:
        return torch.randint(high, (size,), device=self.dataset.device, generator=self.generator)

    def sample(self, batch_size: int) -> Batch:
        if self.mixing_ratio is None or len(self.online) == 0:
            index = self._draw(self.dataset.size + len(self.online), batch_size)
            from_dataset = index < self.dataset.size
            parts = self.dataset.take(index[from_dataset]), self.online.take(index[~from_dataset] - self.dataset.size)
        else:
            dataset_rows = round(self.mixing_ratio * batch_size)
            parts = (
                self.dataset.take(self._draw(self.dataset.size, dataset_rows)),
                self.online.take(self._draw(len(self.online), batch_size - dataset_rows)),
            )
        return join_batches(parts)


def require_finetunable(data: OfflineData) -> None:
    """Refuse fine-tuning, before any training, where the online phase does not apply."""
    if not isinstance(data.sampler, TransitionSampler) or data.discrete or data.info.metadata.get("multi_agent"):
        raise RlpipeError("fine-tuning online needs a continuous-action dataset held in memory (not multi-agent data)")


class FinetuneConfig(Protocol):
    """What `finetune_online` reads of a config: `FinetuneFields` and the run's env, seed and batch size."""

    env_id: str
    seed: int
    batch_size: int
    finetune_env_steps: int
    finetune_eval_every: int
    finetune_mixing_ratio: float | None


def finetune_online(
    run: Run,
    config: FinetuneConfig,
    data: OfflineData,
    actor: nn.Module,
    update: Update,
    updates: int,
    eval_policy: Callable[[np.ndarray], np.ndarray],
) -> tuple[int, int]:
    """Continue an offline run in its dataset's env for ``config.finetune_env_steps`` steps:
    the actor explores with sampled actions, every step is stored and earns one update on a
    minibatch of the dataset and the online data together, and the policy is evaluated every
    ``config.finetune_eval_every`` env steps (the curve goes on in updates). Where the
    dataset's batches carry returns-to-go, so do the online rows (`ReplayBuffer`). A goal
    env's Dict observations are flattened as the dataset's were. Returns (env steps, updates)."""
    envs = make_vec_env(config.env_id, 1)
    scaler = ActionScaler(data.action_space)
    stepper = VecStepper(envs, scaler, config.seed + FINETUNE_SEED_OFFSET)
    returns_to_go = data.sampler.returns_to_go if isinstance(data.sampler, TransitionSampler) else None
    online = ReplayBuffer(
        config.finetune_env_steps + 1, data.obs_dim, data.act_dim, data.device, seed=config.seed, returns_to_go=returns_to_go
    )
    replay = DatasetAndOnline(data.sampler, online, config.seed + FINETUNE_SEED_OFFSET, config.finetune_mixing_ratio)
    next_eval = config.finetune_eval_every
    obs = flatten_obs(stepper.obs)  # each observation flattened once: a step's next_obs is the stepper's next obs
    try:
        while stepper.env_steps < config.finetune_env_steps:
            with torch.no_grad():
                actions = cast(Acting, actor).act(torch.as_tensor(obs, dtype=torch.float32, device=data.device), False)
            step = stepper.step(actions.cpu().numpy())
            next_obs = flatten_obs(step.next_obs)
            online.store(replace(step, obs=obs, next_obs=next_obs))
            obs = next_obs
            for _ in range(int(step.valid.sum())):
                run.diagnostics.add(update(replay.sample(config.batch_size), updates))
                updates += 1
            run.show(updates, stepper.last_return)
            if stepper.env_steps >= next_eval or stepper.env_steps >= config.finetune_env_steps:
                next_eval += config.finetune_eval_every
                run.evaluate(eval_policy, updates)
    finally:
        envs.close()
    return stepper.env_steps, updates


def require_validatable(algo: str, config: OfflineConfig, data: OfflineData, actor: nn.Module, policy_of: Callable[..., PolicyFn]) -> None:
    """Refuse, before training, what held-out episodes cannot score on data with no environment."""
    where = f"dataset {data.info.name!r} names no environment"
    if policy_of is not policy_fn or isinstance(actor, RecurrentPolicy) or data.frame_stack > 1:
        raise RlpipeError(f"{where}: {algo} acts on episode histories, which its held-out rows cannot score one by one")
    for name in ("stop_at_return", "finetune_env_steps"):  # a return measured by playing, an env to act in
        if getattr(config, name, None):
            raise RlpipeError(f"{where}: {name} needs one")


def _take_snapshot(snapshots: Snapshots | None, run: Run, updates: int) -> None:
    """Keep a copy of the actor where the run has just been scored on its held-out episodes."""
    if snapshots is not None and run.history and run.history[-1].done == updates:
        point = run.history[-1]
        snapshots.take(updates, cast(float, point.validation_error), point.validation_td_error)


def select_checkpoint(config: OfflineConfig, data: OfflineData, snapshots: Snapshots) -> dict[str, Any]:
    """Score every snapshot with FQE on the whole dataset (``config.fqe_updates`` > 0), keep
    the one ``config.select_by`` picks in the actor, and return what ``metrics.json`` records."""
    assert data.validation is not None and data.all_rows is not None  # a run on data with no environment
    if config.fqe_updates:
        scaler = ActionScaler(data.action_space)
        policies = [SnapshotPolicy(policy_fn(actor, scaler, data.device), data.action_space) for actor in snapshots.actors()]
        fqe = FQEConfig(gamma=getattr(config, "gamma", FQEConfig.gamma), updates=config.fqe_updates, seed=config.seed)
        snapshots.score_fqe([(r.estimate, r.standard_error) for r in fitted_q_evaluation(policies, data.all_rows, fqe)])
    chosen = snapshots.select(config.select_by)
    snapshots.keep(chosen)
    return {
        "validation_episodes": len(data.validation.data.episode_starts()),
        "validation_transitions": len(data.validation),
        "checkpoints": [snapshot.record() for snapshot in snapshots.taken],
        "select_by": config.select_by,
        "selected_updates": chosen.updates,
        **{key: value for key, value in chosen.record().items() if key != "updates"},  # the kept policy's scores
    }


def _data_parallel(
    algo: str, config: OfflineConfig, sampler: Any, modules: dict[str, nn.Module], ranks: distributed.Ranks
) -> distributed.RankShard:
    """Set up this rank of a data-parallel run (`rlpipe.training.distributed`): rank 0's weights
    everywhere, a global RNG of the rank's own, and the rank's share of every batch."""
    distributed.require_data_parallel(algo, config)  # where torchrun started the ranks; --nproc checked before
    distributed.broadcast_modules(modules)
    torch.manual_seed(config.seed + distributed.RANK_SEED_OFFSET * ranks.rank)
    return distributed.RankShard(sampler, ranks)


@runtime_checkable
class Batched(Protocol):
    """A config's minibatch size: each algorithm declares its own ``batch_size`` field, in its
    place among the algorithm's fields (`OfflineConfig` has none)."""

    batch_size: int


@dataclass
class Learner:
    """What an offline algorithm hands `train_offline`: its networks and update, and how the
    loop samples, evaluates and saves them."""

    modules: dict[str, nn.Module]  # everything checkpointed; "policy" is the actor evaluated and saved
    # update(batch, update_index) on the sampler's batches: a `Batch` (an `Update`), or a sequence model's windows
    update: Callable[[Any, int], Diagnosed]
    # What a resumed run needs beyond ``modules``; None: --checkpoint-every is refused.
    optimizers: dict[str, torch.optim.Optimizer] | None = None
    update_period: int = 1  # the update's work repeats every this many indices (one CUDA graph captures a period)
    deterministic_eval: bool = True  # evaluate the actor's mode; False: its sampled actions
    # Batches from elsewhere than ``data.sampler``: a sequence model's windows (`rlpipe.training.windows`), MOPO's
    # mix of dataset and model rows. None: the dataset's transitions.
    sampler: Any = None
    # policy_of(actor, scaler, device, deterministic): the evaluated policy function; a policy
    # that keeps state across steps (a return-conditioned one) brings its own.
    policy_of: Callable[..., PolicyFn] = policy_fn
    extra_metrics: Callable[[], dict[str, Any]] = dict  # added to metrics.json when the run ends
    # A value method's critics measured on held-out episodes of data with no environment
    # (`ValidationSet.td_error`); None: the algorithm has no critic (BC, DT).
    td_errors: TDErrors | None = None

    @property
    def actor(self) -> nn.Module:
        """The policy that is evaluated and checkpointed."""
        return self.modules["policy"]


def _snapshots(algo: str, config: OfflineConfig, data: OfflineData, learner: Learner) -> Snapshots | None:
    """On data with no environment, the copies of the actor that its held-out episodes choose
    among (what they cannot score refused first); else None."""
    if data.validation is None:
        return None
    require_validatable(algo, config, data, learner.actor, learner.policy_of)
    return Snapshots(learner.actor)


def train_offline(
    algo: str, config: OfflineConfig, data: OfflineData, learner: Learner, out_dir: str | Path | None, progress: bool
) -> TrainResult:
    """Run `config.updates` updates of ``learner.update`` on `config.batch_size` samples,
    evaluating ``learner.actor`` every `config.eval_every` updates in the dataset's env; save
    the run like online ones.
    On CUDA the updates replay as a CUDA graph (:mod:`rlpipe.training.graphs`; not with a
    `MappedSampler`, which gathers on the CPU), captured over ``learner.update_period`` updates.
    With ``config.checkpoint_every`` the full state (``learner.modules``, ``learner.optimizers``,
    sampler, RNGs) is saved for resuming (:mod:`rlpipe.training.resume`); the optimizers are then required.
    """
    if not isinstance(config, Batched):
        raise RlpipeError(f"{algo}'s config declares no batch_size")
    actor, modules, update, optimizers = learner.actor, learner.modules, learner.update, learner.optimizers
    finetune = config if isinstance(config, FinetuneFields) and config.finetune_env_steps else None
    if finetune is not None:
        require_finetunable(data)
    update = mixed_precision(update, config.precision, data.device)
    snapshots = _snapshots(algo, config, data, learner)
    sampler: Any = data.sampler if learner.sampler is None else learner.sampler
    ranks = distributed.ranks()
    if ranks.parallel:
        sampler = _data_parallel(algo, config, sampler, modules, ranks)
    # A multi-agent dataset's policy is shared by the agents and scored as its env family says.
    team = dataset_evaluator(data.info) if data.info.metadata.get("multi_agent") else None
    run = Run(
        algo,
        config,
        out_dir if ranks.main else None,
        progress and ranks.main,
        evaluator=team,
        env_kwargs=team.env_kwargs if team else None,
        validation=data.validation.action_error if data.validation is not None else None,
        observation_space=data.info.observation_space if data.validation is not None else None,
        td_validation=None
        if data.validation is None or learner.td_errors is None
        else partial(data.validation.td_error, learner.td_errors),
    )
    if config.checkpoint_every is not None and optimizers is None:
        run.close()
        raise RlpipeError(f"{algo} does not support --checkpoint-every yet")
    # On data with no environment the copies kept for selection are part of the state.
    resumed = {**modules, **(optimizers or {}), "sampler": sampler, **({"snapshots": snapshots} if snapshots is not None else {})}
    checkpoints = Checkpointer(run, resumed, out_dir)
    eval_policy = learner.policy_of(actor, ActionScaler(data.action_space), data.device, learner.deterministic_eval)
    step = UpdateStepper(
        update,
        sampler,
        config.batch_size,
        config.updates,
        graph=graphs_enabled(data.device) and isinstance(sampler, TransitionSampler),
        period=learner.update_period,
    )
    try:
        updates = (checkpoints.restore() or {}).get("updates", 0)
        while True:
            updates += step(updates)
            run.diagnostics.add(step.last)
            run.show(updates)
            stop = run.maybe_evaluate(eval_policy, updates) if ranks.main else updates >= config.updates
            _take_snapshot(snapshots, run, updates)
            # Rank 0's evaluation may stop the run (stop_at_return): the ranks agree where it evaluates,
            # every eval_every updates (one update a step: no CUDA graph across processes).
            if ranks.parallel and (updates % config.eval_every == 0 or updates >= config.updates):
                stop = distributed.agree(stop)
            if stop:
                break
            checkpoints.maybe_save(updates, {"updates": updates})
        if not ranks.main:  # rank 0 alone evaluates and writes the run
            return TrainResult(algo, config.env_id, {}, [], actor)
        offline_end = run.evaluate_final(eval_policy, updates)  # before a multi-agent evaluator's metrics are read
        env_steps, phases = 0, {}
        _take_snapshot(snapshots, run, updates)
        if snapshots is not None:
            phases = select_checkpoint(config, data, snapshots)
        if finetune is not None:
            offline_heldout = {f"offline_{key}": value for key, value in run.heldout(eval_policy).items()}  # the same episodes as the end's
            env_steps, updates = finetune_online(run, finetune, data, actor, update, updates, eval_policy)
            phases = {
                "offline_updates": offline_end.done,
                "offline_eval_return_mean": offline_end.mean,
                **offline_heldout,
                "finetune_env_steps": env_steps,
            }
        extra = {**dataset_metrics(data), **phases, **(team.metrics() if team else {}), **learner.extra_metrics()}
        result = run.finish(eval_policy, actor, modules, data.action_space, env_steps, updates, extra)
        checkpoints.discard()
        if snapshots is not None:
            result.extras["snapshots"] = snapshots.taken
        return result
    finally:
        run.close()
        distributed.leave()
