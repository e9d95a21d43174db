"""What every training run shares: evaluation schedule, DVCLive curve, progress bar,
checkpoint and ``metrics.json``. Algorithms call :class:`Run` from their ``train``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from gymnasium import spaces
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from torch import nn

from rlpipe.errors import RlpipeError
from rlpipe.models.checkpoint import save_checkpoint
from rlpipe.training.env import space_to_json
from rlpipe.training.evaluation import EvalResult, PolicyFn, evaluate

METRICS_FILE = "metrics.json"
EVAL_SEED_OFFSET = 10_000  # eval envs never share seeds with training envs
C = TypeVar("C")


def config_for_env(cls: type[C], tuned: dict[str, dict[str, Any]], env_id: str, **overrides: Any) -> C:
    """Build ``cls(env_id=..)`` from the per-env tuned table, then non-None ``overrides``.

    Unknown keys are an RlpipeError naming the field (typos must not be silently ignored).
    """
    names = {f.name for f in fields(cls)}
    values = {**tuned.get(env_id, {}), **{k: v for k, v in overrides.items() if v is not None}}
    unknown = sorted(set(values) - names)
    if unknown:
        raise RlpipeError(f"unknown {cls.__module__.rsplit('.', 1)[-1]} option(s): {', '.join(unknown)}")
    return cls(env_id=env_id, **values)


@dataclass(frozen=True)
class EvalPoint:
    done: int  # progress in the run's unit: env steps, or gradient updates offline
    wall_seconds: float
    mean: float
    std: float
    success_rate: float | None = None  # goal envs only


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


def _make_live(out_dir: Path) -> Any:
    from dvclive import Live

    class _Live(Live):
        # Outside `dvc repro`, DVCLive would look for (and even `dvc init`) a repo to
        # record experiments; we only want its files, so skip that unless DVC runs us.
        def _init_dvc(self) -> None:
            if os.getenv("DVC_ROOT"):
                super()._init_dvc()

    return _Live(dir=str(out_dir / "dvclive"), save_dvc_exp=False, dvcyaml=False)


class Run:
    """Bookkeeping of one training run.

    ``config`` must have ``env_id, seed, eval_every, eval_episodes`` and ``stop_at_return``
    (None or a return at which training stops early). Progress is counted in ``unit``
    ("steps": env steps, budget ``config.env_steps``; "updates": gradient updates for
    offline training, budget ``config.updates``); ``eval_every`` is in the same unit.
    ``evaluator(policy, episodes, seed)`` replaces the Gymnasium evaluation (multi-agent envs).
    """

    def __init__(
        self, algo: str, config: Any, out_dir: str | Path | None = None, progress: bool = True, unit: str = "steps",
        evaluator: Callable[[Any, int, int], EvalResult] | None = None,
    ) -> None:
        self.algo, self.config, self.unit = algo, config, unit
        self.evaluator = evaluator or (lambda policy, episodes, seed: evaluate(policy, config.env_id, episodes, seed))
        self.total = config.env_steps if unit == "steps" else config.updates
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.history: list[EvalPoint] = []
        self.next_eval = config.eval_every
        self.live = None
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self.live = _make_live(self.out_dir)
        self.progress: Progress | None = None
        if progress:
            self.progress = Progress(
                TextColumn(f"{algo} {config.env_id}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[sps]:>6.0f} " + unit + "/s"),
                TextColumn("return {task.fields[ret]}"),
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
        latest = self.history[-1].mean if self.history else train_return
        self.progress.update(
            self.task,
            completed=min(done, self.total),
            sps=done / max(now - self.start, 1e-9),
            ret="-" if latest is None else f"{latest:.1f}",
        )

    def evaluate(self, policy: PolicyFn, done: int) -> EvalPoint:
        """Evaluate now, record the point in the history and the DVCLive curve (x = ``done`` units)."""
        res = self.evaluator(policy, self.config.eval_episodes, self.config.seed + EVAL_SEED_OFFSET)
        point = EvalPoint(done, self.elapsed(), res.mean, res.std, res.success_rate)
        self.history.append(point)
        if self.live is not None:
            self.live.step = done
            self.live.log_metric("eval/return_mean", res.mean)
            self.live.log_metric("eval/return_std", res.std)
            if res.success_rate is not None:
                self.live.log_metric("eval/success_rate", res.success_rate)
            self.live.make_summary()
        self._last_draw = 0.0
        self.show(done)
        return point

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
        """Final evaluation (unless one was just done), checkpoint and ``metrics.json``.

        ``modules`` must contain the actor under the key ``"policy"``.
        """
        done = env_steps if self.unit == "steps" else gradient_updates
        if not self.history or self.history[-1].done != done:
            self.evaluate(policy, done)
        final = self.history[-1]
        wall = self.elapsed()
        metrics = {
            "algo": self.algo,
            "env_id": self.config.env_id,
            "seed": self.config.seed,
            "eval_return_mean": final.mean,
            "eval_return_std": final.std,
            **({} if final.success_rate is None else {"eval_success_rate": final.success_rate}),
            "eval_episodes": self.config.eval_episodes,
            "env_steps": int(env_steps),
            "gradient_updates": int(gradient_updates),
            "wall_seconds": round(wall, 3),
            **(extra_metrics or {}),
        }
        digest = None
        if self.out_dir is not None:
            meta = {
                "algo": self.algo,
                "env_id": self.config.env_id,
                "action_space": space_to_json(action_space),
                "policy": {"kind": actor.kind, "spec": actor.spec},
                "config": asdict(self.config) if is_dataclass(self.config) else dict(self.config),
                "torch_version": torch.__version__,
            }
            digest = save_checkpoint(self.out_dir, modules, meta)
            metrics["checkpoint_sha256"] = digest
            tmp = self.out_dir / (METRICS_FILE + ".tmp")
            tmp.write_text(json.dumps(metrics, indent=2) + "\n")
            os.replace(tmp, self.out_dir / METRICS_FILE)
        self.close()
        return TrainResult(self.algo, self.config.env_id, metrics, list(self.history), actor, self.out_dir, digest)

    def close(self) -> None:
        if self.progress is not None:
            self.show(self.history[-1].done if self.history else 0)
            self.progress.stop()
            self.progress = None
        if self.live is not None:
            self.live.end()
            self.live = None
