"""Where a run's curve goes: DVCLive (the default), TensorBoard, Weights & Biases (offline).

A run's ``config.loggers`` names its sinks; :class:`rlpipe.training.run.Run` opens them on
the run directory's staging path, so their files are published with the checkpoint or
removed with a failed run, and ends them before the directory is published. TensorBoard
and W&B come with the ``tensorboard`` and ``wandb`` extras; :func:`check_loggers` says
which one is missing before anything is written.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, get_args

from rlpipe.errors import RlpipeError
from rlpipe.training.config import LoggerName

LOGGERS: tuple[str, ...] = get_args(LoggerName)
# The logger -> the package it needs, which the extra of the same name installs.
_EXTRAS = {"tensorboard": "tensorboard", "wandb": "wandb"}


class MetricSink(Protocol):
    """One destination of a run's curve: scalars by name at a step (the run's unit)."""

    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def end(self) -> None: ...


def check_loggers(names: Sequence[str]) -> None:
    """An RlpipeError naming the first logger that is unknown or whose extra is not installed."""
    for name in (names,) if isinstance(names, str) else names:
        if name not in LOGGERS:
            raise RlpipeError(f"unknown logger {name!r}: expected {', '.join(LOGGERS)}")
        if name in _EXTRAS:
            try:
                importlib.import_module(_EXTRAS[name])
            except ImportError:
                raise RlpipeError(f"--logger {name} needs the {name} extra: pip install 'rlpipe[{name}]'") from None


class DvcLiveSink:
    """``dvclive/``: a TSV per metric under ``plots/metrics/`` and ``metrics.json``, which
    ``dvc plots show`` and ``rlpipe report`` read."""

    def __init__(self, run_dir: Path) -> None:
        from dvclive import Live

        class _Live(Live):
            # Outside `dvc repro`, DVCLive would look for (and even `dvc init`) a repo to
            # record experiments; we only want its files, so skip that unless DVC runs us.
            def _init_dvc(self) -> None:
                if os.getenv("DVC_ROOT"):
                    super()._init_dvc()

        self.live = _Live(dir=str(run_dir / "dvclive"), save_dvc_exp=False, dvcyaml=False)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.live.step = step
        for key, value in metrics.items():
            self.live.log_metric(key, value)
        self.live.make_summary()

    def end(self) -> None:
        self.live.end()


class TensorBoardSink:
    """``tensorboard/``: an event file, for ``tensorboard --logdir``."""

    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def end(self) -> None:
        self.writer.close()


class WandbSink:
    """``wandb/offline-run-*/``: an offline W&B run (never the network), which ``wandb sync``
    uploads. Each sink is a run of its own (``reinit="create_new"``), so runs trained together
    in one process (batched seeds) stay apart, and a W&B run of the caller's is left alone."""

    def __init__(self, run_dir: Path, name: str, config: Mapping[str, Any]) -> None:
        import wandb

        self.dir = run_dir / "wandb"
        settings = wandb.Settings(
            silent=True,
            console="off",  # the run's stdout and stderr stay where they are
            symlink=False,  # no `latest-run` links in a run directory
            save_code=False,
            disable_git=True,
            disable_job_creation=True,
            x_disable_stats=True,
            x_disable_meta=True,
            x_disable_machine_info=True,
            x_save_requirements=False,
        )
        self.run = wandb.init(
            mode="offline", dir=str(run_dir), project="rlpipe", name=name, config=dict(config), settings=settings, reinit="create_new"
        )

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def end(self) -> None:
        self.run.finish()
        # wandb-core links its own log (in the user's cache) into the run: a run directory
        # holds its own files only, no link that leads out of it.
        for parent, dirs, files in os.walk(self.dir):
            for name in dirs + files:
                if os.path.islink(os.path.join(parent, name)):
                    os.unlink(os.path.join(parent, name))


def open_sinks(names: Sequence[str], run_dir: Path, run_name: str, config: Mapping[str, Any]) -> list[MetricSink]:
    """The sinks ``names`` writing under ``run_dir``; if one cannot be opened, those opened
    before it are ended and the error raised."""
    check_loggers(names)
    sinks: list[MetricSink] = []
    try:
        for name in names:
            if name == "dvclive":
                sinks.append(DvcLiveSink(run_dir))
            elif name == "tensorboard":
                sinks.append(TensorBoardSink(run_dir))
            else:
                sinks.append(WandbSink(run_dir, run_name, config))
    except BaseException:
        end_sinks(sinks)
        raise
    return sinks


def end_sinks(sinks: Sequence[MetricSink]) -> None:
    """End every sink (each writes its last files), even when one of them fails."""
    errors = []
    for sink in sinks:
        try:
            sink.end()
        except Exception as exc:  # the others still end; the first failure is raised after
            errors.append(exc)
    if errors:
        raise errors[0]


__all__ = ["LOGGERS", "DvcLiveSink", "MetricSink", "TensorBoardSink", "WandbSink", "check_loggers", "end_sinks", "open_sinks"]
