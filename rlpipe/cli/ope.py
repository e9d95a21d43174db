"""`rlpipe ope fqe RUN --dataset NAME`: estimate a policy's return from a dataset alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from rlpipe.cli.app import app, seed_option

ope_app = typer.Typer(help="Off-policy evaluation: score a policy from data, without the env.", no_args_is_help=True)
app.add_typer(ope_app, name="ope")


@ope_app.command("fqe")
def fqe_command(
    run_dir: Path = typer.Argument(..., help="Run directory of the policy to evaluate."),
    dataset: str = typer.Option(..., "--dataset", help="Dataset of the policy's env to fit on."),
    store: Optional[Path] = typer.Option(None, "--store", help="Dataset store (default: $RLPIPE_DATASETS or ./datasets)."),
    updates: int = typer.Option(20_000, "--updates", min=1, help="Gradient updates of the Q-network."),
    gamma: float = typer.Option(0.99, "--gamma", help="Discount of the estimated return."),
    seed: int = seed_option(0, "Seed of the Q-network and the minibatches."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Fitted Q Evaluation: the policy's discounted return from the dataset's initial states."""
    from dataclasses import asdict

    from rlpipe.algos import load_policy
    from rlpipe.datasets.loader import load_shards
    from rlpipe.datasets.store import open_dataset
    from rlpipe.errors import RlpipeError
    from rlpipe.pipeline.ope import FQEConfig, fitted_q_evaluation

    policy = load_policy(run_dir)
    info = open_dataset(dataset, store)
    if info.env_id != policy.env_id:
        raise RlpipeError(f"dataset {dataset!r} comes from {info.env_id}, but the run's policy acts in {policy.env_id}")
    result = fitted_q_evaluation(policy, load_shards(info), FQEConfig(gamma=gamma, updates=updates, seed=seed))
    if as_json:
        typer.echo(json.dumps({"run": str(run_dir), "dataset": dataset, "checkpoint_sha256": policy.checkpoint_sha256,
                               "dataset_content_hash": info.metadata["content_hash"], **asdict(result)}, indent=2))
    else:
        typer.echo(f"FQE estimate of {run_dir}'s discounted return (gamma {gamma}) on {dataset}: "
                   f"{result.estimate:.2f} ± {result.standard_error:.2f} over {result.initial_states} initial states")
