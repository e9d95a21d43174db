"""Evaluating a saved run: what ``rlpipe eval`` does.

A single-agent run is loaded with its algorithm's policy loader and played in its Gymnasium
env (optionally recorded to a video); a multi-agent run is evaluated by its env family's
plug-in (:mod:`rlpipe.training.multiagent`), which reports its own keys (a win rate, side
returns).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlpipe.algos.registry import get_algo, load_policy
from rlpipe.commands.experts import load_saved_actor
from rlpipe.envs.multiagent import is_multi_agent
from rlpipe.errors import RlpipeError
from rlpipe.limits import MAX_EPISODES, check_count
from rlpipe.nets.checkpoint import read_meta
from rlpipe.storage.atomic import recover_name
from rlpipe.training.run import is_run_dir


@dataclass(frozen=True)
class SavedRunEval:
    """What an evaluation of a saved run reports: ``report`` (JSON-ready), the one-line
    ``summary``, and the returns of the episodes recorded to a video (None: no video)."""

    report: dict[str, Any]
    summary: str
    video_returns: list[float] | None = None


def evaluate_saved_run(
    run_dir: Path,
    episodes: int,
    seed: int,
    deterministic: bool = True,
    device: str = "cpu",
    adversary_run: Path | None = None,
    video: Path | None = None,
    video_episodes: int = 1,
) -> SavedRunEval:
    """Evaluate the run in ``run_dir`` over ``episodes`` episodes (episode k's env reset with
    ``seed + k``); ``adversary_run`` plays the adversaries of a multi-agent run (cross-play);
    ``video`` also records ``video_episodes`` episodes of a single-agent run."""
    check_count(episodes, "--episodes", MAX_EPISODES)
    check_count(video_episodes, "--video-episodes", MAX_EPISODES)
    recover_name(run_dir.absolute().parent, run_dir.name, is_run_dir)  # a replace that crashed midway is rolled back first
    if video is not None:
        from rlpipe.commands.video import check_video_path

        check_video_path(video)  # before any episode runs
    meta = read_meta(run_dir)
    if get_algo(meta.get("algo", "")).multi_agent or is_multi_agent(meta.get("env_id", "")):  # e.g. BC on a team's data
        if video is not None:
            raise RlpipeError("--video records single-agent Gymnasium runs only")
        return _evaluate_multi_agent(run_dir, episodes, seed, deterministic, device, adversary_run)
    if adversary_run is not None:
        raise RlpipeError("--adversary-run applies to multi-agent runs only")
    return _evaluate_single_agent(run_dir, episodes, seed, deterministic, device, video, video_episodes)


def _evaluate_multi_agent(
    run_dir: Path, episodes: int, seed: int, deterministic: bool, device: str, adversary_run: Path | None
) -> SavedRunEval:
    from rlpipe.training.env import resolve_device
    from rlpipe.training.multiagent import family_plugin

    dev = resolve_device(device)
    saved = load_saved_actor(run_dir, dev)
    plugin = family_plugin(saved.meta["env_id"])
    head = {
        "run_dir": str(run_dir),
        "algo": saved.meta["algo"],
        "env_id": saved.meta["env_id"],
        "episodes": episodes,
        "seed": seed,
        "deterministic": deterministic,
        "checkpoint_sha256": saved.sha256,
    }
    adversary = None if adversary_run is None else (lambda: load_saved_actor(adversary_run, dev))
    report = {**head, **plugin.evaluate_run(saved, episodes, seed, deterministic, dev, adversary)}
    scores = ", ".join(f"{key} {report[key]:.2f}" for key in plugin.headline)
    return SavedRunEval(report, f"{report['algo']} {report['env_id']}: {scores} over {episodes} episodes")


def _evaluate_single_agent(
    run_dir: Path, episodes: int, seed: int, deterministic: bool, device: str, video: Path | None, video_episodes: int
) -> SavedRunEval:
    import torch

    from rlpipe.training.evaluation import evaluate

    policy = load_policy(run_dir, device=device, deterministic=deterministic)
    torch.manual_seed(seed)  # policies that sample (BCQ's candidates, --stochastic) repeat for one --seed
    res = evaluate(policy, policy.played_in(), episodes, seed)
    score = _normalized_score(policy.config, res.mean)
    report = {
        "run_dir": str(run_dir),
        "algo": policy.algo,
        "env_id": policy.env_id,
        "episodes": episodes,
        "seed": seed,
        "deterministic": deterministic,
        "return_mean": res.mean,
        "return_std": res.std,
        "returns": res.returns,
        **({} if res.success_rate is None else {"success_rate": res.success_rate}),
        **({} if score is None else {"normalized_score": score}),
        "checkpoint_sha256": policy.checkpoint_sha256,
    }
    success = "" if res.success_rate is None else f", success rate {res.success_rate:.2f}"
    normalized = "" if score is None else f", normalised score {score:.3f}"
    summary = f"{policy.algo} {policy.env_id}: {res.mean:.2f} ± {res.std:.2f}{success}{normalized} over {episodes} episodes"
    recorded = None
    if video is not None:
        from rlpipe.commands.video import record_video

        recorded = record_video(policy, policy.env_id, video, video_episodes, seed)
    return SavedRunEval(report, summary, recorded)


def _normalized_score(config: dict[str, Any], mean_return: float) -> float | None:
    """The mean return normalised by the reference scores of the run's dataset (offline runs
    whose dataset records `ref_min_score` and `ref_max_score`), else None."""
    from rlpipe.datasets.scores import normalized_score
    from rlpipe.datasets.store import open_dataset

    if not config.get("dataset"):
        return None
    try:
        metadata = open_dataset(config["dataset"], config.get("store")).metadata
    except RlpipeError:  # the dataset was removed or moved since training: no reference
        return None
    score = normalized_score(metadata, mean_return)
    return None if score is None else float(score)


__all__ = ["SavedRunEval", "evaluate_saved_run"]
