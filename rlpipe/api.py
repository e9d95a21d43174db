"""rlpipe's Python API: what a notebook or another project calls instead of the CLI.

Every name here is also an attribute of the ``rlpipe`` package (``rlpipe.train``,
``rlpipe.load_dataset``, ...), imported on first use, so ``import rlpipe`` stays light.
The functions do what the commands of the same name do, with the same checks (bad input is
an `rlpipe.errors.RlpipeError` with the one-line message the CLI prints) and the
same files; they return objects instead of printing::

    import rlpipe

    rlpipe.collect("Pendulum-v1", expert="sac", from_training=True, expert_steps=10_000)
    data = rlpipe.load_dataset("pendulum-mixed")            # numpy arrays, memory-mapped
    result = rlpipe.train("cql", dataset="pendulum-mixed", out="runs/cql", updates=4_000)
    policy = rlpipe.load_policy(result.run_dir)               # numpy obs batch -> env actions
    print(rlpipe.evaluate(policy, episodes=20, seed=1_000).mean)

Datasets live in a store: ``store=`` names it, else ``$RLPIPE_DATASETS``, else ``./datasets``.
Settings are the fields of the algorithm's config dataclass (``rlpipe.make_config(algo, ...)``
shows them all), checked against their declared types as ``rlpipe train --set`` checks them.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlpipe.datasets.loader import TransitionArrays, load_dataset
from rlpipe.datasets.store import DatasetInfo, list_datasets, open_dataset, reusing_opened
from rlpipe.errors import ArgumentError, ArgumentTypeError, RlpipeError
from rlpipe.limits import MAX_ENV_STEPS, MAX_EPISODES, check_count, check_seed

if TYPE_CHECKING:
    from rlpipe.algos.policy import LoadedPolicy
    from rlpipe.commands.collect import CollectedDataset
    from rlpipe.commands.runs import PreparedRun
    from rlpipe.training.config import RunConfig
    from rlpipe.training.evaluation import EvalResult
    from rlpipe.training.run import TrainResult
    from rlpipe.training.sampler import MappedSampler, TransitionSampler

PathLike = str | os.PathLike


def collect(
    env_id: str,
    *,
    expert: str | None = None,
    from_training: bool = False,
    episodes: int | None = None,
    steps: int | None = None,
    expert_steps: int | None = None,
    seed: int = 0,
    name: str | None = None,
    store: PathLike | None = None,
    force: bool = False,
    progress: bool = False,
    **options: Any,
) -> CollectedDataset:
    """Collect a dataset from ``env_id`` into the store (``rlpipe collect``).

    Random actions unless ``expert`` names an algorithm (``"sac"``, ``"ppo"``, ...): its saved
    run is rolled out, trained first if there is none; with ``from_training`` every transition
    of a fresh expert run of ``expert_steps`` steps is stored (a mixed-quality dataset). Give
    ``episodes`` or ``steps`` (whole episodes either way) except with ``from_training``. The
    default ``name`` is ``<env>-random``, ``<env>-expert`` or ``<env>-mixed``; an existing
    dataset of that name is replaced only with ``force``. ``options`` are the remaining fields
    of the request, `rlpipe.commands.collect.CollectRequest`, and of its roll-out (``num_envs``,
    ``fmt``, ``stochastic``, ``workers``, ``info_keys``, ...). Returns the dataset's path and metadata.
    """
    from rlpipe.commands.collect import CollectRequest, collect_dataset

    _check_text("env_id", env_id)
    _check_text("name", name, optional=True)
    _check_path("store", store)
    if not from_training and (episodes is None) == (steps is None):
        raise ArgumentError("give exactly one of episodes= and steps=")
    for argument, count in (("episodes", episodes), ("steps", steps), ("expert_steps", expert_steps)):
        if count is not None:
            check_count(count, argument, MAX_ENV_STEPS)
    check_seed(seed)
    request = CollectRequest.of(
        env_id,
        expert=expert,
        from_training=from_training,
        episodes=episodes,
        steps=steps,
        expert_steps=expert_steps,
        seed=seed,
        name=name,
        store=store,
        force=force,
        progress=progress,
        **options,
    )
    return collect_dataset(request)


def make_config(
    algo: str, *, env: str | None = None, dataset: str | None = None, store: PathLike | None = None, **settings: Any
) -> RunConfig:
    """The config ``rlpipe train ALGO`` would use: the algorithm's tuned defaults for the env
    (online algorithms: ``env``; offline ones: the env recorded in ``dataset``'s metadata),
    then ``settings`` (config field names, values checked against the fields' types)."""
    return _prepare(algo, env, dataset, store, settings).config


def train(
    algo: str,
    config: RunConfig | None = None,
    *,
    env: str | None = None,
    dataset: str | None = None,
    store: PathLike | None = None,
    out: PathLike | None = None,
    progress: bool = False,
    **settings: Any,
) -> TrainResult:
    """Train ``algo`` and return its `rlpipe.training.run.TrainResult` (final
    metrics, the evaluation curve, the trained actor).

    Without ``config`` it is `make_config` of ``env``/``dataset`` and ``settings``;
    with one, ``settings`` replace its fields. With ``out`` the run directory is written as
    ``rlpipe train --out`` writes it (checkpoint, ``metrics.json``, curves), published only
    when training finishes; without it nothing is written and ``result.run_dir`` is None.

    An offline run with ``nproc=N`` > 1 trains as N processes on this machine, as
    ``rlpipe train --nproc N`` does (needs ``out``: rank 0 writes the run there, and the
    result is read back from it, with rank 0's eval history); called inside a group ``torchrun``
    started, this process is one of its ranks.
    """
    from rlpipe.algos import get_algo
    from rlpipe.commands.runs import PreparedRun as Prepared
    from rlpipe.training.config import refused_settings
    from rlpipe.training.distributed import launched_size

    _check_text("algo", algo)
    _check_path("out", out)
    spec = get_algo(algo)
    opened = None  # the dataset a config made here opened and checked: the run reuses it
    if config is None:
        prepared = _prepare(algo, env, dataset, store, settings)
        config, opened = prepared.config, prepared.dataset
    else:
        if env is not None or dataset is not None or store is not None:
            raise RlpipeError("give either a config or env/dataset/store, not both: the config names its env or dataset")
        if not isinstance(config, spec.config_class):
            raise RlpipeError(f"{algo} trains with a {spec.config_class.__name__} of {spec.module}, not a {type(config).__name__}")
        with refused_settings():
            config = replace(config, **_typed(algo, settings))
    nproc = getattr(config, "nproc", 1)
    if nproc > 1 and launched_size() == 1:
        if out is None:
            raise RlpipeError(f"nproc={nproc}: rank 0 of the processes writes the run; give out= a run directory")
        return _train_processes(Prepared(spec, config, Path(out), getattr(config, "dataset", "")), progress)
    with reusing_opened(opened):
        return spec.train(config, None if out is None else Path(out), progress=progress)


def _train_processes(run: PreparedRun, progress: bool) -> TrainResult:
    """`train` of a data-parallel config started from Python: its ranks as processes
    (`rlpipe.commands.runs.train_ranks`), the result read back from rank 0's run directory and history."""
    from rlpipe.commands.runs import train_ranks
    from rlpipe.training.run import TrainResult

    metrics, history = train_ranks(run, progress=progress)
    policy = load_policy(run.run_dir)
    return TrainResult(run.spec.name, run.config.env_id, metrics, history, policy.actor, run.run_dir, policy.checkpoint_sha256)


def load_policy(run_dir: PathLike, device: str = "cpu", deterministic: bool = True) -> LoadedPolicy:
    """The policy of a saved run: call it on a batch of observations ``[B, obs_dim]`` to get a
    batch of env actions (scaled to the env's bounds, or Discrete indices). Nothing is
    unpickled and the weights' hash is checked; ``.env_id`` names the env it acts in."""
    from rlpipe.algos import load_policy as load

    _check_path("run_dir", run_dir, optional=False)
    return load(Path(run_dir), device=device, deterministic=deterministic)


def evaluate(policy: LoadedPolicy | PathLike, episodes: int = 10, seed: int = 0, env_id: str | None = None) -> EvalResult:
    """Run ``episodes`` whole episodes of ``policy`` (a `LoadedPolicy` or a run
    directory) in its env, or in ``env_id``; episode ``k`` resets its env with ``seed + k``.
    Returns the mean and standard deviation of the returns, and each episode's return and length."""
    from rlpipe.algos.policy import LoadedPolicy
    from rlpipe.training.evaluation import evaluate as run_episodes

    check_count(episodes, "episodes", MAX_EPISODES)
    check_seed(seed)
    _check_text("env_id", env_id, optional=True)
    if isinstance(policy, str | os.PathLike):
        policy = load_policy(policy)
    if not isinstance(policy, LoadedPolicy):
        raise ArgumentTypeError(f"policy={policy!r}: expected a LoadedPolicy (rlpipe.load_policy) or a run directory")
    return run_episodes(policy, policy.played_in(env_id), episodes, seed)


def sampler(
    dataset: str, *, store: PathLike | None = None, device: str = "cpu", seed: int = 0, frame_stack: int = 1
) -> TransitionSampler | MappedSampler:
    """Uniform minibatches of ``dataset``'s transitions as torch tensors on ``device``
    (``.sample(batch_size)`` gives a `rlpipe.training.buffer.Batch`: obs, actions,
    rewards, next_obs, terminated), drawn as offline training draws them: loaded into RAM
    once, or gathered from the memory-mapped shards when these are over 1 GiB (compressed
    image frames counted decoded). Actions are in the env's units. The same seed draws the
    same batches either way. With
    ``frame_stack`` k > 1, obs and next_obs are ``[B, k, *frame]``: each row's episode's last
    k frames, the first frame repeated before the episode's start."""
    from rlpipe.datasets.frames import MAX_FRAME_STACK
    from rlpipe.datasets.mapped import MappedTransitions
    from rlpipe.training.env import resolve_device
    from rlpipe.training.offline import sample_from_maps
    from rlpipe.training.sampler import MappedSampler, TransitionSampler

    _check_text("dataset", dataset)
    _check_path("store", store)
    check_seed(seed)
    check_count(frame_stack, "frame_stack", MAX_FRAME_STACK)
    resolve_device(device)  # "tpu", or "cuda" without a GPU: one line before the dataset is read
    info = open_dataset(dataset, store)
    if sample_from_maps(info):
        return MappedSampler(MappedTransitions(info), device, seed, frame_stack=frame_stack)
    return TransitionSampler(load_dataset(dataset, store), device, seed, frame_stack=frame_stack)


def _prepare(algo: str, env: str | None, dataset: str | None, store: PathLike | None, settings: dict[str, Any]) -> PreparedRun:
    """`rlpipe.commands.runs.prepare_run` of `make_config`'s arguments, their types checked."""
    from rlpipe.algos import get_algo
    from rlpipe.commands.runs import prepare_run

    _check_text("algo", algo)
    _check_text("env", env, optional=True)
    _check_text("dataset", dataset, optional=True)
    _check_path("store", store)
    online = get_algo(algo).online
    if online and env is None:
        raise ArgumentError(f"{algo} trains in an environment: give env= (a Gymnasium env id, e.g. 'CartPole-v1')")
    if not online and dataset is None:
        raise ArgumentError(f"{algo} is an offline algorithm: give dataset= (rlpipe.list_datasets() names them)")
    # run_dir given so that no default run directory is named: where a run goes is train's `out`
    return prepare_run(algo, env_id=env, dataset=dataset, store=store, settings=_typed(algo, settings), run_dir=".")


def _check_path(argument: str, value: object, optional: bool = True) -> None:
    """A TypeError naming ``argument`` unless ``value`` is a path (a string or ``os.PathLike``; or None when ``optional``)."""
    if not (isinstance(value, str | os.PathLike) or (optional and value is None)):
        raise ArgumentTypeError(f"{argument}={value!r}: expected a path (str or os.PathLike){' or None' if optional else ''}")


def _check_text(argument: str, value: object, optional: bool = False) -> None:
    """A TypeError naming ``argument`` unless ``value`` is a string (or None when ``optional``)."""
    if not (isinstance(value, str) or (optional and value is None)):
        raise ArgumentTypeError(f"{argument}={value!r}: expected a string{' or None' if optional else ''}")


def _typed(algo: str, settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` checked against ``algo``'s config fields (an unknown name or a wrong type: an
    `ArgumentError`, a ValueError naming the setting)."""
    from rlpipe.algos import get_algo
    from rlpipe.training.config import typed_value

    config_class = get_algo(algo).config_class
    return {key: typed_value(config_class, key, value) for key, value in settings.items()}


__all__ = [
    "DatasetInfo",
    "TransitionArrays",
    "collect",
    "evaluate",
    "list_datasets",
    "load_dataset",
    "load_policy",
    "make_config",
    "open_dataset",
    "sampler",
    "train",
]
