"""`rlpipe collect`: roll out a policy in vector envs and store the trajectories as a dataset."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from rlpipe.cli.main import app
from rlpipe.datasets.collector import RandomPolicy, collect, make_vector_env
from rlpipe.datasets.writer import DatasetWriter
from rlpipe.errors import RlpipeError


@app.command("collect")
def collect_command(
    env: str = typer.Option(..., "--env", help="Gymnasium environment id, e.g. CartPole-v1."),
    name: Optional[str] = typer.Option(None, "--name", help="Dataset name (default: <env>-<policy>, lower case)."),
    policy: str = typer.Option("random", "--policy", help="Behaviour policy: 'random'."),
    episodes: Optional[int] = typer.Option(None, "--episodes", help="Number of whole episodes to store."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Store whole episodes until at least this many transitions."),
    seed: int = typer.Option(0, "--seed", help="Seed for the envs and the policy; same seed, same bytes."),
    num_envs: int = typer.Option(8, "--num-envs", help="Parallel environments (gymnasium vector env)."),
    fmt: str = typer.Option("both", "--format", help="arrow, hdf5 (Minari layout, plus Arrow) or both."),
    store: Optional[Path] = typer.Option(None, "--store", help="Dataset store (default: $RLPIPE_DATASETS or ./datasets)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing dataset of the same name."),
    metrics: Optional[Path] = typer.Option(None, "--metrics", help="Also write collection statistics to this JSON file."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
) -> None:
    """Collect trajectories from ENV with a policy into a versioned dataset (Arrow shards + metadata)."""
    if policy != "random":
        raise RlpipeError(f"unknown policy {policy!r}: use --policy random (experts: --expert ppo|sac)")
    dataset_name = name or f"{env.split('/')[-1].split('-v')[0].lower()}-{policy}"

    def make_policy(envs):
        return RandomPolicy(envs.single_action_space, envs.num_envs, seed=seed)

    probe = make_vector_env(env, 1)  # validates the id and gives the spaces before any file is made
    obs_space, act_space = probe.single_observation_space, probe.single_action_space
    probe.close()
    with DatasetWriter(dataset_name, obs_space, act_space, env_id=env, store=store, fmt=fmt, force=force) as writer:
        stats = collect(env, make_policy, writer.write, episodes=episodes, steps=steps, num_envs=num_envs, seed=seed, show_progress=not quiet)
        producer = {"algorithm": policy, "checkpoint_sha256": None, "seed": seed, "num_envs": num_envs,
                    "params": {"episodes": episodes, "steps": steps}}
        path = writer.finalize(producer)
    returns = writer.metadata["episode_return"]
    summary = {"dataset": dataset_name, "episodes": stats.episodes, "steps": stats.steps,
               "return_mean": returns["mean"], "return_std": returns["std"],
               "steps_per_second": stats.env_steps / max(stats.seconds, 1e-9)}
    if metrics is not None:
        metrics.parent.mkdir(parents=True, exist_ok=True)
        metrics.write_text(json.dumps(summary, indent=2) + "\n")
    typer.echo(f"wrote {path}: {stats.episodes} episodes, {stats.steps} steps, mean return {returns['mean']:.2f}")
