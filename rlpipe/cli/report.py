"""`rlpipe report`: learning-curve PNGs and an HTML comparison page over training runs."""

from __future__ import annotations

from pathlib import Path

import typer

from rlpipe.cli.app import app


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
    """Plot eval return curves (seeds of one setting as mean with a min-max band) and write
    OUT/index.html with the comparison table."""
    from rlpipe.pipeline.report import write_report

    report = write_report(list(runs or []), out, datasets, markdown, ope)
    for path in report.skipped:
        typer.echo(f"skipped {path}: no metrics.json (not a finished run)", err=True)
    n_runs = sum(len(group.runs) for group in report.groups)
    typer.echo(f"wrote {report.index}: {n_runs} runs in {len(report.groups)} groups, {len(report.figures)} figures")
