"""`rlpipe collect`: roll out a policy in vector envs and store the trajectories as a dataset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from rlpipe.cli.app import TRUST_ENV_SPEC_OPTION, app, seed_option
from rlpipe.errors import RlpipeError
from rlpipe.limits import MAX_NUM_ENVS
from rlpipe.storage.atomic import json_text
from rlpipe.storage.files import atomic_write_text, check_output_file


@app.command("collect")
def collect_command(
    env: str = typer.Option(..., "--env", help="Gymnasium environment id, e.g. CartPole-v1."),
    name: str | None = typer.Option(None, "--name", help="Dataset name (default: <env>-random, <env>-expert or <env>-mixed)."),
    policy: str = typer.Option("random", "--policy", help="Behaviour policy when no --expert is given: 'random'."),
    expert: str | None = typer.Option(
        None, "--expert", help="Collect with a trained expert: ppo, sac, dqn or qrdqn (trained first if missing)."
    ),
    expert_run: Path | None = typer.Option(
        None,
        "--expert-run",
        help="Use this expert run as it is (trained there if missing). Default: models/<expert>-<env>, retrained when its params differ.",
    ),
    expert_steps: int | None = typer.Option(None, "--expert-steps", help="Env steps for training the expert (default: the tuned budget)."),
    expert_set: list[str] = typer.Option(
        [],
        "--expert-set",
        help="Set a config field of the expert's training, KEY=VALUE "
        "(repeatable, checked like `rlpipe train --set`), e.g. --expert-set stop_at_return=1078.",
    ),
    from_training: bool = typer.Option(
        False, "--from-training", help="Store every transition the expert saw while training from scratch (mixed quality)."
    ),
    stochastic: bool = typer.Option(
        False,
        "--stochastic",
        help="Sample expert actions instead of taking the mode, drawn from --seed (an IPPO team acts as in its evaluation unless given).",
    ),
    episodes: int | None = typer.Option(None, "--episodes", help="Number of whole episodes to store (an even quota per env)."),
    steps: int | None = typer.Option(
        None,
        "--steps",
        help="Store at least this many transitions in whole episodes (each env keeps whole episodes until its even share is reached).",
    ),
    seed: int = seed_option(0, "Seed for the envs and the policy; same seed, same bytes."),
    num_envs: str = typer.Option(
        "auto",
        "--num-envs",
        help="Parallel environments (gymnasium vector env), 1 to 4096, or auto: up to 256 for "
        "envs with a numpy-batched vector env (CartPole), else 1 (8 with --expert).",
    ),
    fmt: str | None = typer.Option(
        None,
        "--format",
        help="arrow (default), hdf5 (Minari layout, plus Arrow) or both; the HDF5 copy costs ~1 ms per episode, far more than collecting; multi-agent envs: arrow only.",
    ),
    store: Path | None = typer.Option(None, "--store", help="Dataset store (default: $RLPIPE_DATASETS or ./datasets)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing dataset of the same name."),
    metrics: Path | None = typer.Option(None, "--metrics", help="Also write collection statistics to this JSON file."),
    info_keys: list[str] = typer.Option(
        ["is_success"],
        "--info-key",
        help="Env info key to store as info/next_info columns when the env reports it (repeatable; default: is_success).",
    ),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
    backend: str | None = typer.Option(
        None,
        "--backend",
        help="Split the budget into tasks run by worker processes (local) "
        "or Ray tasks (ray; $RAY_ADDRESS joins a cluster): the same bytes for any --workers.",
    ),
    workers: int | None = typer.Option(None, "--workers", min=1, help="Tasks run at once (implies --backend local)."),
    trust_env_spec: bool = TRUST_ENV_SPEC_OPTION,
) -> None:
    """Collect trajectories from an env into a versioned dataset.

    The dataset is Arrow shards and metadata.json, with Minari's HDF5 layout on request (--format).
    """
    from rlpipe.commands.collect import CollectRequest, Rollout, collect_dataset

    if metrics is not None:
        check_output_file(metrics, "--metrics", make_parents=True)  # before anything is collected
    rollout = Rollout(episodes, steps, _num_envs(num_envs), seed, not quiet, tuple(info_keys))
    collected = collect_dataset(
        CollectRequest(
            env,
            rollout,
            policy=policy,
            expert=expert,
            expert_run=expert_run,
            expert_steps=expert_steps,
            expert_settings=_expert_settings(expert, expert_set),
            from_training=from_training,
            stochastic=stochastic,
            name=name,
            fmt=fmt,
            store=store,
            force=force,
            backend=backend,
            workers=workers,
        )
    )
    summary = collected.summary()
    if metrics is not None:
        metrics.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(metrics, json_text(summary))
    mean = "n/a (non-finite rewards)" if summary["return_mean"] is None else f"{summary['return_mean']:.2f}"
    typer.echo(f"wrote {collected.path}: {summary['episodes']} episodes, {summary['steps']} steps, mean return {mean}")


def _expert_settings(expert: str | None, pairs: list[str]) -> dict[str, Any]:
    """`--expert-set KEY=VALUE` pairs typed against the expert's config (torch is imported only then)."""
    if not pairs:
        return {}
    if expert is None:
        raise RlpipeError("--expert-set needs --expert (the algorithm whose training it sets)")
    from rlpipe.algos import get_algo
    from rlpipe.commands.experts import check_expert
    from rlpipe.training.config import parse_settings

    check_expert(expert)
    return parse_settings(pairs, get_algo(expert).config_class)


def _num_envs(value: str) -> int | None:
    """`--num-envs`: an integer from 1 to MAX_NUM_ENVS, or auto (None)."""
    if value == "auto":
        return None
    number = int(value) if value.isdecimal() and len(value) < 10 else 0  # '²' is a digit but not an int(); 10 digits are out of range
    if not 1 <= number <= MAX_NUM_ENVS:
        raise RlpipeError(f"--num-envs must be auto or an integer from 1 to {MAX_NUM_ENVS}, got {value!r}")
    return number
