"""`rlpipe scoreboard`: normalised scores of offline runs over seeds, beside published figures."""

from __future__ import annotations

from pathlib import Path

import typer

from rlpipe.cli.app import app


@app.command("scoreboard")
def scoreboard_command(
    runs: list[str] = typer.Argument(None, help="Offline run directories or globs (quote them), e.g. 'sweeps/*/runs/*/*'."),
    datasets: Path = typer.Option(Path("datasets"), "--datasets", help="The store holding the runs' datasets (their reference scores)."),
    out: Path = typer.Option(Path("results"), "--out", help="Output directory for scores.json, table.md and the curve PNGs."),
    published: Path | None = typer.Option(
        None, "--published", help="A YAML file of published figures to show beside ours: `label:` and `scores: {DATASET: {ALGO: SCORE}}`."
    ),
    markdown: list[Path] = typer.Option(
        [], "--markdown", help="Also put the table into this Markdown page, between its <!-- scoreboard:start/end --> lines (repeatable)."
    ),
    keep_from: Path | None = typer.Option(
        None,
        "--keep-from",
        help="An earlier scores.json whose runs stay on the board unless a given run replaces them (same dataset, algorithm, seed) "
        "or their dataset's content changed; a file that does not exist keeps nothing.",
    ),
    stale_from: Path | None = typer.Option(
        None,
        "--stale-from",
        help="The DVC pipeline folder (of this rlpipe checkout) whose stages trained the runs: rows whose runs predate "
        "their stage's code or parameters (its dvc.lock) are marked stale.",
    ),
) -> None:
    """Score offline runs as D4RL does, over seeds.

    The score is 100 x (return - random) / (expert - random) on the held-out episodes, as mean ± standard error over seeds.

    Per dataset and algorithm, with each dataset's own episodes and the normalised score vs updates.
    """
    from rlpipe.commands.scoreboard import write_scoreboard

    data, dropped = write_scoreboard(list(runs or []), datasets, out, published, markdown, keep_from, stale_from)
    changed = f"; {dropped} kept runs dropped: their dataset changed" if dropped else ""
    typer.echo(f"wrote {out}: {len(data['runs'])} runs on {len(data['datasets'])} datasets{changed}")
