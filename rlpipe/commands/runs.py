"""Preparing and running one training run: what ``rlpipe train`` and the ``train_online`` /
``train_offline`` DVC stages do.

:func:`prepare_run` reads the algorithm's spec from the registry, checks that the env or
dataset fits it, merges the options and typed settings into its config and names the run
directory; :func:`train_run` trains. Nothing is written before training starts.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import yaml

from rlpipe.algos.registry import RESUMABLE, SPECS, AlgoSpec, get_algo
from rlpipe.commands.cluster import ensure_ray
from rlpipe.datasets.store import DatasetInfo, open_dataset, reusing_opened, store_root
from rlpipe.envs import env_spaces, trusted_env_id
from rlpipe.envs.multiagent import is_multi_agent
from rlpipe.errors import RlpipeError
from rlpipe.limits import max_torch_threads
from rlpipe.storage.files import check_output_dir
from rlpipe.storage.names import confined_path
from rlpipe.training.config import RunConfig, typed_value
from rlpipe.training.distributed import launch, require_data_parallel
from rlpipe.training.loggers import check_loggers
from rlpipe.training.offline import dataset_env_id
from rlpipe.training.run import METRICS_FILE, EvalPoint, TrainResult, history_from_rows, history_rows

RANK_MODULE = "rlpipe.commands.rank"  # what each process of a data-parallel run runs
HISTORY_FILE = "history.json"  # rank 0's eval history, beside (not in) the run directory

# Offline algorithms that need the dataset's env even to train (data with no env: rlpipe.training.validation).
NEEDS_ENVIRONMENT = {"mopo": "its model's rollouts end by the env's termination rule"}

MAX_SETTINGS_BYTES = 16 << 20  # a --set-from file (params.yaml is a few kB)


@dataclass(frozen=True)
class PreparedRun:
    """A run ready to train: its algorithm, full config and output directory."""

    spec: AlgoSpec
    config: RunConfig
    run_dir: Path
    source: str  # the env id (online) or dataset name (offline) the run learns from
    dataset: DatasetInfo | None = None  # the dataset opened and checked here (offline), reused by the run


def merge_settings(options: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    """Options (None = not given) and ``--set`` settings as one override mapping; a field
    given both ways with different values is an RlpipeError."""
    given = {key: value for key, value in options.items() if value is not None}
    for key, value in settings.items():
        if key in given and given[key] != value:
            raise RlpipeError(f"{key} is given twice: as an option ({given[key]!r}) and as a setting ({value!r})")
    return {**given, **settings}


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error as one line: the problem and where (PyYAML's own text spans several lines
    and quotes the offending source)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        where = f"line {exc.problem_mark.line + 1}, column {exc.problem_mark.column + 1}"
        return f"{exc.context + ': ' if exc.context else ''}{exc.problem} at {where}"
    return " ".join(str(exc).split())


def read_settings(source: str, config_class: type) -> dict[str, Any]:
    """Typed settings from ``FILE:DOTTED.KEY`` (a YAML mapping at that key of the file), e.g.
    ``params.yaml:train_offline.bc-cartpole.set``: how DVC stages pass their ``set:`` mapping."""
    path, _, key = source.partition(":")
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_SETTINGS_BYTES + 1)  # bounded: the path may name /dev/zero or a huge file
        if len(raw) > MAX_SETTINGS_BYTES:
            raise RlpipeError(f"cannot read settings from {path}: larger than {MAX_SETTINGS_BYTES >> 20} MiB")
        tree: Any = yaml.safe_load(raw.decode())
    except (OSError, UnicodeDecodeError, RecursionError) as exc:
        raise RlpipeError(f"cannot read settings from {path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise RlpipeError(f"cannot read settings from {path}: {_yaml_problem(exc)}") from None
    for part in filter(None, key.split(".")):
        if not isinstance(tree, dict) or part not in tree:
            raise RlpipeError(f"{path} has no key {key!r}")
        tree = tree[part]
    tree = {} if tree is None else tree
    if not isinstance(tree, dict):
        raise RlpipeError(f"{source}: expected a mapping of settings, got {type(tree).__name__}")
    return {str(k): typed_value(config_class, str(k), v) for k, v in tree.items()}


def prepare_run(
    algo: str,
    *,
    env_id: str | None = None,
    dataset: str | None = None,
    store: str | os.PathLike | None = None,
    options: Mapping[str, Any] | None = None,
    settings: Mapping[str, Any] | None = None,
    run_dir: str | os.PathLike | None = None,
    runs_root: str | os.PathLike = "runs",
) -> PreparedRun:
    """Check and configure a run of ``algo``: online algorithms train in ``env_id``, offline
    ones on ``dataset`` (evaluated in the env of its metadata).

    A dataset that names no environment trains with ``env_id`` "" and is scored on held-out
    episodes (`rlpipe.training.validation`).
    ``options`` are config fields given as command options (None: not given), ``settings``
    typed ``--set`` values; the run directory defaults to ``runs_root/ALGO-ENV`` or
    ``runs_root/ALGO-DATASET``. Bad input is an RlpipeError before anything is written.
    """
    spec = get_algo(algo)
    overrides = merge_settings(options or {}, settings or {})
    check_loggers(overrides.get("loggers", ()))  # a missing extra is named before anything else is read or written
    info: DatasetInfo | None = None
    if spec.online:
        if dataset is not None:
            raise RlpipeError(f"{algo} is an online algorithm and trains in the environment; --dataset is for offline algorithms")
        if env_id is None:
            raise RlpipeError(f"{algo} needs --env (a Gymnasium env id, e.g. CartPole-v1)")
        _check_env(spec, env_id)
        source = env_id
    else:
        if dataset is None:
            raise RlpipeError(f"{algo} is an offline algorithm: give --dataset NAME (see `rlpipe datasets list`)")
        if env_id is not None:
            raise RlpipeError(f"{algo} evaluates in the env recorded in the dataset's metadata; drop --env")
        info = open_dataset(dataset, store)
        spec.check_spaces(f"dataset {info.name!r}", info.observation_space, info.action_space)
        if not info.env_id and (spec.name in NEEDS_ENVIRONMENT or info.metadata.get("multi_agent")):
            reason = NEEDS_ENVIRONMENT.get(spec.name, "a team's policy is scored by playing its env")
            raise RlpipeError(f"dataset {info.name!r} names no environment, which {algo} needs: {reason}")
        env_id = dataset_env_id(info) if info.env_id else ""  # the dataset opened once here; none: scored on held-out episodes
        overrides.update(dataset=dataset, store=None if store is None else str(store))
        source = dataset
    config = spec.make_config(env_id, **overrides)
    if config.checkpoint_every is not None and not spec.resumable:
        raise RlpipeError(f"{algo} does not support --checkpoint-every yet (resumable: {', '.join(RESUMABLE)})")
    out = Path(run_dir) if run_dir is not None else confined_path(runs_root, f"{algo}-{source}", "run name", option="--out")
    return PreparedRun(spec, config, out, source, info)


def _check_env(spec: AlgoSpec, env_id: str) -> None:
    """An RlpipeError unless ``spec`` can train in ``env_id``: a Gymnasium env whose spaces it
    accepts; a multi-agent env only for a multi-agent algorithm (whose config checks the id)."""
    if spec.multi_agent:
        return
    if is_multi_agent(env_id):
        multi = ", ".join(s.name for s in SPECS if s.multi_agent)
        raise RlpipeError(f"{env_id} is a multi-agent environment: train it with {multi}")
    spec.check_spaces(env_id, *env_spaces(env_id))


def prepare_resume(algo: str, run_dir: str | os.PathLike) -> PreparedRun:
    """The interrupted run in ``run_dir`` (trained with ``checkpoint_every``) prepared with its
    saved config, so :func:`train_run` continues it from its last saved state."""
    from rlpipe.training.resume import read_resume_info

    check_output_dir(run_dir, "--resume")  # its state's folder is named after it: a name too long fails here, in one line
    info = read_resume_info(run_dir)
    if info["algo"] != algo:
        raise RlpipeError(f"{run_dir} is a {info['algo']} run, not {algo}")
    return prepare_from_config(algo, info["config"], run_dir)


def prepare_from_config(algo: str, config: Mapping[str, Any], run_dir: str | os.PathLike) -> PreparedRun:
    """A run prepared from a config written as JSON (an interrupted run's saved config, or the
    one each rank of a data-parallel run is started with), checked as a new run's settings are."""
    settings = dict(config)
    env_id, dataset, store = settings.pop("env_id"), settings.pop("dataset", None), settings.pop("store", None)
    typed = {key: typed_value(get_algo(algo).config_class, key, value) for key, value in settings.items()}
    env_id = None if dataset else trusted_env_id(env_id, f"the run in {run_dir}")  # a dataset's env comes from the dataset
    return prepare_run(algo, env_id=env_id, dataset=dataset, store=store, settings=typed, run_dir=run_dir)


def train_ranks(run: PreparedRun, *, progress: bool = True, backend: str = "local") -> tuple[dict[str, Any], list[EvalPoint]]:
    """Train a prepared data-parallel run (``config.nproc`` > 1) as that many processes: on this
    machine under torch's elastic launcher (``backend="local"``,
    `rlpipe.training.distributed.launch`), or as Ray Train workers (``"ray"``: a local Ray, or
    ``$RAY_ADDRESS``'s cluster, whose nodes see the store and the run directory at the same
    paths). Every rank runs the same `train_run`; returns rank 0's ``metrics.json`` and eval
    history."""
    nproc = getattr(run.config, "nproc", 1)
    require_data_parallel(run.spec.name, run.config)
    # Absolute paths: a Ray worker runs in a directory of its own.
    config = {**asdict(run.config), "store": str(store_root(getattr(run.config, "store", None)).resolve())}
    run_dir = run.run_dir.resolve()
    if backend == "ray":
        history = _train_on_ray(run.spec.name, config, run_dir, nproc)
    elif backend == "local":
        if nproc > max_torch_threads():
            raise RlpipeError(f"nproc={nproc}: at most {max_torch_threads()} processes on this machine's {os.cpu_count()} cores")
        with tempfile.TemporaryDirectory(prefix="rlpipe-ranks-") as records:
            history_file = Path(records) / HISTORY_FILE
            launch(nproc, RANK_MODULE, [run.spec.name, str(run_dir), json.dumps(config), str(progress), str(history_file)])
            history = read_history(history_file)
    else:
        raise RlpipeError(f"--backend {backend!r}: expected local or ray")
    return cast("dict[str, Any]", json.loads((run_dir / METRICS_FILE).read_text())), history


def write_history(history: list[EvalPoint], path: str | Path) -> None:
    """Rank 0's eval history as JSON, for `train_ranks` to hand to its caller."""
    Path(path).write_text(json.dumps(history_rows(history)))


def read_history(path: Path) -> list[EvalPoint]:
    """The eval history `write_history` wrote."""
    return history_from_rows(json.loads(path.read_text()))


def _ray_rank(loop: dict[str, str]) -> None:
    """One Ray Train worker of `train_ranks`: Ray made the process group; the run joins it."""
    from ray.train import get_context

    result = train_run(prepare_from_config(loop["algo"], json.loads(loop["config"]), loop["run_dir"]), progress=False)

    if get_context().get_world_rank() == 0:
        write_history(result.history, loop["history_file"])


def _train_on_ray(algo: str, config: dict[str, Any], run_dir: Path, nproc: int) -> list[EvalPoint]:
    """`train_ranks` on Ray Train: ``nproc`` workers of a TorchTrainer (one CPU each, or a GPU
    each for a CUDA run), its own records and rank 0's eval history in a hidden sibling of the
    run directory, removed after. Returns that history."""
    ensure_ray(nproc)
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    cuda = str(config["device"]).startswith("cuda")
    records = run_dir.parent / f".ray-{run_dir.name}"
    trainer = TorchTrainer(
        _ray_rank,
        train_loop_config={
            "algo": algo,
            "config": json.dumps(config),
            "run_dir": str(run_dir),
            "history_file": str(records / HISTORY_FILE),
        },
        scaling_config=ScalingConfig(num_workers=nproc, use_gpu=cuda),
        run_config=RunConfig(name=run_dir.name, storage_path=str(records)),
    )
    records.mkdir(parents=True, exist_ok=True)
    try:
        trainer.fit()
    except Exception as exc:  # Ray Train's failure wraps the worker's error, whatever it was
        raise RlpipeError(f"the Ray Train run failed: {_last_line(exc)}") from None
    else:
        return read_history(records / HISTORY_FILE)
    finally:
        shutil.rmtree(records, ignore_errors=True)


def _last_line(exc: BaseException) -> str:
    """The innermost line of a wrapped error's text (a worker's exception under Ray's traceback)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def train_run(run: PreparedRun, *, progress: bool = True) -> TrainResult:
    """Train a prepared run; its checkpoint, ``metrics.json`` and curve go to ``run.run_dir``.
    An offline run's dataset, opened and checked by `prepare_run`, is not opened again
    (`reusing_opened`: the algorithms' ``train(config, ...)`` take a config, not the dataset)."""
    with reusing_opened(run.dataset):
        return run.spec.train(run.config, run.run_dir, progress=progress)


__all__ = [
    "PreparedRun",
    "merge_settings",
    "prepare_from_config",
    "prepare_resume",
    "prepare_run",
    "read_settings",
    "train_ranks",
    "train_run",
]
