"""`rlpipe report`: learning curves (PNG) and one HTML page comparing training runs.

A run is a directory that `rlpipe train` wrote: ``metrics.json`` (final figures),
``checkpoint.json`` (the config) and DVCLive's eval curve
``dvclive/plots/metrics/eval/return_mean.tsv``. Runs that differ only by seed (same
algorithm, env, dataset and config otherwise) form one group, drawn as the mean over
seeds with a min-max band. One figure per env and x unit (env steps online, gradient
updates offline), one line per group.
"""

from __future__ import annotations

import csv
import glob
import html
import io
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlpipe.errors import RlpipeError
from rlpipe.limits import MAX_RUN_FILE_BYTES
from rlpipe.nets.checkpoint import META_FILE
from rlpipe.storage.files import atomic_output, atomic_write_text, check_output_dir, loads_json, read_limited
from rlpipe.training.run import METRICS_FILE

CURVE_FILE = Path("dvclive") / "plots" / "metrics" / "eval" / "return_mean.tsv"
# A run on data with no environment (rlpipe.training.validation) is scored on held-out episodes.
VALIDATION_CURVE_FILE = Path("dvclive") / "plots" / "metrics" / "val" / "action_error.tsv"
RETURN, ACTION_ERROR = "eval return (mean over episodes)", "held-out action error (lower is better)"
DIAGNOSTICS_DIR = Path("dvclive") / "plots" / "metrics" / "train"  # what each update learns: train/<name>.tsv
# Drawn beside them: how long evaluation episodes last (an early fall) and a critic's held-out TD error.
SIDE_CURVES = ("eval/length_mean", "val/td_error")
# Config fields that do not change what a run learns (or are the seed itself).
NOT_GROUPING = frozenset({"seed", "device", "torch_threads", "store", "env_id", "dataset", "loggers"})


@dataclass(frozen=True)
class RunRecord:
    """One finished run: its final metrics, eval curve and the key it is grouped by."""

    path: Path
    metrics: dict[str, Any]
    steps: np.ndarray  # x of the eval curve, in ``unit``
    returns: np.ndarray  # eval mean return at each x (data with no environment: the held-out action error)
    unit: str  # "env steps" or "updates"
    group_key: str
    measure: str = RETURN  # what ``returns`` holds: RETURN or ACTION_ERROR

    @property
    def seed(self) -> int | None:
        return self.metrics.get("seed")

    @property
    def source(self) -> str:
        """The env an online run trained in, or the dataset an offline run learned from (and its env)."""
        dataset = self.metrics.get("dataset")
        return f"{dataset} ({self.metrics['env_id'] or 'no environment'})" if dataset else self.metrics["env_id"]


@dataclass(frozen=True)
class RunGroup:
    """Runs that differ only by seed; ``label`` names them in plots and the table."""

    label: str
    runs: tuple[RunRecord, ...]

    @property
    def first(self) -> RunRecord:
        return self.runs[0]

    def mean_curve(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(x, mean, min, max) over seeds on the union of their eval points, each curve
        linearly interpolated there; x stops where the shortest curve ends."""
        end = min(run.steps[-1] for run in self.runs)
        x = np.unique(np.concatenate([run.steps[run.steps <= end] for run in self.runs]))
        ys = np.stack([np.interp(x, run.steps, run.returns) for run in self.runs])
        return x, ys.mean(0), ys.min(0), ys.max(0)


@dataclass(frozen=True)
class Report:
    """What :func:`write_report` wrote."""

    index: Path
    figures: list[Path]
    groups: list[RunGroup]
    skipped: list[Path]  # directories a glob matched that hold no finished run


def find_runs(patterns: list[str]) -> tuple[list[Path], list[Path]]:
    """(run directories, skipped directories) named by ``patterns`` (paths or globs).

    A directory that `rlpipe train` wrote (``metrics.json``, ``checkpoint.json`` or
    ``dvclive/``) is a run, finished when it has ``metrics.json``; a directory that is not a
    run but holds runs (e.g. ``models``) stands for those. Unfinished runs are skipped (a
    killed or still-running training leaves one), as is a directory a glob matched that
    holds no run (globs sweep up unrelated folders); a directory named explicitly that holds
    no run is an error, as is a pattern that matches no directory and a list that holds no
    finished run.
    """
    if not patterns:
        raise RlpipeError("no runs given: name run directories or globs, e.g. rlpipe report 'models/*'")
    runs: set[Path] = set()
    skipped: list[Path] = []
    for pattern in patterns:
        matches = [Path(m) for m in (sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]) if Path(m).is_dir()]
        if not matches:
            raise RlpipeError(f"no run directories match {pattern!r}")
        for match in matches:
            found = [match] if _is_run_dir(match) else _run_children(match)
            if not found and not glob.has_magic(pattern):
                raise RlpipeError(f"{match} has no {METRICS_FILE}: not a finished training run")
            for run in found or [match]:
                if (run / METRICS_FILE).is_file():
                    runs.add(run)
                else:
                    skipped.append(run)
    if not runs:
        raise RlpipeError(f"no finished runs (directories with {METRICS_FILE}) match {' '.join(patterns)}")
    return sorted(runs), skipped


def _is_run_dir(path: Path) -> bool:
    """Whether ``path`` is a training run's directory, finished or not (a run's own DVCLive
    folder also holds a ``metrics.json``, so a run is never searched for runs inside it)."""
    return any((path / name).exists() for name in (METRICS_FILE, META_FILE, CURVE_FILE.parts[0]))


def _run_children(path: Path) -> list[Path]:
    try:
        return sorted(child for child in path.iterdir() if _is_run_dir(child))
    except OSError as exc:
        raise RlpipeError(f"cannot list {path}: {exc}") from None


def _read_json(path: Path) -> dict[str, Any]:
    """A run file's JSON object, read whole only up to ``MAX_RUN_FILE_BYTES`` (a run's files are
    kilobytes: a huge one, a device or a FIFO planted there is refused, not read)."""
    try:
        value = loads_json(read_limited(path, MAX_RUN_FILE_BYTES, follow_links=True))
    except OSError as exc:
        raise RlpipeError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:  # malformed JSON, NaN or Infinity, bad UTF-8, nesting too deep
        raise RlpipeError(f"cannot read {path}: not JSON ({' '.join(str(exc).split())[:200]})") from None
    if not isinstance(value, dict):
        raise RlpipeError(f"{path} is not a JSON object")
    return value


def _is_number(value: Any) -> bool:
    """A JSON number the table can format (an integer of 400 digits is beyond float range)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) < 1e300


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


# The metrics.json fields the report and the scoreboard read, with the JSON type each must have
# (a missing optional one is left out of the table): what `rlpipe train` writes.
_REQUIRED_METRICS: dict[str, tuple[Any, str]] = {
    "algo": (lambda v: isinstance(v, str), "a string"),
    "env_id": (lambda v: isinstance(v, str), "a string"),
    "eval_return_mean": (_is_number, "a number"),
    "env_steps": (_is_count, "a non-negative integer"),
    "gradient_updates": (_is_count, "a non-negative integer"),
}
_OPTIONAL_METRICS: dict[str, tuple[Any, str]] = {
    "dataset": (lambda v: v is None or isinstance(v, str), "a string or null"),
    "seed": (lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)), "an integer or null"),
    "eval_return_std": (_is_number, "a number"),
    "eval_success_rate": (_is_number, "a number"),
    "heldout_return_mean": (_is_number, "a number"),
    "heldout_return_std": (_is_number, "a number"),
    "wall_seconds": (_is_number, "a number"),
    "val_action_error": (_is_number, "a number"),
    "selected_updates": (_is_count, "a non-negative integer"),
    "select_by": (lambda v: isinstance(v, str), "a string"),
}


def _metrics_problem(metrics: dict[str, Any]) -> str | None:
    """The first metrics.json field the report cannot use, named with the type it needs, or None."""
    required = [key for key in _REQUIRED_METRICS if key != "eval_return_mean" or "val_action_error" not in metrics]
    missing = [key for key in required if key not in metrics]
    if missing:
        return f"lacks {', '.join(missing)}: not written by rlpipe train"
    if "heldout_return_mean" in metrics and "heldout_return_std" not in metrics:
        return "has 'heldout_return_mean' without 'heldout_return_std'"
    for key, (check, kind) in {**_REQUIRED_METRICS, **_OPTIONAL_METRICS}.items():
        if key in metrics and not check(metrics[key]):
            return f"{key!r} is not {kind}"
    return None


@dataclass(frozen=True)
class OpeEstimate:
    """One FQE estimate of a checkpoint's discounted return, from ``rlpipe ope fqe --out``."""

    dataset: str
    estimate: float
    standard_error: float
    gamma: float


def read_ope(paths: Sequence[str | Path]) -> dict[str, list[OpeEstimate]]:
    """The estimates of ``rlpipe ope fqe --out`` files by checkpoint sha256: an estimate
    belongs to the checkpoint it scored, so a run trained again since is not shown with it."""
    estimates: dict[str, list[OpeEstimate]] = {}
    for path in paths:
        try:
            records = loads_json(read_limited(path))
            for record in records:
                error = record["standard_error"]  # null: a single initial state
                estimate = OpeEstimate(
                    str(record["dataset"]),
                    float(record["estimate"]),
                    math.nan if error is None else float(error),
                    float(record["config"]["gamma"]),
                )
                estimates.setdefault(str(record["checkpoint_sha256"]), []).append(estimate)
        except OSError as exc:
            raise RlpipeError(f"cannot read {path}: {exc}") from None
        except (ValueError, TypeError, KeyError) as exc:
            raise RlpipeError(f"{path} is not an `rlpipe ope fqe --out` file: {exc!r}") from None
    return estimates


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation: the Pearson correlation of the ranks (ties share their mean rank)."""

    def ranks(values: Sequence[float]) -> np.ndarray:
        v = np.asarray(values, np.float64)
        order = np.empty(len(v))
        order[np.argsort(v, kind="stable")] = np.arange(len(v))
        _, tie, counts = np.unique(v, return_inverse=True, return_counts=True)
        return (np.bincount(tie, order) / counts)[tie]

    return float(np.corrcoef(ranks(a), ranks(b))[0, 1])


def _read_curve(run_dir: Path, metrics: dict[str, Any], unit_done: int, validated: bool) -> tuple[np.ndarray, np.ndarray]:
    """The eval curve from DVCLive's TSV (``validated``: the held-out action error's); a run
    without one is its final point alone."""
    path, column, final = (
        (run_dir / VALIDATION_CURVE_FILE, "action_error", "val_action_error")
        if validated
        else (run_dir / CURVE_FILE, "return_mean", "eval_return_mean")
    )
    if not path.is_file():
        return np.array([unit_done], float), np.array([metrics[final]], float)
    return _read_tsv(path, column, "the eval curve")


def _read_tsv(path: Path, column: str, what: str) -> tuple[np.ndarray, np.ndarray]:
    """DVCLive's TSV of one metric: its steps and values, ordered by step."""
    try:
        text = read_limited(path, MAX_RUN_FILE_BYTES, follow_links=True).decode()
        rows = list(csv.DictReader(io.StringIO(text, newline=""), delimiter="\t"))
        steps = np.array([float(row["step"]) for row in rows])
        values = np.array([float(row[column]) for row in rows])
    except OSError as exc:
        raise RlpipeError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except (KeyError, ValueError, TypeError, csv.Error) as exc:  # a missing column, a word for a number, bad UTF-8
        raise RlpipeError(f"cannot read {what} {path}: {' '.join(str(exc).split())[:200]}") from None
    if len(steps) == 0:
        raise RlpipeError(f"{what} {path} is empty")
    order = np.argsort(steps, kind="stable")
    return steps[order], values[order]


def read_diagnostics(run_dir: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A run's logged diagnostics (``train/critic_loss``, ...: name -> (steps, values)) and,
    where logged, `SIDE_CURVES` under their full names."""
    folder = run_dir / DIAGNOSTICS_DIR
    paths = sorted(folder.glob("*.tsv")) if folder.is_dir() else []
    curves = {path.stem: _read_tsv(path, path.stem, "the diagnostics curve") for path in paths}
    for name in SIDE_CURVES:
        path = run_dir / DIAGNOSTICS_DIR.parent / f"{name}.tsv"
        if path.is_file():
            curves[name] = _read_tsv(path, name.rpartition("/")[2], "the diagnostics curve")
    return curves


def load_run(run_dir: Path) -> RunRecord:
    """Read one run directory's metrics, config and eval curve."""
    metrics = _read_json(run_dir / METRICS_FILE)
    problem = _metrics_problem(metrics)
    if problem:
        raise RlpipeError(f"{run_dir / METRICS_FILE} {problem}")
    # Online runs count env steps; offline ones (fine-tuned online ones too) count gradient updates.
    unit = "env steps" if metrics["env_steps"] > 0 and "offline_updates" not in metrics else "updates"
    done = metrics["env_steps"] if unit == "env steps" else metrics["gradient_updates"]
    validated = "val_action_error" in metrics
    steps, returns = _read_curve(run_dir, metrics, done, validated)
    config = _read_json(run_dir / META_FILE).get("config", {}) if (run_dir / META_FILE).is_file() else {}
    if not isinstance(config, dict):
        raise RlpipeError(f"{run_dir / META_FILE} 'config' is not an object")
    settings = {key: value for key, value in config.items() if key not in NOT_GROUPING}
    key = json.dumps([metrics["algo"], metrics["env_id"], metrics.get("dataset"), settings], sort_keys=True, default=str)
    return RunRecord(run_dir, metrics, steps, returns, unit, key, ACTION_ERROR if validated else RETURN)


def _group_label(names: list[str]) -> str:
    """A group's name: its run directory's, or for several seeds their common name without
    the seed suffix (['sac-s0', 'sac-s1'] -> 'sac')."""
    if len(names) == 1:
        return names[0]
    stems = {re.sub(r"[-_]?(seed|s)?\d+$", "", name) for name in names}
    if len(stems) == 1 and "" not in stems:
        return stems.pop()
    return os.path.commonprefix(names).rstrip("-_") or names[0]


def group_runs(runs: list[RunRecord]) -> list[RunGroup]:
    """Runs sharing everything but the seed, in the order their first run appears."""
    by_key: dict[str, list[RunRecord]] = {}
    for run in runs:
        by_key.setdefault(run.group_key, []).append(run)
    groups = []
    for members in by_key.values():
        members.sort(key=lambda run: (run.seed is None, run.seed))
        groups.append(RunGroup(_group_label([run.path.name for run in members]), tuple(members)))
    return groups


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def plot_curves(groups: list[RunGroup], out_dir: Path) -> list[Path]:
    """One PNG per (env, unit): a line per group, a min-max band where it has several seeds."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    panels: dict[tuple[str, str, str], list[RunGroup]] = {}
    for group in groups:
        where = group.first.metrics["env_id"] or str(group.first.metrics.get("dataset"))  # data with no env: its name
        panels.setdefault((where, group.first.unit, group.first.measure), []).append(group)
    paths = []
    for (env_id, unit, measure), members in panels.items():
        fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
        for group in members:
            x, mean, low, high = group.mean_curve()
            seeds = len(group.runs)
            label = f"{group.label} ({seeds} seeds, band min-max)" if seeds > 1 else group.label
            (line,) = ax.plot(x, mean, marker="o" if len(x) == 1 else None, label=plot_text(label))
            if seeds > 1:
                ax.fill_between(x, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
        path = out_dir / f"curves-{slug(env_id)}-{slug(unit)}{'-action-error' if measure == ACTION_ERROR else ''}.png"
        save_curves(fig, ax, unit, measure, plot_text(f"{env_id}: {measure.split(' (')[0]} vs {unit}"), path)
        paths.append(path)
    return paths


def plot_checkpoint_values(groups: list[RunGroup], out_dir: Path) -> list[Path]:
    """For runs on data with no environment: one PNG per dataset of each kept checkpoint's FQE
    estimate (``metrics.json``'s ``checkpoints``, fitted after training), a line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_dataset: dict[str, list[RunRecord]] = {}
    for group in groups:
        for run in group.runs:
            rows = run.metrics.get("checkpoints")
            if run.measure == ACTION_ERROR and isinstance(rows, list) and rows and all(_fqe_row(row) for row in rows):
                by_dataset.setdefault(str(run.metrics.get("dataset")), []).append(run)
    paths = []
    for dataset, runs in by_dataset.items():
        fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
        for run in runs:
            rows = run.metrics["checkpoints"]
            ax.errorbar(
                [row["updates"] for row in rows],
                [row["fqe_estimate"] for row in rows],
                yerr=[row["fqe_standard_error"] for row in rows],
                capsize=2,
                label=plot_text(run.path.name),
            )
        path = out_dir / f"fqe-{slug(dataset)}.png"
        save_curves(fig, ax, "updates", "FQE estimate (discounted return)", plot_text(f"{dataset}: FQE estimate of each checkpoint"), path)
        paths.append(path)
    return paths


def _fqe_row(row: Any) -> bool:
    return isinstance(row, dict) and all(_is_number(row.get(key)) for key in ("updates", "fqe_estimate", "fqe_standard_error"))


def plot_diagnostics(groups: list[RunGroup], out_dir: Path) -> list[Path]:
    """One PNG per group whose runs logged diagnostics: a panel per diagnostic, a line per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for group in groups:
        curves = [(run.seed, read_diagnostics(run.path)) for run in group.runs]
        names = sorted({name for _, diagnostics in curves for name in diagnostics})
        if not names:
            continue
        columns = min(len(names), 3)
        rows = -(-len(names) // columns)
        fig, axes = plt.subplots(rows, columns, figsize=(4 * columns, 2.8 * rows), dpi=100, squeeze=False)
        for ax, name in zip(axes.flat, names):
            for seed, diagnostics in curves:
                if name in diagnostics:
                    ax.plot(*diagnostics[name], label=f"seed {seed}")
            ax.set_title(plot_text(name), fontsize="small")
            ax.set_xlabel(group.first.unit, fontsize="small")
            ax.grid(alpha=0.3)
        for ax in list(axes.flat)[len(names) :]:
            ax.set_visible(False)
        axes.flat[0].legend(fontsize="x-small")
        fig.suptitle(plot_text(f"{group.label}: what the updates learn (train/) and episode lengths"))
        fig.tight_layout()
        path = out_dir / f"diagnostics-{slug(group.label)}.png"
        _save_figure(fig, path)
        plt.close(fig)
        paths.append(path)
    return paths


def plot_text(text: str) -> str:
    """``text`` (a run folder's or an env's name) drawn as it is by matplotlib: its ``$`` would
    start mathtext (which fails on most names) and a leading ``_`` hides a legend entry."""
    text = text.replace("$", r"\$")
    return " " + text if text.startswith("_") else text


def save_curves(fig: Any, ax: Any, xlabel: str, ylabel: str, title: str, path: Path) -> None:
    """Label, grid and legend a curves figure, write it to ``path`` (atomically) and close it."""
    import matplotlib.pyplot as plt

    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    _save_figure(fig, path)
    plt.close(fig)


def _save_figure(fig: Any, path: Path) -> None:
    """Write a PNG atomically: a link planted at ``path`` is replaced, never followed."""
    with atomic_output(path) as tmp:
        fig.savefig(tmp, format="png")


def _mean_std(values: list[float]) -> str:
    return f"{np.mean(values):.1f} ± {np.std(values):.1f}"


def _run_estimates(run: RunRecord, ope: Mapping[str, list[OpeEstimate]]) -> dict[str, OpeEstimate]:
    """The FQE estimates of this run's checkpoint, by dataset."""
    return {estimate.dataset: estimate for estimate in ope.get(str(run.metrics.get("checkpoint_sha256")), [])}


def table_rows(groups: list[RunGroup], ope: Mapping[str, list[OpeEstimate]] | None = None) -> list[dict[str, str]]:
    """The comparison table: per group, the final eval return and the held-out return (one
    run: mean ± std over its episodes; several seeds: mean ± std of the seeds' means) and
    the budgets. The held-out cell is empty unless every run of the group has one. With
    ``ope`` (:func:`read_ope`), a column per dataset holds the FQE estimates (± their
    standard error; several seeds: mean ± std of the estimates) of the runs' checkpoints."""
    ope = ope or {}
    datasets = sorted({name for group in groups for run in group.runs for name in _run_estimates(run, ope)})
    validated = any(group.first.measure == ACTION_ERROR for group in groups)
    rows = []
    for group in groups:
        ms = [run.metrics for run in group.runs]
        if group.first.measure == ACTION_ERROR:
            final = ""
        elif len(ms) == 1:
            final = f"{ms[0]['eval_return_mean']:.1f} ± {ms[0].get('eval_return_std', math.nan):.1f}"
        else:
            final = _mean_std([m["eval_return_mean"] for m in ms]) + " (over seeds)"
        success = [m["eval_success_rate"] for m in ms if "eval_success_rate" in m]
        heldout = [m["heldout_return_mean"] for m in ms if "heldout_return_mean" in m]
        if len(heldout) != len(ms):  # runs from before held-out evaluation, or with it off
            heldout_cell = ""
        elif len(ms) == 1:
            heldout_cell = f"{heldout[0]:.1f} ± {ms[0]['heldout_return_std']:.1f}"
        else:
            heldout_cell = _mean_std(heldout) + " (over seeds)"
        rows.append(
            {
                "run": group.label,
                "algo": str(ms[0]["algo"]),
                "env / dataset": group.first.source,
                "seeds": ", ".join(str(run.seed) for run in group.runs),
                "final eval return": final,
                "eval episodes": str(ms[0].get("eval_episodes", "")),
                "held-out return": heldout_cell,
                "held-out episodes": str(ms[0].get("heldout_episodes", "")) if heldout_cell else "",
                "success rate": f"{np.mean(success):.2f}" if success else "",
                "env steps": f"{np.mean([m['env_steps'] for m in ms]):.0f}",
                "updates": f"{np.mean([m['gradient_updates'] for m in ms]):.0f}",
                "wall s": f"{np.mean([m.get('wall_seconds', math.nan) for m in ms]):.1f}",
            }
        )
        if validated:  # a column only where some run learned from data with no environment
            rows[-1]["held-out action error (kept checkpoint)"] = _action_error_cell(ms) if group.first.measure == ACTION_ERROR else ""
        for dataset in datasets:
            found = [_run_estimates(run, ope).get(dataset) for run in group.runs]
            estimates = [estimate for estimate in found if estimate is not None]
            if len(estimates) != len(found):
                cell = ""
            elif len(estimates) == 1:
                cell = f"{estimates[0].estimate:.1f} ± {estimates[0].standard_error:.1f}"
            else:
                cell = _mean_std([estimate.estimate for estimate in estimates]) + " (over seeds)"
            rows[-1][f"FQE on {dataset}"] = cell
    return rows


def _action_error_cell(ms: list[dict[str, Any]]) -> str:
    """The kept checkpoints' held-out action errors, and which update each rule kept."""
    errors = ", ".join(f"{m['val_action_error']:.4f}" for m in ms)
    kept = ", ".join(str(m.get("selected_updates", "")) for m in ms)
    return f"{errors} (updates {kept}, select_by {ms[0].get('select_by', 'last')})"


def ope_agreement(groups: list[RunGroup], ope: Mapping[str, list[OpeEstimate]]) -> list[str]:
    """Per dataset, how well the FQE estimates rank the runs that also have a held-out return:
    Spearman's correlation between the two (FQE estimates a discounted return, the held-out
    evaluation an undiscounted one, so their ranks are compared, not their values)."""
    pairs: dict[tuple[str, float], list[tuple[float, float]]] = {}
    for run in (run for group in groups for run in group.runs):
        if "heldout_return_mean" in run.metrics:
            for estimate in _run_estimates(run, ope).values():
                pairs.setdefault((estimate.dataset, estimate.gamma), []).append((estimate.estimate, run.metrics["heldout_return_mean"]))
    lines = []
    for (dataset, gamma), values in sorted(pairs.items()):
        if len(values) >= 3:
            rho = spearman(*zip(*values))
            lines.append(
                f"FQE on {dataset} (gamma {gamma}) against the held-out returns of {len(values)} runs: Spearman rank correlation {rho:+.2f}."
            )
    return lines


@dataclass(frozen=True)
class DatasetCard:
    """A dataset's summary in the report: its facts, histograms and lineage."""

    name: str
    facts: dict[str, str]
    histogram: Path | None  # returns and lengths of its episodes (None: a transitions dataset)
    lineage: list[str]


@dataclass(frozen=True)
class _DatasetRead:
    """What a dataset card shows, read before anything is written."""

    card: DatasetCard  # its histogram not drawn yet
    returns: np.ndarray | None  # the episodes' returns and lengths (None: no histogram)
    lengths: np.ndarray | None


def read_datasets(store: str | Path) -> list[_DatasetRead]:
    """Every dataset of ``store``: its facts, episodes and lineage; a broken one (corrupted
    metadata, say a lineage record of the wrong type, or damaged files) is one RlpipeError
    naming it, so a report never silently leaves a dataset out."""
    from rlpipe.datasets.ops import episode_index
    from rlpipe.datasets.store import store_entries
    from rlpipe.datasets.summary import lineage_tree

    read = []
    for name, info in store_entries(store):
        if isinstance(info, RlpipeError):
            raise RlpipeError(f"dataset {name!r} of --datasets {store} is broken: {info}")
        meta = info.metadata
        facts = {
            "env": str(info.env_id),
            "producer": str(meta["producer"].get("algorithm")),
            "episodes": str(meta["total_episodes"]),
            "steps": str(meta["total_steps"]),
            "formats": ", ".join(meta["formats"]),
            "content hash": meta["content_hash"][:16],
        }
        returns = lengths = None
        if meta.get("kind", "episodes") == "episodes" and not meta["multi_agent"]:
            index = episode_index(info)
            facts["return"] = f"{index.episode_return.mean():.1f} ± {index.episode_return.std():.1f}"
            returns, lengths = index.episode_return, index.length
        read.append(_DatasetRead(DatasetCard(info.name, facts, None, lineage_tree(info, store)), returns, lengths))
    return read


def draw_dataset_cards(read: Sequence[_DatasetRead], out_dir: Path) -> list[DatasetCard]:
    """The cards of :func:`read_datasets`, each with a PNG of its episode returns and lengths in ``out_dir``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cards = []
    for dataset in read:
        card = dataset.card
        if dataset.returns is not None and dataset.lengths is not None:
            fig, (left, right) = plt.subplots(1, 2, figsize=(7, 2.6), dpi=100)
            left.hist(dataset.returns, bins=30, color="#4477aa")
            left.set_xlabel("episode return")
            right.hist(dataset.lengths, bins=30, color="#228833")
            right.set_xlabel("episode length")
            for axis in (left, right):
                axis.set_ylabel("episodes")
            fig.suptitle(plot_text(card.name), fontsize="small")
            fig.tight_layout()
            histogram = out_dir / f"dataset-{slug(card.name)}.png"
            _save_figure(fig, histogram)
            plt.close(fig)
            card = DatasetCard(card.name, card.facts, histogram, card.lineage)
        cards.append(card)
    return cards


def dataset_cards(store: str | Path, out_dir: Path) -> list[DatasetCard]:
    """A card per dataset of ``store``, with a PNG of its episode returns and lengths."""
    return draw_dataset_cards(read_datasets(store), out_dir)


def _cards_html(cards: Sequence[DatasetCard]) -> str:
    parts = []
    for card in cards:
        facts = ", ".join(f"{html.escape(k)} {html.escape(v)}" for k, v in card.facts.items())
        image = f'<img src="{html.escape(card.histogram.name)}" alt="{html.escape(card.name)} histograms">' if card.histogram else ""
        parts.append(f"<h3>{html.escape(card.name)}</h3>\n<p>{facts}</p>\n{image}\n<pre>{html.escape(chr(10).join(card.lineage))}</pre>\n")
    return "<h2>Datasets</h2>\n" + "".join(parts) if parts else ""


# Markdown's specials in a table cell: backslash, code spans, emphasis, links, the cell separator,
# and `_` at a word's edge (inside a word, as in a run named sac_s0, it is literal).
_MARKDOWN_SPECIAL = re.compile(r"[\\`*\[\]|]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")


def markdown_text(text: str) -> str:
    """``text`` (a run folder's name, a value from metrics.json) shown literally in a Markdown
    table cell: one line, specials backslash-escaped, HTML's ``<``, ``>`` and ``&`` as entities
    (a folder named ``<script>`` is text, not markup, in every Markdown renderer)."""
    text = html.escape(" ".join(text.splitlines()), quote=False)
    return _MARKDOWN_SPECIAL.sub(lambda match: "\\" + match.group(), text)


BLOCK_START, BLOCK_END = "<!-- scoreboard:start -->", "<!-- scoreboard:end -->"  # the block `rlpipe scoreboard` fills


def markdown_page(rows: list[dict[str, str]], notes: Sequence[str] = (), kept: str = "") -> str:
    """The table as a Markdown page, a row per run (the docs' results page is generated with
    it), then ``notes`` (e.g. :func:`ope_agreement`'s lines), then ``kept`` (the previous
    page's scoreboard section, :func:`scoreboard_section`) as it was."""
    lines = [
        "# Results",
        "",
        "Generated by `make results` (`rlpipe report 'models/*' --markdown docs/results.md`) from the",
        "`metrics.json` of the pipeline's runs (`make repro`: one run per stage, training seed 0, one torch",
        "thread, at the stage's budget, which may be below the command's default). Held-out return: mean ±",
        "std over the run's final evaluation on env seeds that neither training nor tuning used; training",
        "seed 0 was among the seeds the defaults were tuned on; the algorithm pages give figures over",
        "several training seeds and say which of them tuning used. A seed gives the same numbers on one",
        "machine, not across CPUs: a run on another CPU moves like a run on another seed (the masked-CartPole",
        "DQN stage scored 339.95 on an AMD EPYC and 130.25 on an Intel Xeon), so one seed's figure is one draw.",
        "",
        "| " + " | ".join(map(markdown_text, rows[0])) + " |",
        "|" + " --- |" * len(rows[0]),
    ]
    lines += ["| " + " | ".join(map(markdown_text, row.values())) + " |" for row in rows]
    lines += ["", *map(markdown_text, notes)] if notes else []
    lines += ["", kept.rstrip("\n")] if kept else []
    return "\n".join(lines) + "\n"


def scoreboard_section(page: str) -> str:
    """The part of ``page`` that holds a scoreboard block: from the ``## `` heading before
    :data:`BLOCK_START` (or the block itself, without one) to :data:`BLOCK_END`; "" when the
    page has no block. `rlpipe report --markdown` keeps it when it rewrites a page."""
    start, end = page.find(BLOCK_START), page.find(BLOCK_END)
    if not 0 <= start < end:
        return ""
    heading = page.rfind("\n## ", 0, start)
    return page[heading + 1 if heading >= 0 else start : end + len(BLOCK_END)] + "\n"


def replace_block(page: str, table: str, where: str) -> str:
    """``page`` with the text between its :data:`BLOCK_START` and :data:`BLOCK_END` lines replaced by ``table``."""
    start, end = page.find(BLOCK_START), page.find(BLOCK_END)
    if start < 0 or end < start:
        raise RlpipeError(f"{where} has no {BLOCK_START} ... {BLOCK_END} block for the table")
    return page[: start + len(BLOCK_START)] + "\n" + table + page[end:]


def render_html(rows: list[dict[str, str]], figures: list[Path], cards: Sequence[DatasetCard] = (), notes: Sequence[str] = ()) -> str:
    """The report page: the comparison table and ``notes``, every figure (linked and shown), then the dataset cards."""
    head = "".join(f"<th>{html.escape(name)}</th>" for name in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(value)}</td>" for value in row.values()) + "</tr>\n" for row in rows)
    images = "".join(
        f'<p><a href="{html.escape(p.name)}"><img src="{html.escape(p.name)}" alt="{html.escape(p.stem)}"></a></p>\n' for p in figures
    )
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>rlpipe report</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #bbb;padding:4px 8px;text-align:right}}td:first-child,th:first-child{{text-align:left}}
img{{max-width:100%}}</style></head>
<body><h1>rlpipe report</h1>
<p>Final eval return: one run, mean ± std over its eval episodes; several seeds, mean ± std of their means.
Held-out return: the same over the run's final evaluation on env seeds that neither training nor the periodic
evaluation (on which settings were tuned) used: the figure to compare.
Curves: eval return (mean over episodes) against env steps (online) or gradient updates (offline);
several seeds are drawn as their mean with a min-max band.</p>
<table><tr>{head}</tr>
{body}</table>
{"".join(f"<p>{html.escape(note)}</p>" for note in notes)}
<h2>Learning curves</h2>
{images}{_cards_html(cards)}</body></html>
"""


def output_directory(path: str | Path) -> Path:
    """``path`` as a directory to write into, made if missing; something else there (a file, a
    device) or a directory that cannot be made is an RlpipeError, before anything is written."""
    check_output_dir(path, "--out")  # before Path(): Path("") would be "."
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RlpipeError(f"cannot make the output directory {out}: {exc.strerror or exc}") from None
    return out


def _previous_page(path: Path) -> str:
    """The Markdown page ``--markdown`` replaces ("" when there is none yet), read before anything is written."""
    if not path.is_file():
        return ""
    try:
        return read_limited(path, follow_links=True).decode()
    except OSError as exc:
        raise RlpipeError(f"cannot read --markdown {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise RlpipeError(f"--markdown {path} is not UTF-8 text: {exc}") from None


def write_report(
    patterns: list[str],
    out_dir: str | Path,
    datasets: str | Path | None = None,
    markdown: str | Path | None = None,
    ope_files: Sequence[str | Path] = (),
) -> Report:
    """Read the runs ``patterns`` name, then write the PNGs and ``index.html`` to ``out_dir``
    (with a card per dataset of the store ``datasets``, and the FQE estimates of
    ``ope_files`` beside the held-out returns), and the table as a Markdown page to
    ``markdown`` when given.

    Every run and dataset is read before anything is written, so bad input leaves no partial report.
    """
    paths, skipped = find_runs(patterns)
    groups = group_runs([load_run(path) for path in paths])
    ope = read_ope(ope_files)
    notes = ope_agreement(groups, ope)
    stored = read_datasets(datasets) if datasets is not None else []
    previous = _previous_page(Path(markdown)) if markdown is not None else ""
    out = output_directory(out_dir)
    figures = plot_curves(groups, out) + plot_checkpoint_values(groups, out) + plot_diagnostics(groups, out)
    rows = table_rows(groups, ope)
    cards = draw_dataset_cards(stored, out)
    index = out / "index.html"
    atomic_write_text(index, render_html(rows, figures, cards, notes))
    if markdown is not None:  # a row per run: the page depends on the metrics files alone
        runs = sorted((run for group in groups for run in group.runs), key=lambda run: run.path.name)
        page = markdown_page(table_rows([RunGroup(run.path.name, (run,)) for run in runs], ope), notes, scoreboard_section(previous))
        atomic_write_text(Path(markdown), page)
    return Report(index, figures, groups, skipped)
