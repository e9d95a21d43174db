"""`rlpipe train` and `rlpipe eval`: parse, call rlpipe.commands.runs / rlpipe.commands.evaluate, print."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import typer

from rlpipe.algos.registry import SPECS
from rlpipe.cli.app import TRUST_ENV_SPEC_OPTION, app, seed_option
from rlpipe.errors import RlpipeError

if TYPE_CHECKING:
    from rlpipe.training.config import DatasetFields

_ALGOS = (
    f"online, with --env: {', '.join(s.name for s in SPECS if s.online)}; "
    f"offline, with --dataset: {', '.join(s.name for s in SPECS if not s.online)}"
)


@app.command()
def train(
    algo: str = typer.Argument(..., help=f"Algorithm: {_ALGOS}."),
    env: str | None = typer.Option(None, "--env", help="Gymnasium env id for online algorithms, e.g. CartPole-v1."),
    dataset: str | None = typer.Option(None, "--dataset", help="Dataset name for offline algorithms (the env comes from its metadata)."),
    env_steps: int | None = typer.Option(None, "--env-steps", help="Environment steps to train for (default: tuned per env)."),
    updates: int | None = typer.Option(None, "--updates", help="Gradient updates for offline algorithms (default: tuned per env)."),
    max_samples: int | None = typer.Option(None, "--max-samples", help="Offline: train on this many transitions of the dataset."),
    finetune_env_steps: int | None = typer.Option(
        None,
        "--finetune-env-steps",
        help="Offline algorithms that go on online (IQL, CQL, Cal-QL, AWAC): after the offline updates, train in the dataset's env for N steps.",
    ),
    seed: int | None = seed_option(None, "Random seed (default 0); the same seed gives the same metrics on CPU."),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Run directory for checkpoint, metrics.json and the --logger curves (default: runs/ALGO-ENV or runs/ALGO-DATASET).",
    ),
    num_envs: int | None = typer.Option(None, "--num-envs", help="Parallel (vectorised) envs, 1 to 4096 (default: tuned per env)."),
    device: str | None = typer.Option(None, "--device", help="auto, cpu or cuda (default: auto)."),
    store: Path | None = typer.Option(None, "--store", help="Dataset store (default: $RLPIPE_DATASETS or ./datasets)."),
    overrides: list[str] = typer.Option(
        [],
        "--set",
        help="Override a config field, KEY=VALUE (repeatable, checked against the field's type), e.g. --set learning_rate=3e-4.",
    ),
    settings_from: str | None = typer.Option(
        None, "--set-from", help="Read settings from a YAML mapping, FILE:DOTTED.KEY (e.g. params.yaml:train_online.ppo-cartpole.set)."
    ),
    stop_at_return: float | None = typer.Option(None, "--stop-at-return", help="Stop early once the eval mean return reaches this."),
    loggers: list[str] = typer.Option(
        [],
        "--logger",
        help="Where the eval curve goes: dvclive, tensorboard (the tensorboard extra) or wandb (the wandb extra, offline); "
        "repeatable (default: dvclive).",
    ),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar (steps/s, latest return) on stderr."),
    checkpoint_every: int | None = typer.Option(
        None,
        "--checkpoint-every",
        help="Save the full training state every N units (env steps, or updates offline) so --resume can continue the run.",
    ),
    resume: Path | None = typer.Option(
        None,
        "--resume",
        help="Continue the interrupted run in this directory from its last saved state (other options come from that run).",
    ),
    nproc: int | None = typer.Option(
        None,
        "--nproc",
        help="Offline: train as N processes on this machine, each on batch_size/N of every batch, gradients averaged "
        "(torch.distributed: gloo on CPU, NCCL on CUDA); under torchrun, its process count.",
    ),
    backend: str = typer.Option(
        "local",
        "--backend",
        help="With --nproc: local (processes on this machine) or ray (Ray Train workers; $RAY_ADDRESS joins a cluster).",
    ),
    select_by: str | None = typer.Option(
        None,
        "--select-by",
        help="Offline on a dataset with no environment: keep the checkpoint with the lowest held-out action error "
        "(val_loss), the highest FQE estimate (fqe), or the last (last, the default).",
    ),
    trust_env_spec: bool = TRUST_ENV_SPEC_OPTION,
) -> None:
    """Train ALGO online (--env) or offline (--dataset).

    The run directory gets a safe checkpoint, metrics.json and the eval curve (DVCLive's, or --logger's).
    """
    from rlpipe.algos import OFFLINE, get_algo
    from rlpipe.commands.runs import merge_settings, prepare_resume, prepare_run, read_settings, train_ranks, train_run
    from rlpipe.training.config import FinetuneFields, OfflineConfig, parse_settings
    from rlpipe.training.distributed import launched_size

    config_class = get_algo(algo).config_class
    launched = launched_size()  # > 1: this process is one rank of a run torchrun started
    if nproc is None and launched > 1:
        nproc = launched
    for given, option in ((nproc, "--nproc"), (select_by, "--select-by")):
        if given is not None and not issubclass(config_class, OfflineConfig):
            raise RlpipeError(f"{option} is for offline algorithms (trained on a --dataset), not {algo}")
    if backend not in ("local", "ray"):
        raise RlpipeError(f"--backend {backend!r}: expected local or ray")
    if finetune_env_steps is not None and not issubclass(config_class, FinetuneFields):
        finetunable = ", ".join(name for name in OFFLINE if issubclass(get_algo(name).config_class, FinetuneFields))
        raise RlpipeError(f"--finetune-env-steps is for offline algorithms that go on online ({finetunable}), not {algo}")
    settings = merge_settings(read_settings(settings_from, config_class) if settings_from else {}, parse_settings(overrides, config_class))
    if device is None and "device" not in settings:
        device = "auto"  # the CLI's default; library configs default to cpu
    options = dict(
        seed=seed,
        device=device,
        stop_at_return=stop_at_return,
        env_steps=env_steps,
        num_envs=num_envs,
        updates=updates,
        max_samples=max_samples,
        checkpoint_every=checkpoint_every,
        finetune_env_steps=finetune_env_steps,
        loggers=tuple(loggers) or None,
        nproc=nproc,
        select_by=select_by,
    )
    if resume is not None:
        run = prepare_resume(algo, resume)
        dataset = cast("DatasetFields", run.config).dataset if not run.spec.online else None  # offline configs name their dataset
    else:
        run = prepare_run(algo, env_id=env, dataset=dataset, store=store, options=options, settings=settings, run_dir=out)
    if backend != "local" and getattr(run.config, "nproc", 1) == 1:
        raise RlpipeError("--backend ray starts the processes of a run of --nproc 2 or more")
    if getattr(run.config, "nproc", 1) > 1 and launched == 1:
        m, _ = train_ranks(run, progress=progress, backend=backend)  # started here: rank 0 wrote the run's metrics
    else:
        m = train_run(run, progress=progress).metrics
        if not m:  # a rank other than 0 of a run torchrun started: rank 0 reports
            return
    typer.echo(_summary(algo, run.config.env_id, dataset, run.run_dir, m))


def _summary(algo: str, env_id: str, dataset: str | None, run_dir: Path, m: dict[str, Any]) -> str:
    """A finished run's one line: its scores, budget and directory."""
    budget = (
        f"{m['env_steps']} env steps, {m['gradient_updates']} updates"
        if m["env_steps"]
        else f"{m['gradient_updates']} updates on {dataset}"
    )
    success = f", success rate {m['eval_success_rate']:.2f}" if "eval_success_rate" in m else ""
    if "eval_win_rate" in m:
        success = f", win rate {m['eval_win_rate']:.2f}"
    elif "good_return_mean" in m:
        success = f" (good agents; adversary {m['adversary_return_mean']:.1f})"
    heldout = (
        f"; held-out return {m['heldout_return_mean']:.1f} ± {m['heldout_return_std']:.1f} over {m['heldout_episodes']} episodes"
        if "heldout_return_mean" in m
        else ""
    )
    if "val_action_error" in m:  # data with no environment: scored on held-out episodes
        fqe = f", FQE estimate {m['fqe_estimate']:.1f} ± {m['fqe_standard_error']:.1f}" if "fqe_estimate" in m else ""
        score = (
            f"kept updates {m['selected_updates']} (select_by {m['select_by']}): validation action error {m['val_action_error']:.4f}{fqe}"
        )
        return f"{algo} {dataset}: {score}; {budget} ({m['wall_seconds']:.1f} s) -> {run_dir}"
    return (
        f"{algo} {env_id}: eval return {m['eval_return_mean']:.1f} ± {m['eval_return_std']:.1f}{success} after "
        f"{budget} ({m['wall_seconds']:.1f} s){heldout} -> {run_dir}"
    )


@app.command("eval")
def eval_(
    run_dir: Path = typer.Argument(..., help="A run directory written by `rlpipe train`."),
    episodes: int = typer.Option(10, "--episodes", min=1, help="Episodes to run."),
    seed: int = seed_option(
        0,
        "Seed of the evaluation: episode k resets its env with seed + k, so a second, independent "
        "sample needs a seed at least --episodes away (--seed 1 and --seed 2 share all but one episode).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    stochastic: bool = typer.Option(False, "--stochastic", help="Sample actions instead of acting deterministically."),
    device: str = typer.Option("cpu", "--device", help="auto, cpu or cuda."),
    video: Path | None = typer.Option(None, "--video", help="Also record episodes to this .gif or .mp4 (render_mode rgb_array)."),
    video_episodes: int = typer.Option(1, "--video-episodes", min=1, help="Episodes in the video (seeds SEED, SEED+1, ...)."),
    adversary_run: Path | None = typer.Option(
        None, "--adversary-run", help="MPE runs: play the adversaries of this other run (cross-play)."
    ),
    trust_env_spec: bool = TRUST_ENV_SPEC_OPTION,
) -> None:
    """Evaluate a saved policy: its mean ± std episode return.

    Multi-agent runs report their win rate or each side's returns; --video also records episodes.
    """
    from rlpipe.commands.evaluate import evaluate_saved_run

    result = evaluate_saved_run(run_dir, episodes, seed, not stochastic, device, adversary_run, video, video_episodes)
    typer.echo(json.dumps(result.report) if as_json else result.summary)
    if result.video_returns is not None:
        returns = ", ".join(f"{r:.1f}" for r in result.video_returns)
        typer.echo(f"recorded {len(result.video_returns)} episode(s) (return {returns}) -> {video}", err=as_json)
