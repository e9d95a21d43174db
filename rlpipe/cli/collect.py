"""`rlpipe collect`: roll out a policy in vector envs and store the trajectories as a dataset."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from rlpipe.cli.main import app
from rlpipe.datasets.collector import RandomPolicy, collect
from rlpipe.datasets.writer import DatasetWriter
from rlpipe.errors import RlpipeError
from rlpipe.envs import env_spaces


@app.command("collect")
def collect_command(
    env: str = typer.Option(..., "--env", help="Gymnasium environment id, e.g. CartPole-v1."),
    name: Optional[str] = typer.Option(None, "--name", help="Dataset name (default: <env>-random, <env>-expert or <env>-mixed)."),
    policy: str = typer.Option("random", "--policy", help="Behaviour policy when no --expert is given: 'random'."),
    expert: Optional[str] = typer.Option(None, "--expert", help="Collect with a trained expert: ppo or sac (trained first if missing)."),
    expert_run: Optional[Path] = typer.Option(
        None, "--expert-run", help="Use this expert run as it is (trained there if missing). Default: models/<expert>-<env>, "
        "retrained when its params differ."
    ),
    expert_steps: Optional[int] = typer.Option(None, "--expert-steps", help="Env steps for training the expert (default: the tuned budget)."),
    from_training: bool = typer.Option(
        False, "--from-training", help="Store every transition the expert saw while training from scratch (mixed quality)."
    ),
    stochastic: bool = typer.Option(False, "--stochastic", help="Sample expert actions instead of taking the mode."),
    episodes: Optional[int] = typer.Option(None, "--episodes", help="Number of whole episodes to store."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Store whole episodes until at least this many transitions."),
    seed: int = typer.Option(0, "--seed", help="Seed for the envs and the policy; same seed, same bytes."),
    num_envs: int = typer.Option(8, "--num-envs", help="Parallel environments (gymnasium vector env)."),
    fmt: Optional[str] = typer.Option(None, "--format", help="arrow, hdf5 (Minari layout, plus Arrow) or both (default; multi-agent envs: arrow only)."),
    store: Optional[Path] = typer.Option(None, "--store", help="Dataset store (default: $RLPIPE_DATASETS or ./datasets)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing dataset of the same name."),
    metrics: Optional[Path] = typer.Option(None, "--metrics", help="Also write collection statistics to this JSON file."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
) -> None:
    """Collect trajectories from ENV into a versioned dataset (Arrow shards + metadata, Minari HDF5)."""
    from rlpipe.envs.multiagent import is_multi_agent
    from rlpipe.pipeline import experts

    if is_multi_agent(env):
        _collect_multi_agent(env, name, policy, expert, expert_run, episodes, steps, seed, num_envs, fmt or "arrow", store, force, stochastic)
        return
    fmt = fmt or "both"
    if expert is None and policy != "random":
        raise RlpipeError(f"unknown policy {policy!r}: use --policy random, or --expert ppo|sac")
    if from_training and expert is None:
        raise RlpipeError("--from-training needs --expert (the algorithm to train)")
    if from_training and (episodes is not None or steps is not None):
        raise RlpipeError("--from-training stores the whole training run: use --expert-steps, not --episodes/--steps")
    if expert is not None:
        experts.check_expert(expert)
    kind = "mixed" if from_training else ("expert" if expert else policy)
    dataset_name = name or f"{experts.env_slug(env)}-{kind}"
    obs_space, act_space = env_spaces(env)  # validates the id before any file is made
    run_dir = expert_run or (experts.default_run_dir(expert, env) if expert else None)
    overrides: dict[str, Any] = {"env_steps": expert_steps, "seed": seed}

    with DatasetWriter(dataset_name, obs_space, act_space, env_id=env, store=store, fmt=fmt, force=force) as writer:
        if from_training:
            training = experts.collect_training_transitions(expert, env, writer, run_dir, overrides, progress=not quiet)
            producer = {"algorithm": expert, "mode": "training-replay", "checkpoint_sha256": training["checkpoint_sha256"],
                        "run_dir": str(run_dir), "seed": seed, "params": {"expert_steps": expert_steps},
                        "final_eval_return_mean": training.get("eval_return_mean")}
        else:
            if expert is not None:
                loaded, _ = experts.ensure_expert(expert, env, run_dir, overrides, match_params=expert_run is None,
                                                  deterministic=not stochastic, progress=not quiet)
                make_policy: Any = lambda envs: loaded  # noqa: E731
                producer = {"algorithm": expert, "checkpoint_sha256": loaded.checkpoint_sha256, "run_dir": str(run_dir),
                            "deterministic": not stochastic}
            else:
                make_policy = lambda envs: RandomPolicy(envs.single_action_space, envs.num_envs, seed=seed)  # noqa: E731
                producer = {"algorithm": "random", "checkpoint_sha256": None}
            collect(env, make_policy, writer.write, episodes=episodes, steps=steps, num_envs=num_envs, seed=seed,
                            show_progress=not quiet)
            producer.update({"seed": seed, "num_envs": num_envs, "params": {"episodes": episodes, "steps": steps}})
        path = writer.finalize(producer)
    meta = writer.metadata
    returns = meta["episode_return"]
    summary = {"dataset": dataset_name, "episodes": meta["total_episodes"], "steps": meta["total_steps"],
               "return_mean": returns["mean"], "return_std": returns["std"]}
    if metrics is not None:
        metrics.parent.mkdir(parents=True, exist_ok=True)
        metrics.write_text(json.dumps(summary, indent=2) + "\n")
    typer.echo(f"wrote {path}: {summary['episodes']} episodes, {summary['steps']} steps, mean return {returns['mean']:.2f}")


def _collect_multi_agent(env: str, name: str | None, policy: str, expert: str | None, expert_run: Path | None,
                         episodes: int | None, steps: int | None, seed: int, num_envs: int, fmt: str, store: Path | None,
                         force: bool, stochastic: bool) -> None:
    """`rlpipe collect --env Combat-v0`: one row per living agent per step (an `agent` column)."""
    from rlpipe.envs.combat import CombatRules
    from rlpipe.pipeline.multiagent import collect_combat, random_team_policy

    if env != "Combat-v0":
        raise RlpipeError(f"multi-agent collection supports Combat-v0; got {env!r}")
    if fmt != "arrow":
        raise RlpipeError(f"--format {fmt}: multi-agent datasets are Arrow-only (Minari's HDF5 has no multi-agent layout); use --format arrow")
    if steps is not None or episodes is None:
        raise RlpipeError("multi-agent collection counts whole episodes: give --episodes N")
    if expert is not None and (expert != "ippo" or expert_run is None):
        raise RlpipeError("multi-agent experts: --expert ippo --expert-run RUN_DIR (a trained `rlpipe train ippo` run)")
    if expert is None and policy != "random":
        raise RlpipeError(f"unknown policy {policy!r}: use --policy random, or --expert ippo --expert-run RUN")
    rules: dict[str, Any] = {}
    producer: dict[str, Any] = {"algorithm": "random", "checkpoint_sha256": None}
    if expert is not None:
        import torch

        from rlpipe.training.multiagent import load_team_policy

        team, meta, sha = load_team_policy(expert_run, deterministic=not stochastic, seed=seed)
        if meta["env_id"] != env:
            raise RlpipeError(f"--expert-run {expert_run} was trained on {meta['env_id']}, not {env}")
        rules = {k: v for k, v in meta["config"].items() if k in CombatRules.__dataclass_fields__}
        make_policy: Any = lambda envs: team  # noqa: E731
        producer = {"algorithm": "ippo", "checkpoint_sha256": sha, "run_dir": str(expert_run), "deterministic": not stochastic}
        torch.set_num_threads(1)
    else:
        make_policy = lambda envs: random_team_policy(envs.rules.n_actions, seed)  # noqa: E731
    game = CombatRules(**rules)
    dataset_name = name or f"combat-{'expert' if expert else policy}"
    with DatasetWriter(dataset_name, game.observation_space(), game.action_space(), env_id=env, store=store, fmt="arrow",
                       force=force, multi_agent=True) as writer:
        collect_combat(writer.write, make_policy, episodes, num_envs, seed, rules)
        producer.update({"seed": seed, "num_envs": num_envs, "params": {"episodes": episodes}, "rules": rules})
        path = writer.finalize(producer)
    meta = writer.metadata
    typer.echo(f"wrote {path}: {meta['total_episodes']} episodes, {meta['total_steps']} agent steps, "
               f"mean team return {meta['episode_return']['mean']:.2f}")
