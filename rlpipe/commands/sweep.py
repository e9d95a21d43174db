"""Multi-seed sweeps: every setting of a grid trained with every seed, the final eval
returns gathered into one summary (mean, std and a bootstrap interval over seeds).

``rlpipe sweep`` and the ``sweep_*`` DVC stages call :func:`run_sweep`. Each trial is one
:func:`~rlpipe.commands.runs.train_run` in its own directory ``ROOT/runs/SETTING/seed-K``;
the ``local`` backend runs trials in spawned worker processes (one per core), the ``ray``
backend as Ray Tune trials with one CPU each (Ray is imported only then). Batched, the
seeds of each setting train together as one computation in this process (algorithms
with ``batched_seeds``, rlpipe.training.seedstack), into the same run directories.

On Ray a failed trial (an error, or a lost worker) is restarted up to ``retries`` times.
With ``checkpoint_every`` among the settings the restarted trial continues from its last
saved state: it trains the same config into the same run directory, and
:mod:`rlpipe.training.resume` picks up the state saved beside it (``.resume-<run>``), so it
ends where an uninterrupted trial ends. On several machines the sweep root must be shared
storage (as Tune's ``storage_path`` must), which is also what lets a trial restarted on
another node find that state; it is therefore not copied into Tune checkpoints as well.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlpipe.errors import RlpipeError
from rlpipe.limits import check_seed
from rlpipe.storage.files import atomic_write_text, check_output_dir
from rlpipe.storage.names import confined_path
from rlpipe.training.config import parse_settings

if TYPE_CHECKING:
    from rlpipe.commands.runs import PreparedRun

BACKENDS = ("local", "ray")
SUMMARY_FILE = "summary.json"
RUNS_DIR = "runs"
BOOTSTRAP_SAMPLES = 10_000
MAX_SEEDS = 1_000  # seeds per setting: each is a training run; a longer list is a typo (0-99999999)
DEFAULT_SETTING = "default"


@dataclass(frozen=True)
class Trial:
    """One run of a sweep: a setting (its name and typed values) and a seed."""

    setting: str
    values: Mapping[str, Any]
    seed: int
    run_dir: Path


DATASET_AXIS = "dataset"  # a grid key naming the trial's dataset (a sweep over several datasets)


@dataclass(frozen=True)
class SweepSpec:
    """What every trial of a sweep shares: the algorithm, its env or dataset and fixed
    settings (a sweep over several datasets has none here: each trial's is its setting's
    ``DATASET_AXIS`` value)."""

    algo: str
    env_id: str | None = None
    dataset: str | None = None
    store: str | None = None
    fixed: Mapping[str, Any] = field(default_factory=dict)


def sweep_dir(root: str | os.PathLike, name: str | None, algo: str, source: str | None) -> Path:
    """The directory of sweep ``name`` under ``root`` (default ``ALGO-SOURCE``, several
    datasets joined by ``_``): a name that is not one of ``rlpipe.storage.names`` (``/``-separated
    parts may nest; nothing leaves ``root``), an empty one included, is an RlpipeError."""
    if name is None:
        return confined_path(root, f"{algo}-{'_'.join((source or '').split(','))}", "sweep name", option="--name")
    return confined_path(root, name, "sweep name")


def parse_seeds(text: str) -> list[int]:
    """``0-4`` -> [0, 1, 2, 3, 4]; ``0,3,7`` and mixes such as ``0-2,9`` also work. Seeds
    lie in rlpipe.limits' range; at most MAX_SEEDS of them (checked before a range is listed)."""
    parts: list[range] = []
    try:
        for part in filter(None, text.split(",")):
            low, sep, high = part.partition("-")
            parts.append(range(int(low), int(high) + 1) if sep else range(int(low), int(low) + 1))
    except ValueError:
        raise RlpipeError(f"--seeds expects e.g. 0-4 or 0,1,2; got {text!r}") from None
    if sum(max(0, part.stop - part.start) for part in parts) > MAX_SEEDS:  # not len(): it overflows past 2**63
        raise RlpipeError(f"--seeds {text!r}: at most {MAX_SEEDS} seeds per setting")
    seeds = [seed for part in parts for seed in part]
    if not seeds or len(set(seeds)) != len(seeds):
        raise RlpipeError(f"--seeds {text!r}: expected distinct seeds")
    for seed in (min(seeds), max(seeds)):
        check_seed(seed, "--seeds")
    return seeds


def _split_values(raw: str) -> list[str]:
    """Split ``v1,v2`` on the commas outside brackets, so ``[64, 64],[256, 256]`` is two values."""
    values, depth, start = [], 0, 0
    for i, char in enumerate(raw):
        if char in "[{(":
            depth += 1
        elif char in "]})":
            depth -= 1
        elif char == "," and depth == 0:
            values.append(raw[start:i])
            start = i + 1
    return values + [raw[start:]]


def parse_grid(pairs: Sequence[str], config_class: type) -> dict[str, list[Any]]:
    """``KEY=V1,V2`` strings -> key -> typed values (each checked like ``--set KEY=V``)."""
    grid: dict[str, list[Any]] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise RlpipeError(f"--set expects KEY=V1,V2,..., got {pair!r}")
        typed = [parse_settings([f"{key}={value}"], config_class) for value in _split_values(raw)]
        name = next(iter(typed[0]))
        if name in grid:
            raise RlpipeError(f"--set {name} is given twice")
        grid[name] = [t[name] for t in typed]
    return grid


def setting_name(values: Mapping[str, Any]) -> str:
    """The directory name of a setting, e.g. ``learning_rate=0.001,tau=0.01`` (``default``: none)."""
    if not values:
        return DEFAULT_SETTING
    text = ",".join(
        f"{key}={json.dumps(value, separators=(',', ':')) if isinstance(value, (list, tuple)) else value}" for key, value in values.items()
    )
    return text.replace("/", "_").replace(" ", "")


def plan_trials(grid: Mapping[str, Sequence[Any]], seeds: Sequence[int], root: Path) -> list[Trial]:
    """Every (setting, seed) pair of the grid, settings in grid order, seeds innermost."""
    keys = list(grid)
    trials = []
    for combo in itertools.product(*(grid[key] for key in keys)):
        values = dict(zip(keys, combo))
        name = setting_name(values)
        trials += [Trial(name, values, seed, root / RUNS_DIR / name / f"seed-{seed}") for seed in seeds]
    return trials


def prepare_trial(spec: SweepSpec, trial: Trial) -> PreparedRun:
    """The trial's run, its config built and checked (nothing trained yet)."""
    from rlpipe.commands.runs import prepare_run

    values = {key: value for key, value in trial.values.items() if key != DATASET_AXIS}
    return prepare_run(
        spec.algo,
        env_id=spec.env_id,
        dataset=trial.values.get(DATASET_AXIS, spec.dataset),
        store=spec.store,
        settings={**spec.fixed, **values, "seed": trial.seed},
        run_dir=trial.run_dir,
    )


def run_trial(spec: SweepSpec, trial: Trial) -> dict[str, Any]:
    """Train one trial (no progress bar) and return its ``metrics.json`` values."""
    from rlpipe.commands.runs import train_run

    return train_run(prepare_trial(spec, trial), progress=False).metrics


def bootstrap_interval(values: Sequence[float], samples: int = BOOTSTRAP_SAMPLES, seed: int = 0) -> tuple[float, float]:
    """The 95% percentile-bootstrap interval of the mean of ``values`` (resampled with a fixed seed)."""
    data = np.asarray(values, dtype=np.float64)
    means = np.random.default_rng(seed).choice(data, size=(samples, len(data))).mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(low), float(high)


def summary_metric(result: Mapping[str, Any]) -> str:
    """The return a sweep compares: the held-out evaluation (episodes on seeds never used for
    tuning) where the run made one, else the last periodic evaluation."""
    return "heldout_return_mean" if "heldout_return_mean" in result else "eval_return_mean"


def summarize(trials: Sequence[Trial], metrics: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per setting: the final returns by seed (held-out where measured, see
    :func:`summary_metric`), their mean, std (ddof=1) and 95% bootstrap interval."""
    by_setting: dict[str, dict[int, float]] = {}
    sources: dict[str, set[str]] = {}
    for trial, result in zip(trials, metrics):
        key = summary_metric(result)
        by_setting.setdefault(trial.setting, {})[trial.seed] = float(result[key])
        sources.setdefault(trial.setting, set()).add(key)
    summary = {}
    for name, returns in by_setting.items():
        values = list(returns.values())
        low, high = bootstrap_interval(values)
        summary[name] = {
            "seeds": len(values),
            "metric": "/".join(sorted(sources[name])),
            "return_mean": float(np.mean(values)),
            "return_std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
            "return_ci95_low": low,
            "return_ci95_high": high,
            "returns": {f"seed-{seed}": value for seed, value in returns.items()},
        }
    return summary


def _run_local(spec: SweepSpec, trials: Sequence[Trial], workers: int) -> list[dict[str, Any]]:
    # spawn, not fork: torch and the envs start clean in each worker
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(run_trial, [spec] * len(trials), trials))


def _run_ray(spec: SweepSpec, trials: Sequence[Trial], workers: int, root: Path, retries: int) -> list[dict[str, Any]]:
    from rlpipe.commands.cluster import ensure_ray

    ensure_ray(workers)
    from ray import tune

    def trainable(config: dict[str, Any]) -> None:
        tune.report(run_trial(spec, trials[config["trial"]]))

    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 1}),
        param_space={"trial": tune.grid_search(list(range(len(trials))))},
        tune_config=tune.TuneConfig(max_concurrent_trials=workers),
        run_config=tune.RunConfig(
            name="tune", storage_path=str(root.resolve()), verbose=0, failure_config=tune.FailureConfig(max_failures=retries)
        ),
    )
    results = tuner.fit()
    by_index: dict[int, dict[str, Any]] = {}
    for result in results:  # type: ignore[attr-defined]  # ResultGrid iterates through __getitem__ and __len__
        if result.error is not None:
            raise RlpipeError(f"sweep trial failed: {result.error}")
        by_index[result.config["trial"]] = dict(result.metrics)
    return [by_index[i] for i in range(len(trials))]


def _run_batched(runs: Sequence[PreparedRun]) -> list[dict[str, Any]]:
    """Each setting's seeds as one batched computation (runs in plan order: seeds innermost)."""
    by_setting: dict[Path, list[PreparedRun]] = {}
    for run in runs:
        by_setting.setdefault(run.run_dir.parent, []).append(run)
    metrics = []
    for group in by_setting.values():
        results = group[0].spec.train_seeds([run.config for run in group], [run.run_dir for run in group], progress=False)
        metrics += [result.metrics for result in results]
    return metrics


def _use_batched(batched: bool | None, backend: str, runs: Sequence[PreparedRun]) -> bool:
    """``batched`` if given (checked); by default batched when the algorithm can and trains on CUDA."""
    from rlpipe.training.env import resolve_device

    spec = runs[0].spec
    if batched:
        spec.train_seeds  # noqa: B018 -- an RlpipeError unless the algorithm can
        if backend != "local":
            raise RlpipeError("--batched trains in this process: use the local backend")
        return True
    return batched is None and backend == "local" and spec.batched_seeds and resolve_device(runs[0].config.device).type == "cuda"


def run_sweep(
    spec: SweepSpec,
    grid: Mapping[str, Sequence[Any]],
    seeds: Sequence[int],
    root: str | os.PathLike,
    *,
    backend: str = "local",
    workers: int | None = None,
    batched: bool | None = None,
    retries: int = 0,
) -> dict[str, Any]:
    """Train every (setting, seed) of the sweep under ``root`` and write ``root/summary.json``.

    Every trial's config is built (and checked) before any trains; ``workers`` defaults to
    the number of cores; ``retries`` (Ray only) restarts a failed trial that many times.
    ``batched``: each setting's seeds as one computation (None: when the algorithm supports
    it and its device is CUDA). Returns the summary: setting name -> statistics of the final
    eval return over seeds.
    """
    if backend not in BACKENDS:
        raise RlpipeError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    if retries and backend != "ray":
        raise RlpipeError("--retries needs --backend ray (local trials are not restarted)")
    check_output_dir(root, "sweep directory")  # --root a file, a FIFO or a device: refused before any trial is planned
    root = Path(root).resolve()  # Ray trials run in their own working directories
    trials = plan_trials(grid, seeds, root)
    runs = [prepare_trial(spec, trial) for trial in trials]  # bad settings fail here, before anything trains
    use_batched = _use_batched(batched, backend, runs)
    workers = max(1, min(workers or os.cpu_count() or 1, len(trials)))
    root.mkdir(parents=True, exist_ok=True)
    if use_batched:
        metrics = _run_batched(runs)
    else:
        metrics = _run_ray(spec, trials, workers, root, retries) if backend == "ray" else _run_local(spec, trials, workers)
    source = spec.env_id or spec.dataset or ",".join(grid.get(DATASET_AXIS, []))
    summary = {"algo": spec.algo, "source": source, "seeds": list(seeds), "settings": summarize(trials, metrics)}
    atomic_write_text(root / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")
    return summary


__all__ = [
    "BACKENDS",
    "SUMMARY_FILE",
    "SweepSpec",
    "Trial",
    "bootstrap_interval",
    "parse_grid",
    "parse_seeds",
    "plan_trials",
    "run_sweep",
    "run_trial",
    "setting_name",
    "summarize",
    "sweep_dir",
]
