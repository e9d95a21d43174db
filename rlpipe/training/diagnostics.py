"""What a run learns, logged beside its curve.

An update returns its diagnostics (losses, value estimates, temperatures) as detached scalar
tensors by name, or None. :class:`Diagnostics` sums them where they live (one small add per
value and update, no host sync, so a CUDA update keeps its pace) and at each evaluation
:class:`rlpipe.training.run.Run` writes their means since the last one under ``train/``, with
the run's units per second, to every logger (DVCLive, TensorBoard, W&B).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping

import torch

# What an update returns: its diagnostics by name (scalar tensors), or None for none.
Diagnosed = Mapping[str, torch.Tensor] | None


class Diagnostics:
    """Running sums of the diagnostics updates return, by name (see the module doc)."""

    def __init__(self, unit: str) -> None:
        self.unit = unit
        self._sums: dict[str, torch.Tensor] = {}
        self._counts: dict[str, int] = {}
        self._since, self._done_since = time.perf_counter(), 0

    def add(self, values: Diagnosed) -> None:
        """Add one update's diagnostics (None: it reported none)."""
        if not values:
            return
        for name, value in values.items():
            held = self._sums.get(name)
            if held is None:
                self._sums[name], self._counts[name] = value.detach().float().clone(), 1
            else:  # in place: no new tensor per update
                held.add_(value.detach())
                self._counts[name] += 1

    def take(self, done: int) -> dict[str, float]:
        """The means since the last call under ``train/``, and ``train/<unit>_per_s`` (``done``:
        the run's units so far), then start afresh. A non-finite mean is left out, so the
        curve's files stay standard JSON; its absence marks the diverged value."""
        now = time.perf_counter()
        means = {f"train/{name}": float(total / self._counts[name]) for name, total in self._sums.items()}
        taken = {name: value for name, value in means.items() if math.isfinite(value)}
        if done > self._done_since:
            taken[f"train/{self.unit}_per_s"] = (done - self._done_since) / max(now - self._since, 1e-9)
        self._sums, self._counts = {}, {}
        self._since, self._done_since = now, done
        return taken
