"""What every training run shares: evaluation schedule, eval curve (to the sinks
``config.loggers`` names, DVCLive by default: :mod:`rlpipe.training.loggers`), progress bar,
checkpoint and ``metrics.json``. Algorithms call :class:`Run` from their ``train``.

A run directory is written like a dataset (:mod:`rlpipe.storage.atomic`): under a lock, into
a hidden temporary directory beside it, published by renames when the checkpoint and
metrics are complete. A crashed or failed run leaves the previous run as it was, never a mix
of an old checkpoint and a new partial curve.
"""

from __future__ import annotations

import copy
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from gymnasium import spaces
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from torch import nn

from rlpipe.envs import env_spec_json
from rlpipe.errors import RlpipeError
from rlpipe.nets.checkpoint import META_FILE, save_checkpoint
from rlpipe.storage.atomic import StagedDirectory, json_text
from rlpipe.storage.files import check_output_dir
from rlpipe.training.config import OfflineConfig, OnlineConfig
from rlpipe.training.diagnostics import Diagnostics
from rlpipe.training.env import space_to_json
from rlpipe.training.evaluation import EvalResult, PolicyFn, evaluate
from rlpipe.training.loggers import MetricSink, end_sinks, open_sinks

METRICS_FILE = "metrics.json"
EVAL_SEED_OFFSET = 10_000  # eval envs never share seeds with training envs
# The final held-out evaluation's env seeds: disjoint from training (seed + i) and from the
# periodic evaluation (seed + EVAL_SEED_OFFSET + i, the seeds settings were tuned on), so
# the reported figure is not selected on its own episodes.
HELDOUT_SEED_OFFSET = 20_000


def is_run_dir(path: Path) -> bool:
    """Whether `path` holds a finished run (its checkpoint record)."""
    return (path / META_FILE).is_file()


def _check_run_target(out_dir: Path) -> None:
    """An existing ``--out`` is replaced only if it is empty or an earlier run's directory; a
    new one must be one that can be made (`check_output_dir`: no name too long, no file above)."""
    if out_dir.name in ("", ".", "..") or os.path.islink(out_dir) or (os.path.exists(out_dir) and not os.path.isdir(out_dir)):
        raise RlpipeError(f"--out {out_dir} must name a directory (not a file, a link or a root)")
    check_output_dir(out_dir, "--out")
    # A `.gitignore` alone is what DVC leaves of a stage's run directory whose files are its outputs.
    contents = [path for path in out_dir.iterdir() if path.name != ".gitignore"] if out_dir.is_dir() else []
    if contents and not any((out_dir / n).exists() for n in (META_FILE, METRICS_FILE, "dvclive")):
        raise RlpipeError(f"--out {out_dir} is a non-empty directory that is not a run directory; refusing to replace it")


@dataclass(frozen=True)
class EvalPoint:
    done: int  # progress in the run's unit: env steps, or gradient updates offline
    wall_seconds: float
    mean: float  # NaN on data with no environment, where nothing is played
    std: float
    success_rate: float | None = None  # goal envs only
    validation_error: float | None = None  # data with no environment: rlpipe.training.validation
    validation_td_error: float | None = None  # and the critics' TD error there (value methods)
    # mean episode length: on envs that end on failure (Hopper's fall) it tells an early fall from a slow gait
    length_mean: float | None = None


def history_rows(history: list[EvalPoint]) -> list[dict[str, Any]]:
    """An eval history as JSON rows (a resumable checkpoint's, a rank's hand-over)."""
    return [asdict(point) for point in history]


def history_from_rows(rows: list[dict[str, Any]]) -> list[EvalPoint]:
    """The eval history :func:`history_rows` wrote."""
    return [EvalPoint(**row) for row in rows]


@dataclass
class TrainResult:
    """What ``train`` returns: final metrics, the eval curve, and the trained actor."""

    algo: str
    env_id: str
    metrics: dict[str, Any]
    history: list[EvalPoint]
    policy: nn.Module
    run_dir: Path | None = None
    checkpoint_sha256: str | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    def first_reaching(self, threshold: float) -> EvalPoint | None:
        """The first eval point with mean return >= ``threshold`` (None if never)."""
        return next((p for p in self.history if p.mean >= threshold), None)


def _curve_metrics(point: EvalPoint) -> dict[str, float]:
    """An eval point as the curve's scalars."""
    if point.validation_error is not None:
        td_error = {} if point.validation_td_error is None else {"val/td_error": point.validation_td_error}
        return {"val/action_error": point.validation_error, **td_error}
    metrics = {"eval/return_mean": point.mean, "eval/return_std": point.std}
    if point.length_mean is not None:
        metrics["eval/length_mean"] = point.length_mean
    if point.success_rate is not None:
        metrics["eval/success_rate"] = point.success_rate
    return metrics


class Run:
    """Bookkeeping of one training run.

    Progress is counted in env steps for an :class:`OnlineConfig` (budget ``env_steps``)
    and in gradient updates for an :class:`OfflineConfig` (budget ``updates``);
    ``config.eval_every`` is in the same unit. ``evaluator(policy, episodes, seed)``
    replaces the Gymnasium evaluation (multi-agent envs); ``env_kwargs`` (the env's options
    when the config does not hold them, e.g. those a multi-agent dataset was collected
    under) go into the checkpoint's meta. On data with no environment ``validation(policy)``
    (the held-out episodes' action error) is what each evaluation measures instead, with
    ``td_validation()`` (the critics' TD error there) where the algorithm has critics, and
    ``observation_space`` goes into the checkpoint's meta in place of the env's.
    """

    def __init__(
        self,
        algo: str,
        config: OnlineConfig | OfflineConfig,
        out_dir: str | Path | None = None,
        progress: bool = True,
        evaluator: Callable[[Any, int, int], EvalResult] | None = None,
        env_kwargs: dict[str, Any] | None = None,
        validation: Callable[[PolicyFn], float] | None = None,
        observation_space: spaces.Space | None = None,
        td_validation: Callable[[], float] | None = None,
    ) -> None:
        self.algo, self.config, self.env_kwargs = algo, config, env_kwargs
        self.validation, self.observation_space, self.td_validation = validation, observation_space, td_validation
        self.evaluator = evaluator or (lambda policy, episodes, seed: evaluate(policy, config.env_id, episodes, seed))
        self.unit = "steps" if isinstance(config, OnlineConfig) else "updates"
        self.total = config.env_steps if isinstance(config, OnlineConfig) else config.updates
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.history: list[EvalPoint] = []
        self.diagnostics = Diagnostics(self.unit)  # the loops add each update's; logged with each evaluation
        self.next_eval = config.eval_every
        self.sinks: list[MetricSink] = []  # the curve's destinations (config.loggers), in the staging directory
        self._staging: StagedDirectory | None = None
        if self.out_dir is not None:
            self._staging = StagedDirectory(self.out_dir, f"run directory {self.out_dir}", is_run_dir, _check_run_target)
            try:
                self.sinks = open_sinks(config.loggers, self._staging.path, self.out_dir.name, asdict(config))
            except BaseException:
                self._staging.abort()
                raise
        self.progress: Progress | None = None
        if progress:
            self.progress = Progress(
                TextColumn(f"{algo} {config.env_id or getattr(config, 'dataset', '')}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[sps]:>6.0f} " + self.unit + "/s"),
                TextColumn(("action error" if validation else "return") + " {task.fields[ret]}"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=False,
            )
            self.task = self.progress.add_task("train", total=self.total, sps=0.0, ret="-")
            self.progress.start()
        self.start = time.perf_counter()
        self._last_draw = 0.0

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def show(self, done: int, train_return: float | None = None) -> None:
        """Update the progress bar with ``done`` units (throttled to ~10 Hz: free per step)."""
        if self.progress is None:
            return
        now = time.perf_counter()
        if now - self._last_draw < 0.1:
            return
        self._last_draw = now
        point = self.history[-1] if self.history else None
        if self.validation is not None:
            shown = "-" if point is None else f"{point.validation_error:.4f}"
        else:
            latest = point.mean if point else train_return
            shown = "-" if latest is None else f"{latest:.1f}"
        self.progress.update(self.task, completed=min(done, self.total), sps=done / max(now - self.start, 1e-9), ret=shown)

    def evaluate(self, policy: PolicyFn, done: int) -> EvalPoint:
        """Evaluate now, record the point in the history and the curve's sinks (x = ``done``
        units), with the means of the updates' diagnostics since the last evaluation."""
        if self.validation is not None:
            td_error = None if self.td_validation is None else self.td_validation()
            point = EvalPoint(
                done, self.elapsed(), math.nan, math.nan, validation_error=self.validation(policy), validation_td_error=td_error
            )
        else:
            res = self.evaluator(policy, self.config.eval_episodes, self.config.seed + EVAL_SEED_OFFSET)
            point = EvalPoint(done, self.elapsed(), res.mean, res.std, res.success_rate, length_mean=res.length_mean)
        self.history.append(point)
        logged = {**self.diagnostics.take(done), **_curve_metrics(point)}
        for sink in self.sinks:
            sink.log(done, logged)
        self._last_draw = 0.0
        self.show(done)
        return point

    def evaluate_final(self, policy: PolicyFn, done: int) -> EvalPoint:
        """The evaluation at ``done`` units: made now unless the last one was at ``done``.
        :meth:`finish` calls it; a run whose evaluator keeps more than the returns (win rates,
        side returns) calls it first to read those before building ``finish``'s metrics."""
        if not self.history or self.history[-1].done != done:
            self.evaluate(policy, done)
        return self.history[-1]

    def maybe_evaluate(self, policy: PolicyFn, done: int) -> bool:
        """Evaluate when ``done`` units passed the next eval point; True means "stop now"."""
        if done < self.next_eval:
            return done >= self.total
        while self.next_eval <= done:
            self.next_eval += self.config.eval_every
        point = self.evaluate(policy, done)
        target = self.config.stop_at_return
        return done >= self.total or (target is not None and point.mean >= target)

    def finish(
        self,
        policy: PolicyFn,
        actor: nn.Module,
        modules: dict[str, nn.Module],
        action_space: spaces.Space,
        env_steps: int,
        gradient_updates: int,
        extra_metrics: dict[str, Any] | None = None,
    ) -> TrainResult:
        """Final evaluation (unless one was just done), the held-out evaluation
        (``config.heldout_eval_episodes`` episodes on seeds ``seed + HELDOUT_SEED_OFFSET``,
        none if 0), checkpoint and ``metrics.json``.

        ``modules`` must contain the actor under the key ``"policy"``.
        """
        final = self.evaluate_final(policy, env_steps if self.unit == "steps" else gradient_updates)
        wall = self.elapsed()  # training time: the held-out evaluation is not part of it
        # A copy as training left them: an evaluator may append to lists they hold (IPPO's curve).
        extra_metrics = copy.deepcopy(extra_metrics or {})
        heldout = self.heldout(policy)
        if final.validation_error is not None:
            scores: dict[str, Any] = {"val_action_error": final.validation_error}
            if final.validation_td_error is not None:
                scores["val_td_error"] = final.validation_td_error
        else:
            scores = {
                "eval_return_mean": final.mean,
                "eval_return_std": final.std,
                **({} if final.success_rate is None else {"eval_success_rate": final.success_rate}),
                "eval_episodes": self.config.eval_episodes,
            }
        metrics = {
            "algo": self.algo,
            "env_id": self.config.env_id,
            "seed": self.config.seed,
            **scores,
            "env_steps": int(env_steps),
            "gradient_updates": int(gradient_updates),
            "wall_seconds": round(wall, 3),
            **heldout,
            **extra_metrics,
        }
        digest = None
        if self._staging is not None:
            meta = {
                "algo": self.algo,
                "env_id": self.config.env_id,
                # rebuilds a dataset's env spec in `rlpipe eval` (none for data with no environment)
                "env_spec": env_spec_json(self.config.env_id) if self.config.env_id else None,
                "action_space": space_to_json(action_space),
                # as a string, as dataset metadata holds it: an unbounded Box's Infinity is not standard JSON
                **({} if self.observation_space is None else {"observation_space": json.dumps(space_to_json(self.observation_space))}),
                "policy": {"kind": actor.kind, "spec": actor.spec},
                "config": asdict(self.config),
                **({} if self.env_kwargs is None else {"env_kwargs": self.env_kwargs}),
                "torch_version": torch.__version__,
            }
            digest = save_checkpoint(self._staging.path, modules, meta)
            metrics["checkpoint_sha256"] = digest
            (self._staging.path / METRICS_FILE).write_text(json_text(metrics))
        self._stop()  # the sinks write their last files when they end
        if self._staging is not None:
            self._staging.commit()
            self._staging = None
        return TrainResult(self.algo, self.config.env_id, metrics, list(self.history), actor, self.out_dir, digest)

    def heldout(self, policy: PolicyFn) -> dict[str, Any]:
        """The held-out evaluation's ``metrics.json`` keys (none when it is disabled)."""
        episodes = self.config.heldout_eval_episodes
        if episodes == 0 or self.validation is not None:
            return {}
        res = self.evaluator(policy, episodes, self.config.seed + HELDOUT_SEED_OFFSET)
        return {
            "heldout_return_mean": res.mean,
            "heldout_return_std": res.std,
            "heldout_length_mean": res.length_mean,
            **({} if res.success_rate is None else {"heldout_success_rate": res.success_rate}),
            "heldout_episodes": episodes,
        }

    def state(self) -> dict[str, Any]:
        """The eval history and schedule, for a resumable checkpoint (rlpipe.training.resume)."""
        return {"history": history_rows(self.history), "next_eval": self.next_eval}

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state`: the history (logged again to the curve's sinks) and schedule."""
        self.history = history_from_rows(state["history"])
        self.next_eval = state["next_eval"]
        for point in self.history:
            for sink in self.sinks:
                sink.log(point.done, _curve_metrics(point))

    def close(self) -> None:
        """Stop the progress bar and the curve's sinks; an unfinished run's directory is deleted."""
        try:
            self._stop()
        finally:
            if self._staging is not None:
                self._staging.abort()
                self._staging = None

    def _stop(self) -> None:
        if self.progress is not None:
            self.show(self.history[-1].done if self.history else 0)
            self.progress.stop()
            self.progress = None
        sinks, self.sinks = self.sinks, []
        end_sinks(sinks)
