"""`rlpipe sweep`: train a grid of settings with several seeds and print the summary table."""

from __future__ import annotations

from pathlib import Path

import typer

from rlpipe.cli.app import TRUST_ENV_SPEC_OPTION, app


@app.command()
def sweep(
    algo: str = typer.Argument(..., help="Algorithm, as for `rlpipe train`."),
    env: str | None = typer.Option(None, "--env", help="Gymnasium env id for online algorithms."),
    dataset: str | None = typer.Option(
        None, "--dataset", help="Dataset name for offline algorithms; several, comma-separated, make a grid axis (a trial per dataset)."
    ),
    store: Path | None = typer.Option(None, "--store", help="Dataset store (default: $RLPIPE_DATASETS or ./datasets)."),
    seeds: str = typer.Option(
        "0-4", "--seeds", help="Seeds of every setting: a range 0-4 or a list 0,1,2 (at most 1000, each from 0 to 2**32 - 1)."
    ),
    grid: list[str] = typer.Option([], "--set", help="A grid axis KEY=V1,V2,... (repeatable; one value: a fixed setting)."),
    settings_from: str | None = typer.Option(None, "--set-from", help="Fixed settings from a YAML mapping, FILE:DOTTED.KEY."),
    backend: str = typer.Option("local", "--backend", help="local (worker processes) or ray (Tune trials; $RAY_ADDRESS joins a cluster)."),
    workers: int | None = typer.Option(None, "--workers", min=1, help="Trials at once (default: the number of cores)."),
    retries: int = typer.Option(
        0,
        "--retries",
        min=0,
        help="Ray: restart a failed trial up to N times (with --set checkpoint_every=K it continues from its last saved state).",
    ),
    name: str | None = typer.Option(None, "--name", help="Sweep name: runs go to sweeps/NAME/runs/SETTING/seed-K (default: ALGO-SOURCE)."),
    root: Path = typer.Option(Path("sweeps"), "--root", help="Directory of all sweeps."),
    device: str | None = typer.Option(None, "--device", help="auto, cpu or cuda for every trial (default: cpu)."),
    batched: bool | None = typer.Option(
        None,
        "--batched/--no-batched",
        help="Train each setting's seeds as one batched computation (default: when the algorithm can and the device is CUDA).",
    ),
    trust_env_spec: bool = TRUST_ENV_SPEC_OPTION,
) -> None:
    """Train every setting of a grid with every seed.

    Writes sweeps/NAME/summary.json and prints each setting's mean ± std and a 95% bootstrap interval.
    """
    from rlpipe.algos import get_algo
    from rlpipe.commands.runs import read_settings
    from rlpipe.commands.sweep import DATASET_AXIS, SweepSpec, parse_grid, parse_seeds, run_sweep, sweep_dir

    out = sweep_dir(root, name, algo, env or dataset)
    config_class = get_algo(algo).config_class
    fixed = read_settings(settings_from, config_class) if settings_from else {}
    axes = parse_grid(grid, config_class)
    fixed.update({key: values[0] for key, values in axes.items() if len(values) == 1})  # one value: not an axis
    axes = {key: values for key, values in axes.items() if len(values) > 1}
    if device is not None:
        fixed["device"] = device
    datasets = dataset.split(",") if dataset else []
    if len(datasets) > 1:
        axes = {DATASET_AXIS: datasets, **axes}
    spec = SweepSpec(algo, env, dataset if len(datasets) == 1 else None, None if store is None else str(store), fixed)
    summary = run_sweep(spec, axes, parse_seeds(seeds), out, backend=backend, workers=workers, batched=batched, retries=retries)
    width = max(len(s) for s in summary["settings"])
    typer.echo(f"{'setting':<{width}}  seeds  return mean ± std    95% bootstrap interval  metric")
    for setting, stats in summary["settings"].items():
        typer.echo(
            f"{setting:<{width}}  {stats['seeds']:>5}  {stats['return_mean']:>9.1f} ± {stats['return_std']:<7.1f}"
            f"  [{stats['return_ci95_low']:.1f}, {stats['return_ci95_high']:.1f}]  {stats['metric']}"
        )
    typer.echo(f"-> {out / 'summary.json'}")
