"""`rlpipe report`: learning-curve PNGs and an HTML comparison page over training runs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import typer

from rlpipe.cli.app import app
from rlpipe.errors import RlpipeError


@app.command("report")
def report_command(
    runs: list[str] = typer.Argument(None, help="Run directories or globs (quote them), e.g. 'models/*' or models/sac-*."),
    out: Path = typer.Option(Path("report"), "--out", help="Output directory for index.html and the PNGs."),
    datasets: Path | None = typer.Option(
        None, "--datasets", help="Add a card per dataset of this store: facts, return and length histograms, lineage."
    ),
    markdown: Path | None = typer.Option(None, "--markdown", help="Also write the comparison table as Markdown to this file."),
    ope: list[Path] = typer.Option(
        [], "--ope", help="Show the FQE estimates of this `rlpipe ope fqe --out` file beside the held-out returns (repeatable)."
    ),
) -> None:
    """Plot eval return curves and write an HTML comparison page.

    The seeds of one setting are drawn as their mean with a min-max band; OUT/index.html holds the comparison table.
    """
    from rlpipe.commands.report import write_report
    from rlpipe.datasets.store import store_root
    from rlpipe.storage.files import check_output_dir, check_output_file

    # The options' own problems first, before any run is read or anything is written.
    check_output_dir(out, "--out")
    if datasets is not None and not store_root(datasets).is_dir():
        raise RlpipeError(f"--datasets {datasets}: no such dataset store (not a directory)")
    if markdown is not None:
        check_output_file(markdown, "--markdown")
    for path in ope:
        _check_ope_file(path)
    report = write_report(list(runs or []), out, datasets, markdown, ope)
    for path in report.skipped:
        typer.echo(f"skipped {path}: no metrics.json (not a finished run)", err=True)
    n_runs = sum(len(group.runs) for group in report.groups)
    typer.echo(f"wrote {report.index}: {n_runs} runs in {len(report.groups)} groups, {len(report.figures)} figures")


def _check_ope_file(path: Path) -> None:
    """Refuse an ``--ope`` file that is not what ``rlpipe ope fqe --out`` writes: a JSON list
    of estimates, each with a dataset, a checkpoint sha256, a finite estimate, a finite
    standard error or null and its config's gamma. Read as a regular file of bounded size;
    NaN, infinity, numbers beyond float range and nesting too deep are refused, so nothing is
    read as zero estimates or shown as NaN."""
    from rlpipe.storage.files import loads_json, read_limited

    try:
        value = loads_json(read_limited(path, follow_links=True))
    except OSError as exc:
        raise RlpipeError(f"--ope {path}: cannot read it: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:  # malformed JSON, NaN, 1e400, an integer of 5000 digits, bad UTF-8, nesting too deep
        raise RlpipeError(f"--ope {path}: not JSON ({' '.join(str(exc).split())[:120]})") from None
    problem = _ope_problem(value)
    if problem is not None:
        raise RlpipeError(f"--ope {path} is not an `rlpipe ope fqe --out` file: {problem}")


def _finite(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer beyond float range
        return False


def _ope_problem(value: Any) -> str | None:
    """What makes ``value`` (a parsed ``--ope`` file) not a list of FQE estimates, or None."""
    if not isinstance(value, list):
        return f"expected a JSON list of estimates, got {'an object' if isinstance(value, dict) else type(value).__name__}"
    if not value:
        return "it holds no estimate"
    for i, record in enumerate(value):
        if not isinstance(record, dict):
            return f"estimate {i} is not an object"
        config = record.get("config")
        checks = (
            ("dataset", isinstance(record.get("dataset"), str), "a string"),
            ("checkpoint_sha256", isinstance(record.get("checkpoint_sha256"), str), "a string"),
            ("estimate", _finite(record.get("estimate")), "a finite number"),
            (
                "standard_error",
                "standard_error" in record and (record["standard_error"] is None or _finite(record["standard_error"])),
                "a finite number or null",
            ),
            ("config.gamma", isinstance(config, dict) and _finite(config.get("gamma")), "a finite number"),
        )
        for key, ok, kind in checks:
            if not ok:
                return f"estimate {i}: {key!r} is not {kind}"
    return None
