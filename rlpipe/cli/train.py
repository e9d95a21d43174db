"""`rlpipe train` and `rlpipe eval`: thin wrappers around rlpipe.algos."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any, Optional

import typer
import yaml

from rlpipe.cli.main import app
from rlpipe.errors import RlpipeError


def _parse_overrides(pairs: list[str], config_cls: type) -> dict[str, Any]:
    """``KEY=VALUE`` strings -> config overrides (values parsed as YAML: 3e-4, [64, 64], null)."""
    names = {f.name for f in fields(config_cls)}
    overrides: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise RlpipeError(f"--set expects KEY=VALUE, got {pair!r}")
        if key not in names:
            raise RlpipeError(f"unknown option {key!r} for --set; known: {', '.join(sorted(names))}")
        value = yaml.safe_load(raw)
        if isinstance(value, str):  # YAML 1.1 reads 3e-4 as a string
            try:
                value = float(value)
            except ValueError:
                pass
        overrides[key] = tuple(value) if isinstance(value, list) else value
    return overrides


@app.command()
def train(
    algo: str = typer.Argument(..., help="Algorithm: online ppo, sac, ddpg, td3 (--env); offline bc, ... (--dataset)."),
    env: Optional[str] = typer.Option(None, "--env", help="Gymnasium env id for online algorithms, e.g. CartPole-v1."),
    dataset: Optional[str] = typer.Option(None, "--dataset", help="Dataset name for offline algorithms (the env comes from its metadata)."),
    env_steps: Optional[int] = typer.Option(None, "--env-steps", help="Environment steps to train for (default: tuned per env)."),
    updates: Optional[int] = typer.Option(None, "--updates", help="Gradient updates for offline algorithms (default: tuned per env)."),
    max_samples: Optional[int] = typer.Option(None, "--max-samples", help="Offline: train on this many transitions of the dataset."),
    seed: int = typer.Option(0, "--seed", help="Random seed; the same seed gives the same metrics on CPU."),
    out: Optional[Path] = typer.Option(None, "--out", help="Run directory for checkpoint, metrics.json and dvclive/ (default: runs/ALGO-ENV or runs/ALGO-DATASET)."),
    num_envs: Optional[int] = typer.Option(None, "--num-envs", help="Parallel (vectorised) envs (default: tuned per env)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
    store: Optional[Path] = typer.Option(None, "--store", help="Dataset store (default: $RLPIPE_DATASETS or ./datasets)."),
    overrides: list[str] = typer.Option([], "--set", help="Override a config field, KEY=VALUE (repeatable), e.g. --set learning_rate=3e-4."),
    stop_at_return: Optional[float] = typer.Option(None, "--stop-at-return", help="Stop early once the eval mean return reaches this."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar (steps/s, latest return) on stderr."),
) -> None:
    """Train ALGO (online on --env, offline on --dataset) and save a safe checkpoint, metrics.json and a DVCLive curve."""
    from rlpipe.algos import ONLINE, get_algo

    module = get_algo(algo)
    options: dict[str, Any] = dict(seed=seed, device=device, stop_at_return=stop_at_return, env_steps=env_steps,
                                   num_envs=num_envs, updates=updates, max_samples=max_samples)
    if algo in ONLINE:
        from rlpipe.training.env import BOX, env_spaces, require_spaces

        if dataset is not None:
            raise RlpipeError(f"{algo} is an online algorithm and trains in the environment; --dataset is for offline algorithms")
        if env is None:
            raise RlpipeError(f"{algo} needs --env (a Gymnasium env id, e.g. CartPole-v1)")
        if not getattr(module, "MULTI_AGENT", False):  # multi-agent modules check their env ids in make_config
            obs_space, act_space = env_spaces(env)
            require_spaces(algo, env, obs_space, act_space, module.ACTION_SPACES, getattr(module, "OBSERVATION_SPACES", (BOX,)))
        name = env
    else:
        from rlpipe.training.offline import dataset_env_id

        if dataset is None:
            raise RlpipeError(f"{algo} is an offline algorithm: give --dataset NAME (see `rlpipe datasets list`)")
        if env is not None:
            raise RlpipeError(f"{algo} evaluates in the env recorded in the dataset's metadata; drop --env")
        env = dataset_env_id(dataset, store)
        options.update(dataset=dataset, store=None if store is None else str(store))
        name = dataset
    config = module.make_config(env, **options, **_parse_overrides(overrides, module.Config))
    run_dir = out if out is not None else Path("runs") / f"{algo}-{name}"
    result = module.train(config, run_dir, progress=progress)
    m = result.metrics
    budget = f"{m['env_steps']} env steps, {m['gradient_updates']} updates" if m["env_steps"] else f"{m['gradient_updates']} updates on {dataset}"
    success = f", success rate {m['eval_success_rate']:.2f}" if "eval_success_rate" in m else ""
    if "eval_win_rate" in m:
        success = f", win rate {m['eval_win_rate']:.2f}"
    elif "good_return_mean" in m:
        success = f" (good agents; adversary {m['adversary_return_mean']:.1f})"
    typer.echo(
        f"{algo} {env}: eval return {m['eval_return_mean']:.1f} ± {m['eval_return_std']:.1f}{success} after "
        f"{budget} ({m['wall_seconds']:.1f} s) -> {run_dir}"
    )


@app.command("eval")
def eval_(
    run_dir: Path = typer.Argument(..., help="A run directory written by `rlpipe train`."),
    episodes: int = typer.Option(10, "--episodes", min=1, help="Episodes to run."),
    seed: int = typer.Option(0, "--seed", help="Seed of the evaluation envs."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    stochastic: bool = typer.Option(False, "--stochastic", help="Sample actions instead of acting deterministically."),
    device: str = typer.Option("cpu", "--device", help="auto, cpu or cuda."),
    adversary_run: Optional[Path] = typer.Option(None, "--adversary-run", help="MPE runs: play the adversaries of this other run (cross-play)."),
) -> None:
    """Evaluate a saved policy and print the mean ± std episode return (multi-agent: win rate or side returns)."""
    from rlpipe.algos import load_policy
    from rlpipe.envs.multiagent import is_multi_agent
    from rlpipe.models.checkpoint import load_checkpoint
    from rlpipe.training.evaluation import evaluate

    if is_multi_agent(load_checkpoint(run_dir, "cpu").meta["env_id"]):
        from rlpipe.training.multiagent import evaluate_run

        result = evaluate_run(run_dir, episodes, seed, not stochastic, device, adversary_run)
        keys = ("win_rate",) if "win_rate" in result else ("adversary_return_mean", "good_return_mean")
        typer.echo(json.dumps(result) if as_json else
                   f"{result['algo']} {result['env_id']}: " + ", ".join(f"{k} {result[k]:.2f}" for k in keys) + f" over {episodes} episodes")
        return
    if adversary_run is not None:
        raise RlpipeError("--adversary-run applies to multi-agent (MPE) runs only")
    policy = load_policy(run_dir, device=device, deterministic=not stochastic)
    res = evaluate(policy, policy.env_id, episodes, seed)
    if as_json:
        typer.echo(json.dumps({
            "run_dir": str(run_dir), "algo": policy.algo, "env_id": policy.env_id, "episodes": episodes, "seed": seed,
            "deterministic": not stochastic, "return_mean": res.mean, "return_std": res.std, "returns": res.returns,
            **({} if res.success_rate is None else {"success_rate": res.success_rate}),
            "checkpoint_sha256": policy.checkpoint_sha256,
        }))
    else:
        success = "" if res.success_rate is None else f", success rate {res.success_rate:.2f}"
        typer.echo(f"{policy.algo} {policy.env_id}: {res.mean:.2f} ± {res.std:.2f}{success} over {episodes} episodes")
