"""`rlpipe scoreboard`: offline runs scored as the field reports them, beside published figures.

Each run (a directory `rlpipe train` or `rlpipe sweep` wrote) is scored by its held-out
evaluation, normalised by its dataset's reference returns (D4RL's convention:
100 * (return - random) / (expert - random)); runs of one algorithm on one dataset are
summarised as mean ± standard error over their seeds, with their normalised eval curve
(score vs updates). Beside them: the dataset's own episodes scored the same way (for a
`medium` dataset, its behaviour policy) and published figures from a YAML file, labelled
with where they come from (other data, other budgets)::

    label: CORL, D4RL -v2 datasets, 1M updates ("last")
    scores:
      hopper-medium: {bc: 53.5, td3bc: 60.4}

Everything the table shows is written to ``OUT/scores.json`` (each run's metrics and
curve included), so the table can be re-rendered from that file alone
(:func:`render_table`); ``OUT/table.md`` holds it and ``OUT/curves-DATASET.png`` the curves.
With ``markdown`` pages the table also replaces each page's block between the
``rlpipe.commands.report.BLOCK_START`` and ``BLOCK_END`` lines (the D4RL and results pages
carry it; `rlpipe report --markdown` keeps the block when it rewrites the results page).

With ``keep_from`` (an earlier ``scores.json``) the runs recorded there are kept beside the
runs given, so adding an algorithm to a benchmark re-runs only its own runs: a kept run is
replaced by a given run of the same dataset, algorithm and seed, and dropped where its
dataset's content hash is no longer the store's (the data it was scored on changed). A
``keep_from`` that does not exist keeps nothing (the first scoreboard a pipeline writes).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from rlpipe.commands.report import output_directory, replace_block
from rlpipe.errors import RlpipeError
from rlpipe.storage.files import atomic_write_text, check_output_file, read_limited

SCORES_FILE, TABLE_FILE = "scores.json", "table.md"


def _normalise(metadata: Mapping[str, Any], returns: Any, dataset: str) -> np.ndarray:
    from rlpipe.datasets.scores import normalized_score

    score = normalized_score(dict(metadata), returns)
    if score is None:
        raise RlpipeError(f"dataset {dataset!r} records no reference scores (ref_min_score, ref_max_score): its runs cannot be normalised")
    return 100.0 * np.asarray(score, np.float64)


# The published statistics of a dataset a `datasets:` entry may give, as _dataset_facts names ours.
DATASET_STATISTICS = ("transitions", "episodes", "return_mean", "return_std", "return_min", "return_max", "score", "mean_length")


def read_published(path: str | Path | None) -> dict[str, Any]:
    """The published figures file: {"label": str, "scores": {dataset: {algo: score}}}, and
    optionally "dataset_label" and "datasets": {dataset: {statistic: number}} (of
    DATASET_STATISTICS), the published datasets' own statistics shown beside ours."""
    if path is None:
        return {"label": "", "scores": {}}
    try:
        data = yaml.safe_load(Path(path).read_text())
        label, scores = str(data["label"]), data["scores"]
        table = {str(dataset): {str(algo): float(score) for algo, score in by_algo.items()} for dataset, by_algo in scores.items()}
        statistics = {
            str(dataset): {str(key): float(facts[key]) for key in DATASET_STATISTICS if key in facts}
            for dataset, facts in (data.get("datasets") or {}).items()
        }
    except OSError as exc:
        raise RlpipeError(f"cannot read {path}: {exc}") from None
    except (yaml.YAMLError, TypeError, KeyError, ValueError, AttributeError) as exc:
        raise RlpipeError(f"{path}: expected `label:` and `scores: {{DATASET: {{ALGO: SCORE}}}}` ({exc!r})") from None
    published = {"label": label, "scores": table}
    return {**published, "dataset_label": str(data.get("dataset_label", "published")), "datasets": statistics} if statistics else published


def _dataset_facts(dataset: str, store: str | Path) -> dict[str, Any]:
    """A dataset's rows of the scoreboard: its env, size, own episodes' returns (mean, std
    with ddof 0, min, max) and normalised mean, mean episode length, reference returns and content hash."""
    from rlpipe.datasets.loader import load_shards
    from rlpipe.datasets.store import open_dataset

    info = open_dataset(dataset, store)
    episodes = load_shards(info).episode_returns()
    transitions = int(info.metadata.get("total_steps", 0)) or None
    return {
        "env_id": info.env_id,
        "episodes": len(episodes),
        "transitions": transitions,
        "return_mean": float(episodes.mean()),
        "return_std": float(episodes.std()),
        "return_min": float(episodes.min()),
        "return_max": float(episodes.max()),
        "mean_length": None if transitions is None else transitions / len(episodes),
        "score": float(_normalise(info.metadata, episodes.mean(), dataset)),
        "reference": {key: info.metadata[key] for key in ("ref_min_score", "ref_max_score")},
        "content_hash": info.metadata.get("content_hash"),
    }


def read_kept_runs(path: str | Path) -> list[dict[str, Any]]:
    """The runs an earlier ``scores.json`` recorded, each checked for what scoring it reads
    (one-line error for a file that is not one)."""
    from rlpipe.commands.sweep import summary_metric

    try:
        runs = json.loads(read_limited(path, follow_links=True))["runs"]
        for run in runs:
            metrics, curve = run["metrics"], run["curve"]
            if not (isinstance(run["algo"], str) and isinstance(run["dataset"], str) and isinstance(metrics["dataset_content_hash"], str)):
                raise TypeError("algo, dataset and the dataset's content hash must be strings")
            if run["seed"] is not None and not isinstance(run["seed"], int):
                raise TypeError("seed must be an integer")
            values = [metrics[summary_metric(metrics)], metrics["gradient_updates"], metrics["wall_seconds"], *curve["updates"]]
            values += curve["return_mean"]
            if len(curve["updates"]) != len(curve["return_mean"]) or not all(isinstance(v, int | float) for v in values):
                raise TypeError("the score and the curve must be numbers, the curve's columns of one length")
    except OSError as exc:
        raise RlpipeError(f"cannot read --keep-from {path}: {exc.strerror or exc}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RlpipeError(f"--keep-from {path} is not a scoreboard's scores.json: {exc!r}") from None
    return runs


def collect_scores(
    patterns: list[str], store: str | Path, published: str | Path | None = None, keep_from: str | Path | None = None
) -> tuple[dict[str, Any], int]:
    """The scoreboard's data: every finished offline run that ``patterns`` name, scored by its
    dataset in ``store``, each dataset's own episodes, and the published figures; with
    ``keep_from``, also that file's runs still valid here (see the module's docstring).
    Runs are in dataset, algorithm, seed order. Also returns how many kept runs were left
    out because their dataset changed."""
    from rlpipe.commands.report import find_runs, load_run

    paths, _ = find_runs(patterns) if patterns or keep_from is None else ([], [])
    runs, datasets = [], {}
    for path in paths:
        record = load_run(path)
        dataset = record.metrics.get("dataset")
        if not dataset or record.unit != "updates":
            raise RlpipeError(f"{path} is not an offline run: the scoreboard scores runs trained on a dataset")
        if dataset not in datasets:
            datasets[dataset] = _dataset_facts(dataset, store)
        runs.append(
            {
                "path": path.as_posix(),
                "algo": record.metrics["algo"],
                "dataset": dataset,
                "seed": record.metrics.get("seed"),
                "curve": {"updates": record.steps.tolist(), "return_mean": record.returns.tolist()},
                "metrics": record.metrics,
            }
        )
    dropped = 0
    if keep_from is not None and Path(keep_from).exists():  # none yet: nothing to keep
        given = {(run["dataset"], run["algo"], run["seed"]) for run in runs}
        for run in read_kept_runs(keep_from):
            if (run["dataset"], run["algo"], run["seed"]) in given:
                continue
            if run["dataset"] not in datasets:
                datasets[run["dataset"]] = _dataset_facts(run["dataset"], store)
            if run["metrics"]["dataset_content_hash"] != datasets[run["dataset"]]["content_hash"]:
                dropped += 1
                continue
            runs.append(run)
        datasets = {name: facts for name, facts in datasets.items() if any(run["dataset"] == name for run in runs)}
    if not runs:
        raise RlpipeError(f"no runs to score: none given and none kept from {keep_from}")
    runs.sort(key=lambda run: (run["dataset"], run["algo"], -1 if run["seed"] is None else run["seed"]))
    return {"datasets": datasets, "runs": runs, "published": read_published(published)}, dropped


def run_score(data: Mapping[str, Any], run: Mapping[str, Any]) -> float:
    """A run's normalised score: its held-out mean return (the last periodic evaluation's
    where it made none), normalised by its dataset's reference returns."""
    from rlpipe.commands.sweep import summary_metric

    metrics = run["metrics"]
    reference = data["datasets"][run["dataset"]]["reference"]
    return float(_normalise(reference, metrics[summary_metric(metrics)], run["dataset"]))


def run_curve(data: Mapping[str, Any], run: Mapping[str, Any]) -> tuple[list[float], list[float]]:
    """A run's eval curve as (updates, normalised score)."""
    reference = data["datasets"][run["dataset"]]["reference"]
    return run["curve"]["updates"], _normalise(reference, run["curve"]["return_mean"], run["dataset"]).tolist()


def _groups(data: Mapping[str, Any]) -> dict[tuple[str, str], list[Mapping[str, Any]]]:
    """Runs by (dataset, algorithm), in dataset then algorithm order of first appearance."""
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for run in sorted(data["runs"], key=lambda r: (r["dataset"], r["algo"], r["seed"] if r["seed"] is not None else -1)):
        groups.setdefault((run["dataset"], run["algo"]), []).append(run)
    return groups


def _by_dataset(data: Mapping[str, Any]) -> dict[str, dict[str, list[Mapping[str, Any]]]]:
    by_dataset: dict[str, dict[str, list[Mapping[str, Any]]]] = {}
    for (dataset, algo), runs in _groups(data).items():
        by_dataset.setdefault(dataset, {})[algo] = runs
    return by_dataset


def mean_and_error(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (std with ddof 1 over sqrt(n); 0 for one value)."""
    array = np.asarray(values, np.float64)
    error = float(array.std(ddof=1) / np.sqrt(len(array))) if len(array) > 1 else 0.0
    return float(array.mean()), error


def render_table(data: Mapping[str, Any]) -> str:
    """The scoreboard as Markdown: per dataset and algorithm the normalised held-out score
    (mean ± s.e. over seeds), budget and wall time, the published figure; then each
    dataset's own episodes; then the normalised score at each evaluation (mean over seeds)."""
    published = data["published"]
    label = published["label"] or "published"
    lines = [
        f"| dataset | algorithm | seeds | normalised held-out score (mean ± s.e.) | per seed | updates | wall s per run | {label} |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    groups = _groups(data)
    stale_groups = 0
    for (dataset, algo), runs in groups.items():
        stale = sum(bool(run.get("stale")) for run in runs)
        stale_groups += bool(stale)
        scores = [run_score(data, run) for run in runs]
        mean, error = mean_and_error(scores)
        per_seed = ", ".join(f"{score:.1f}" for score in scores)
        updates = sorted({int(run["metrics"]["gradient_updates"]) for run in runs})
        wall = np.mean([float(run["metrics"]["wall_seconds"]) for run in runs])
        figure = published["scores"].get(dataset, {}).get(algo)
        name = f"{algo} (stale: {stale} of {len(runs)} runs predate their code)" if stale else algo
        lines.append(
            f"| {dataset} | {name} | {len(runs)} | {mean:.1f} ± {error:.1f} | {per_seed} | {'/'.join(map(str, updates))} "
            f"| {wall:.0f} | {'' if figure is None else f'{figure:.1f}'} |"
        )
    if stale_groups:
        lines += [
            "",
            "Stale: the code or parameters of the stage that trained these runs changed after they ran (its `dvc.lock`); rerun it.",
        ]
    lines += ["", *dataset_table(data)]
    for dataset, algos in _by_dataset(data).items():
        curves = {algo: dict(zip(*_mean_curve(data, runs))) for algo, runs in algos.items()}
        points = sorted(set().union(*curves.values()))
        lines += ["", f"Normalised score vs updates on {dataset} (eval episodes, mean over seeds):", ""]
        lines += ["| algorithm | " + " | ".join(f"{int(u)}" for u in points) + " |", "| --- |" + " --- |" * len(points)]
        lines += [
            f"| {algo} | " + " | ".join(f"{curve[u]:.1f}" if u in curve else "" for u in points) + " |" for algo, curve in curves.items()
        ]
    return "\n".join(lines) + "\n"


def dataset_table(data: Mapping[str, Any]) -> list[str]:
    """The datasets' own episodes, each beside the published dataset's statistics where the
    published file gives them (blank where a figure is not known)."""
    published = data["published"].get("datasets", {})
    label = data["published"].get("dataset_label", "published")
    lines = [
        "| dataset | data | transitions | episodes | episode return (mean ± std) | min / max | normalised mean | mean length |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for dataset, facts in sorted(data["datasets"].items()):
        rows = [("ours", facts)] + ([(label, published[dataset])] if dataset in published else [])
        for source, row in rows:
            lines.append(f"| {dataset} | {source} | " + " | ".join(_statistics_cells(row)) + " |")
    return lines


def _statistics_cells(row: Mapping[str, Any]) -> list[str]:
    def number(key: str, digits: int = 1) -> str:
        value = row.get(key)
        return "" if value is None else f"{value:,.{digits}f}"

    if row.get("mean_length") is None and row.get("transitions") and row.get("episodes"):
        row = {**row, "mean_length": row["transitions"] / row["episodes"]}  # a board written before it was recorded
    spread = "" if row.get("return_std") is None else f" ± {number('return_std')}"
    extremes = "" if row.get("return_min") is None else f"{number('return_min')} / {number('return_max')}"
    return [
        number("transitions", 0),
        number("episodes", 0),
        number("return_mean") + spread,
        extremes,
        number("score"),
        number("mean_length"),
    ]


def _seed_curves(data: Mapping[str, Any], runs: Sequence[Mapping[str, Any]]) -> tuple[list[float], np.ndarray]:
    """The evaluation points the seeds share and each seed's normalised score there ([seeds, points])."""
    curves = [run_curve(data, run) for run in runs]
    updates = sorted(set(curves[0][0]).intersection(*(x for x, _ in curves[1:])))
    return updates, np.stack([np.interp(updates, x, y) for x, y in curves])


def _mean_curve(data: Mapping[str, Any], runs: Sequence[Mapping[str, Any]]) -> tuple[list[float], list[float]]:
    """The seeds' normalised curves averaged at the evaluation points they share."""
    updates, scores = _seed_curves(data, runs)
    return updates, scores.mean(0).tolist()


def plot_curves(data: Mapping[str, Any], out: Path) -> list[Path]:
    """One PNG per dataset: normalised eval score vs updates, a line per algorithm (mean over
    seeds, min-max band)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rlpipe.commands.report import save_curves, slug

    paths = []
    for dataset, algos in _by_dataset(data).items():
        fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
        for algo, runs in algos.items():
            updates, curves = _seed_curves(data, runs)
            (line,) = ax.plot(updates, curves.mean(0), label=f"{algo} ({len(runs)} seeds)")
            ax.fill_between(updates, curves.min(0), curves.max(0), color=line.get_color(), alpha=0.2, linewidth=0)
        ax.axhline(data["datasets"][dataset]["score"], color="grey", linestyle="--", linewidth=1, label="dataset episodes")
        path = out / f"curves-{slug(dataset)}.png"
        save_curves(fig, ax, "updates", "normalised score (eval episodes)", f"{dataset}: normalised score vs updates", path)
        paths.append(path)
    return paths


def mark_stale(runs: list[dict[str, Any]], pipeline: str | Path) -> None:
    """Mark each run that a stage of ``pipeline`` (a DVC pipeline's folder in this rlpipe
    checkout) wrote under its outputs and whose code or parameters changed since it ran
    (`rlpipe.commands.stage_deps.stale_stages`): ``run["stale"]`` lists what changed."""
    from rlpipe.commands.stage_deps import REPO, stale_stages

    folder = Path(pipeline).resolve()
    if not folder.is_relative_to(REPO) or not (folder / "dvc.lock").is_file():
        raise RlpipeError(f"--stale-from {pipeline}: not a DVC pipeline of this rlpipe checkout (a folder under {REPO} with a dvc.lock)")
    stale = stale_stages(REPO, folder.relative_to(REPO).as_posix())
    lock = yaml.safe_load((folder / "dvc.lock").read_text()) or {}
    outputs = {
        Path(out["path"]).as_posix(): stage
        for stage, record in (lock.get("stages") or {}).items()
        for out in record.get("outs", [])
        if stage in stale
    }
    for run in runs:
        path = Path(str(run["path"])).as_posix()
        changed = [stale[stage] for out, stage in outputs.items() if path == out or path.startswith(out + "/")]
        run["stale"] = sorted({item for items in changed for item in items})


def write_scoreboard(
    patterns: list[str],
    store: str | Path,
    out: str | Path,
    published: str | Path | None = None,
    markdown: Sequence[str | Path] = (),
    keep_from: str | Path | None = None,
    stale_from: str | Path | None = None,
) -> tuple[dict[str, Any], int]:
    """Score the runs (and those kept from ``keep_from``), write OUT/scores.json, OUT/table.md
    and the curves, and the table into the block of each ``markdown`` page; returns the
    scoreboard's data and how many kept runs were dropped (`collect_scores`). With
    ``stale_from`` (the pipeline whose stages trained the runs) the table marks the rows whose
    runs predate their code (`mark_stale`)."""
    data, dropped = collect_scores(patterns, store, published, keep_from)
    for run in data["runs"]:  # a kept run's mark is its last scoreboard's: judged anew or not at all
        run.pop("stale", None)
    if stale_from is not None:
        mark_stale(data["runs"], stale_from)
    table = render_table(data)
    pages = {}
    for path in map(Path, markdown):  # every page checked before anything is written
        try:  # a page of bounded size, a regular file only: a FIFO or /dev/zero named here must not hang or exhaust the reader
            pages[path] = replace_block(read_limited(path, follow_links=True).decode(), table, str(path))
        except OSError as exc:
            raise RlpipeError(f"cannot read --markdown {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise RlpipeError(f"--markdown {path} is not UTF-8 text: {exc}") from None
        check_output_file(path, "--markdown")
    out = output_directory(out)
    atomic_write_text(out / SCORES_FILE, json.dumps(data, indent=1, sort_keys=True, default=float) + "\n")
    atomic_write_text(out / TABLE_FILE, table)
    plot_curves(data, out)
    for path, page in pages.items():
        atomic_write_text(path, page)
    return data, dropped
