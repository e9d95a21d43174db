"""`rlpipe ope fqe RUN --dataset NAME`: estimate a policy's return from a dataset alone."""

from __future__ import annotations

import json
import math
from pathlib import Path

import typer

from rlpipe.cli.app import app, seed_option
from rlpipe.limits import MAX_UPDATES

ope_app = typer.Typer(help="Off-policy evaluation: score policies from data alone.", no_args_is_help=True)
app.add_typer(ope_app, name="ope")


@ope_app.command("fqe")
def fqe_command(
    run_dirs: list[Path] = typer.Argument(..., help="Run directories of the policies to evaluate (of one env), fitted together."),
    dataset: str = typer.Option(..., "--dataset", help="Dataset of the policy's env to fit on."),
    store: Path | None = typer.Option(None, "--store", help="Dataset store (default: $RLPIPE_DATASETS or ./datasets)."),
    updates: int = typer.Option(15_000, "--updates", min=1, max=MAX_UPDATES, help="Gradient updates of the Q-networks."),
    gamma: float = typer.Option(0.99, "--gamma", help="Discount of the estimated return."),
    seed: int = seed_option(0, "Seed of the Q-network and the minibatches."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    out: Path | None = typer.Option(
        None, "--out", help="Also write the JSON result to this file; `rlpipe report --ope FILE` shows it beside the held-out returns."
    ),
) -> None:
    """Fitted Q Evaluation: each policy's discounted return.

    Estimated from the dataset alone, from its initial states, without the env.
    """
    from dataclasses import asdict

    from rlpipe.algos import load_policy
    from rlpipe.commands.ope import FQEConfig, fitted_q_evaluation, require_dataset_fits
    from rlpipe.datasets.loader import load_shards
    from rlpipe.datasets.store import open_dataset
    from rlpipe.storage.files import atomic_write_text, check_output_file

    if out is not None:
        check_output_file(out, "--out", make_parents=True)  # before the fit: a refused --out costs nothing and leaves nothing
    policies = [load_policy(run_dir) for run_dir in run_dirs]
    info = open_dataset(dataset, store)
    require_dataset_fits(policies, info)
    results = fitted_q_evaluation(policies, load_shards(info), FQEConfig(gamma=gamma, updates=updates, seed=seed))
    records = [
        {
            "run": str(run_dir),
            "dataset": dataset,
            "checkpoint_sha256": policy.checkpoint_sha256,
            "dataset_content_hash": info.metadata["content_hash"],
            **asdict(result),
            # one initial state has no standard error; JSON has no NaN
            "standard_error": result.standard_error if math.isfinite(result.standard_error) else None,
        }
        for run_dir, policy, result in zip(run_dirs, policies, results)
    ]
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out, json.dumps(records, indent=2) + "\n")
    if as_json:
        typer.echo(json.dumps(records, indent=2))
        return
    typer.echo(f"FQE estimates of the discounted return (gamma {gamma}) from {results[0].initial_states} initial states of {dataset}:")
    for run_dir, result in zip(run_dirs, results):
        typer.echo(f"  {run_dir}: {result.estimate:.2f} ± {result.standard_error:.2f}")
