"""Collecting a dataset end to end: choose the behaviour policy (random, a trained expert,
or an expert's whole training run), name the dataset, stream the episodes through a
`DatasetWriter` and record who produced them in its metadata.

`rlpipe collect`, the tests and the benchmarks all call :func:`collect_dataset`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rlpipe.datasets.collector import (
    CollectionEnvs,
    CollectStats,
    EnvRef,
    Policy,
    RandomPolicy,
    RowSink,
    check_budget,
    collect,
    resolve_env,
)
from rlpipe.datasets.scores import reference_scores
from rlpipe.datasets.store import check_name
from rlpipe.datasets.writer import DatasetWriter
from rlpipe.envs import env_slug, has_native_vector_env
from rlpipe.envs.multiagent import is_multi_agent
from rlpipe.errors import RlpipeError
from rlpipe.limits import check_num_envs, check_seed
from rlpipe.storage.files import check_output_dir

if TYPE_CHECKING:
    import gymnasium as gym

POLICIES = ("random",)  # behaviour policies that need no expert
INFO_KEYS = ("is_success",)  # env info keys stored as info/next_info columns by default


@dataclass(frozen=True)
class Rollout:
    """One collection's roll-out: its budget (whole episodes, or at least this many steps),
    envs (None: auto, resolved by `collect_dataset`), seed, progress bar and the info keys
    its rows keep when the env reports them."""

    episodes: int | None = None
    steps: int | None = None
    num_envs: int | None = None
    seed: int = 0
    progress: bool = True
    info_keys: tuple[str, ...] = INFO_KEYS

    @property
    def budget(self) -> dict[str, int | None]:
        """The budget as a producer records it."""
        return {"episodes": self.episodes, "steps": self.steps}

    @property
    def env_count(self) -> int:
        """`num_envs`, once `collect_dataset` has resolved it."""
        return cast(int, self.num_envs)

    def run(self, env: EnvRef, envs: CollectionEnvs | None, make_policy: Callable[[gym.Space, int], Policy], sink: RowSink) -> CollectStats:
        """Roll out ``make_policy``'s policy in ``envs`` (built by `resolve_env`; None: built by
        `collect`) for this budget, rows to ``sink``."""
        return collect(
            env.env_id,
            make_policy,
            sink,
            episodes=self.episodes,
            steps=self.steps,
            num_envs=self.env_count,
            seed=self.seed,
            show_progress=self.progress,
            info_space=env.info_space,
            envs=envs,
        )


@dataclass(frozen=True)
class CollectRequest:
    """One collection as asked, built once by ``rlpipe collect`` or `rlpipe.api.collect` and
    passed down: the env, the behaviour policy (random, or an expert; see `collect_dataset`),
    the roll-out, and the dataset's name, format (None: arrow) and store."""

    env_id: str
    rollout: Rollout = Rollout()
    policy: str = "random"
    expert: str | None = None
    expert_run: Path | None = None
    expert_steps: int | None = None
    expert_settings: dict[str, Any] | None = None
    from_training: bool = False
    stochastic: bool = False
    name: str | None = None
    fmt: str | None = None
    store: str | os.PathLike | None = None
    force: bool = False
    backend: str | None = None
    workers: int | None = None

    @classmethod
    def of(cls, env_id: str, **options: Any) -> CollectRequest:
        """The request of keyword options: `Rollout`'s fields go to the roll-out, the others are this class's."""
        rollout_fields = {f.name for f in fields(Rollout)}
        rollout = Rollout(**{key: value for key, value in options.items() if key in rollout_fields})
        return cls(env_id, rollout, **{key: value for key, value in options.items() if key not in rollout_fields})

    @property
    def format(self) -> str:
        """The dataset's format: `fmt`, arrow when not given."""
        return self.fmt or "arrow"


@dataclass(frozen=True)
class RandomProducer:
    """Metadata `producer` of a dataset collected with uniform random actions."""

    seed: int
    num_envs: int
    params: dict[str, int | None]  # the collection budget: episodes or steps
    algorithm: str = "random"
    checkpoint_sha256: None = None


@dataclass(frozen=True)
class ExpertProducer:
    """Metadata `producer` of a dataset collected with a trained expert's policy."""

    algorithm: str
    checkpoint_sha256: str
    run_dir: str
    deterministic: bool
    seed: int
    num_envs: int
    params: dict[str, Any]  # the collection budget (episodes or steps), and expert_settings when given


@dataclass(frozen=True)
class TrainingReplayProducer:
    """Metadata `producer` of a dataset holding every transition of an expert's training run."""

    algorithm: str
    checkpoint_sha256: str
    run_dir: str
    seed: int
    params: dict[str, Any]  # the training budget (expert_steps), and expert_settings when given
    final_eval_return_mean: float | None
    mode: str = "training-replay"


Producer = RandomProducer | ExpertProducer | TrainingReplayProducer


@dataclass(frozen=True)
class CollectedDataset:
    """Where a collected dataset was written and its metadata."""

    path: Path
    metadata: dict[str, Any]

    def summary(self) -> dict[str, Any]:
        """Name, episode and step counts and return statistics (what `--metrics` writes)."""
        meta = self.metadata
        returns = meta["episode_return"]
        return {
            "dataset": meta["name"],
            "episodes": meta["total_episodes"],
            "steps": meta["total_steps"],
            "return_mean": returns["mean"],
            "return_std": returns["std"],
        }


def dataset_name(env_id: str, kind: str) -> str:
    """The default name: `<env slug>-<kind>`, e.g. cartpole-random, pendulum-mixed."""
    return f"{env_slug(env_id)}-{kind}"


def collect_dataset(request: CollectRequest | str, /, **options: Any) -> CollectedDataset:
    """Collect the dataset `request` asks for into its store and return where it went. An env
    id with keyword options stands for `CollectRequest.of` of them (how the tests and
    benchmarks call it).

    The behaviour policy is `policy` (random) unless `expert` names an algorithm: then its
    run in `expert_run` (default models/<expert>-<env>, retrained when its params differ) is
    loaded, or trained first, and rolled out (`stochastic`: sampled actions). With
    `from_training` the expert is trained from scratch and every transition it saw is
    stored (a mixed-quality dataset). `expert_settings` are config fields of the expert's
    training (typed, e.g. from `--expert-set`; `stop_at_return` stops it at a medium policy),
    on top of `expert_steps` and the seed. Give the roll-out's `episodes` or `steps` (whole episodes either way),
    except with `from_training`, whose budget is `expert_steps`. The default name is
    `<env>-random`, `<env>-expert` or `<env>-mixed`. Those `info_keys` the env reports are
    stored as `info`/`next_info` columns (not for training runs). The metadata gets reference
    scores (`rlpipe.datasets.scores`). `fmt` defaults to "arrow"; "both" adds Minari's HDF5 layout, whose per-episode objects cost
    far more than the collection itself (docs/benchmarks.md).
    Multi-agent envs go to :func:`collect_multi_agent`. Nothing is left in the
    store on failure. `num_envs`
    None picks it from the env and the budget (`auto_num_envs`); the producer records the number used.
    The env is built once before the first row (`resolve_env`): the envs that read its spaces
    and info keys are those the roll-out steps (a one-env probe where the collection runs elsewhere).

    With `backend` ("local" or "ray") or `workers`, the budget is split into tasks run by
    `workers` processes or Ray tasks (`rlpipe.commands.tasks`): the same bytes for any
    number of workers and either backend (but not the bytes of a single-process collection).
    """
    if isinstance(request, str):
        request = CollectRequest.of(request, **options)
    elif options:
        raise TypeError(f"collect_dataset: give a CollectRequest or an env id with options, not both ({', '.join(options)})")
    _check_request(request)
    env_id, rollout, expert = request.env_id, request.rollout, request.expert
    if is_multi_agent(env_id):
        return collect_multi_agent(request)
    _check_choice(request)
    overrides = expert_overrides(request.expert_steps, rollout.seed, request.expert_settings or {})
    in_tasks = request.backend is not None or request.workers is not None
    if request.from_training and in_tasks:
        raise RlpipeError("--from-training is one training run: it cannot be split over --workers/--backend")
    if rollout.num_envs is None:
        rollout = replace(rollout, num_envs=auto_num_envs(env_id, rollout.episodes, rollout.steps, batched_policy=expert is not None))
    kind = "mixed" if request.from_training else ("expert" if expert else request.policy)
    in_process = not (in_tasks or request.from_training)  # whether the roll-out steps envs here: then the probe is them
    info_keys = () if request.from_training else rollout.info_keys
    env, envs = resolve_env(env_id, info_keys, rollout.num_envs if in_process else None)  # validates the id before any file is made
    with ExitStack() as stack:
        if envs is not None:
            stack.callback(envs.close)
        writer = stack.enter_context(
            DatasetWriter(
                dataset_name(env_id, kind) if request.name is None else request.name,
                env.observation_space,
                env.action_space,
                env_id=env_id,
                store=request.store,
                fmt=request.format,
                force=request.force,
                info_space=env.info_space,
            )
        )
        producer: Producer
        if in_tasks:
            producer, expert_return = _collect_in_tasks(request, rollout, writer, overrides)
        elif expert is None:
            rollout.run(env, envs, lambda space, n: RandomPolicy(space, n, seed=rollout.seed), writer.write)
            producer = RandomProducer(rollout.seed, rollout.env_count, rollout.budget)
            expert_return = None
        elif request.from_training:
            producer = _store_training_run(expert, env_id, writer, request.expert_run, overrides, rollout.progress)
            expert_return = producer.final_eval_return_mean
        else:
            producer, expert_return = _roll_out_expert(expert, request, rollout, env, envs, writer, overrides)
        path = writer.finalize(asdict(producer), reference_scores(env_id, expert_return))
    return CollectedDataset(path, writer.metadata)


AUTO_MAX_ENVS = 256  # CartPole, random policy, 300k steps: 1 env 68k, 64 envs 358k, 256 envs 615k steps/s of CPU time
AUTO_STEPS_PER_ENV = 2_000  # each env's least share of a --steps budget (an env overshoots it by < 1 episode)
AUTO_EPISODES_PER_ENV = 4  # each env's least share of an --episodes budget
AUTO_POLICY_ENVS = 8  # envs that share one forward pass of an expert's network when the env itself is not batched


def auto_num_envs(env_id: str, episodes: int | None, steps: int | None, batched_policy: bool) -> int:
    """How many envs `--num-envs auto` steps.

    An env with a numpy-batched vector implementation (CartPole) costs little per extra env,
    so it gets up to `AUTO_MAX_ENVS`, bounded so each env's share of the budget stays large.
    Any other env is stepped one by one in Python (a SyncVectorEnv), where more envs only add
    overhead (Pendulum: 1 env 42k, 8 envs 30k steps/s): one env, unless an expert's batched
    forward pass is to be shared (`AUTO_POLICY_ENVS`).
    """
    if not has_native_vector_env(env_id):
        return AUTO_POLICY_ENVS if batched_policy else 1
    share = steps // AUTO_STEPS_PER_ENV if steps is not None else (episodes or 0) // AUTO_EPISODES_PER_ENV
    return int(min(AUTO_MAX_ENVS, max(1, share)))


def _check_request(request: CollectRequest) -> None:
    """One-line errors for options that are wrong for any env (before any work)."""
    check_seed(request.rollout.seed)
    if request.name is not None:
        check_name(request.name)  # an empty name is refused, not replaced by the default
    if request.expert_run is not None:
        check_output_dir(request.expert_run, "--expert-run")  # a missing expert is trained there: a name too long fails now
    if request.rollout.num_envs is not None:
        check_num_envs(request.rollout.num_envs)
    if request.expert_settings and (request.expert is None or is_multi_agent(request.env_id)):
        raise RlpipeError("--expert-set sets how an --expert sac|ppo is trained: give --expert (not with multi-agent envs)")


def _check_choice(request: CollectRequest) -> None:
    """One-line errors for a policy/expert/budget combination that makes no dataset (before
    the store is touched)."""
    expert, from_training, rollout = request.expert, request.from_training, request.rollout
    if expert is None and request.policy not in POLICIES:
        raise RlpipeError(f"unknown policy {request.policy!r}: use --policy random, or --expert ppo|sac")
    if expert is not None:
        from rlpipe.commands import experts  # torch: only collections with an expert import it

        experts.check_expert(expert)
    if from_training and expert is None:
        raise RlpipeError("--from-training needs --expert (the algorithm to train)")
    if from_training and (rollout.episodes is not None or rollout.steps is not None):
        raise RlpipeError("--from-training stores the whole training run: use --expert-steps, not --episodes/--steps")
    if not from_training:
        check_budget(rollout.episodes, rollout.steps)
    if request.expert_steps is not None and request.expert_steps < 1:
        raise RlpipeError(f"--expert-steps must be at least 1, got {request.expert_steps}")


def expert_overrides(expert_steps: int | None, seed: int, settings: dict[str, Any]) -> dict[str, Any]:
    """The expert's config overrides: `settings` (config fields) plus the budget and seed,
    which have options of their own (`--expert-steps`, `--seed`) and are refused as settings."""
    for key, option in (("seed", "--seed"), ("env_steps", "--expert-steps")):
        if key in settings:
            raise RlpipeError(f"--expert-set {key}: use {option}")
    return {**settings, "env_steps": expert_steps, "seed": seed}


def _expert_params(overrides: dict[str, Any]) -> dict[str, Any]:
    """The producer's record of the expert's training settings, only when some were given
    (a collection without them keeps the plain budget record)."""
    settings = {k: v for k, v in overrides.items() if k not in ("env_steps", "seed")}
    return {"expert_settings": settings} if settings else {}


def _collect_in_tasks(
    request: CollectRequest, rollout: Rollout, writer: DatasetWriter, overrides: dict[str, Any]
) -> tuple[RandomProducer | ExpertProducer, float | None]:
    """Collect `rollout`'s budget as tasks (`rlpipe.commands.tasks`); the expert, if any, is
    loaded (or trained) here first and reloaded from its run directory by each task."""
    from rlpipe.commands.tasks import TaskPolicy, collect_tasks

    expert, env_id, stochastic = request.expert, request.env_id, request.stochastic
    budget = rollout.budget
    policy = TaskPolicy()
    if expert is not None:
        from rlpipe.commands import experts

        run_dir = request.expert_run or experts.default_run_dir(expert, env_id)
        loaded, _ = experts.ensure_expert(
            expert,
            env_id,
            run_dir,
            overrides,
            match_params=request.expert_run is None,
            deterministic=not stochastic,
            progress=rollout.progress,
        )
        policy = TaskPolicy(str(Path(run_dir).resolve()), not stochastic)
    tasks, mean_return = collect_tasks(
        writer,
        env_id,
        policy,
        **budget,
        seed=rollout.seed,
        num_envs=rollout.env_count,
        backend=request.backend or "local",
        workers=request.workers or 1,
    )
    params = {**budget, "tasks": tasks}
    if expert is None:
        return RandomProducer(rollout.seed, rollout.env_count, params), None
    return ExpertProducer(
        expert,
        loaded.checkpoint_sha256,
        str(run_dir),
        not stochastic,
        rollout.seed,
        rollout.env_count,
        {**params, **_expert_params(overrides)},
    ), mean_return


def _store_training_run(
    expert: str, env_id: str, writer: DatasetWriter, expert_run: Path | None, overrides: dict[str, Any], progress: bool
) -> TrainingReplayProducer:
    """Train `expert` from scratch into its run directory, every transition going to `writer`."""
    from rlpipe.commands import experts

    run_dir = expert_run or experts.expert_run_dir(expert, env_id, overrides)
    training = experts.collect_training_transitions(expert, env_id, writer, run_dir, overrides, progress=progress)
    return TrainingReplayProducer(
        expert,
        training["checkpoint_sha256"],
        str(run_dir),
        overrides["seed"],
        {"expert_steps": overrides["env_steps"], **_expert_params(overrides)},
        training.get("eval_return_mean"),
    )


def _roll_out_expert(
    expert: str,
    request: CollectRequest,
    rollout: Rollout,
    env: EnvRef,
    envs: CollectionEnvs | None,
    writer: DatasetWriter,
    overrides: dict[str, Any],
) -> tuple[ExpertProducer, float]:
    """Load (or first train) the expert and collect `rollout`'s budget of its episodes from
    `envs` into `writer`; returns the producer record and the mean return of the stored episodes.

    Without an `expert_run` the default run is retrained when its saved params differ; a given
    run is used as it is.
    """
    from rlpipe.commands import experts
    from rlpipe.training.seeding import seed_everything

    stochastic = request.stochastic
    run_dir = request.expert_run or experts.expert_run_dir(expert, env.env_id, overrides)
    loaded, _ = experts.ensure_expert(
        expert,
        env.env_id,
        run_dir,
        overrides,
        match_params=request.expert_run is None,
        deterministic=not stochastic,
        progress=rollout.progress,
    )
    seed_everything(rollout.seed, torch_threads=None)  # an expert's sampled actions (--stochastic) repeat with the seed
    stats = rollout.run(env, envs, lambda space, n: loaded, writer.write)
    producer = ExpertProducer(
        expert,
        loaded.checkpoint_sha256,
        str(run_dir),
        not stochastic,
        rollout.seed,
        rollout.env_count,
        {**rollout.budget, **_expert_params(overrides)},
    )
    return producer, stats.mean_return


def collect_multi_agent(request: CollectRequest) -> CollectedDataset:
    """Collect the request's ``episodes`` whole episodes of a multi-agent env, one row per living agent per
    step (an ``agent`` column), with random actions or a trained run's team policy, as the
    env's family collects them (:mod:`rlpipe.training.multiagent`); 8 envs unless ``num_envs``
    is given. Arrow only: Minari's HDF5 has no multi-agent layout."""
    from rlpipe.training.multiagent import family_plugin

    env_id, expert, expert_run, policy, fmt = request.env_id, request.expert, request.expert_run, request.policy, request.format
    episodes, steps, seed, num_envs = request.rollout.episodes, request.rollout.steps, request.rollout.seed, request.rollout.num_envs or 8
    plugin = family_plugin(env_id)
    if plugin.collection is None:
        raise RlpipeError(f"rlpipe collect has no multi-agent collection for {env_id!r}")
    if fmt != "arrow":
        raise RlpipeError(
            f"--format {fmt}: multi-agent datasets are Arrow-only (Minari's HDF5 has no multi-agent layout); use --format arrow"
        )
    if steps is not None or episodes is None:
        raise RlpipeError("multi-agent collection counts whole episodes: give --episodes N")
    check_budget(episodes, steps)
    choices = "|".join(plugin.experts)
    if expert is not None and (expert not in plugin.experts or expert_run is None):
        raise RlpipeError(
            f"multi-agent experts of {env_id}: --expert {choices} --expert-run RUN_DIR (a trained `rlpipe train {choices}` run)"
        )
    if expert is None and policy not in POLICIES:
        raise RlpipeError(f"unknown policy {policy!r}: use --policy random, or --expert {choices} --expert-run RUN")
    saved = None
    if expert_run is not None and expert is not None:
        from rlpipe.commands.experts import load_saved_actor

        saved = load_saved_actor(expert_run)
        if saved.meta["env_id"] != env_id:
            raise RlpipeError(f"--expert-run {expert_run} was trained on {saved.meta['env_id']}, not {env_id}")
    collection = plugin.collection(saved, request.stochastic, seed)
    with DatasetWriter(
        dataset_name(env_id, "expert" if expert else policy) if request.name is None else request.name,
        collection.observation_space,
        collection.action_space,
        env_id=env_id,
        store=request.store,
        fmt="arrow",
        force=request.force,
        multi_agent=True,
    ) as writer:
        collection.play(writer.write, episodes, num_envs, seed)
        producer = {**collection.producer, "seed": seed, "num_envs": num_envs, "params": {"episodes": episodes}}
        path = writer.finalize(producer)
    return CollectedDataset(path, writer.metadata)
