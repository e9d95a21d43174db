"""Offline updates replayed as a CUDA graph.

On a GPU the updates of small networks wait on kernel launches and Python, not on
arithmetic: a CQL update at 256x256 is a few hundred small kernels. Captured once as a CUDA
graph, each later update is one launch. The minibatch indices are drawn eagerly with the
sampler's own generator (the same draws as without the graph) and copied into the graph's
index buffers; everything else (gathering the batch, the losses, the optimiser steps with
capturable Adam, the target averaging) is captured. Random numbers inside the update come
from the default CUDA generator, which graphs advance on every replay.

An update whose work depends on its index (TD3+BC's delayed actor: ``i % policy_delay``)
is captured over one period of indices, ``period`` updates per replay.
"""

from __future__ import annotations

import os

import torch

from rlpipe.errors import RlpipeError
from rlpipe.training.buffer import Update
from rlpipe.training.diagnostics import Diagnosed
from rlpipe.training.sampler import SeedSampler, TransitionSampler

WARMUP_ROUNDS = 3  # eager rounds before capture: optimiser state, cuBLAS workspaces, allocator


def graphs_enabled(device: torch.device) -> bool:
    """CUDA graphs on a CUDA device unless ``RLPIPE_CUDA_GRAPHS=0``."""
    return device.type == "cuda" and os.environ.get("RLPIPE_CUDA_GRAPHS", "1") != "0"


class UpdateStepper:
    """Runs a training loop's next updates: ``stepper(done)`` performs one or more updates
    (``done`` is the number already performed) and returns how many it performed.

    Eager by default; with ``graph=True`` the first call runs ``WARMUP_ROUNDS * period``
    eager updates on a side stream and captures ``period`` updates as one CUDA graph, later
    calls replay it; an update that cannot be captured is an RlpipeError naming the way
    out (``RLPIPE_CUDA_GRAPHS=0``). Never goes past ``total`` updates.
    """

    def __init__(
        self, update: Update, sampler: TransitionSampler | SeedSampler, batch_size: int, total: int, graph: bool = False, period: int = 1
    ) -> None:
        self.update, self.sampler, self.batch_size, self.total = update, sampler, batch_size, total
        self.period = max(1, period)
        self.use_graph = graph
        self.graph: torch.cuda.CUDAGraph | None = None
        self.indices: list[torch.Tensor] = []
        # The diagnostics of the updates just run (a graph's: its captured outputs, which each replay refreshes).
        self.last: Diagnosed = None

    def __call__(self, done: int) -> int:
        left = self.total - done
        if self.graph is not None and left >= self.period:
            for index in self.indices:
                index.copy_(self.sampler.draw(self.batch_size))
            self.graph.replay()
            return self.period
        # Capture at an index that is a multiple of the period, so the captured indices
        # 0..period-1 stand for done..done+period-1.
        if self.use_graph and self.graph is None and left >= WARMUP_ROUNDS * self.period and done % self.period == 0:
            return self._warm_up_and_capture(done)
        self.last = self.update(self.sampler.sample(self.batch_size), done)
        return 1

    def _warm_up_and_capture(self, done: int) -> int:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for i in range(WARMUP_ROUNDS * self.period):
                index = self.sampler.draw(self.batch_size)  # sample() is take(draw()): the same draws
                self.update(self.sampler.take(index), done + i)
        torch.cuda.current_stream().wait_stream(stream)
        # Index buffers filled before each replay (drawing here would skip draws), shaped as a
        # draw: (batch,) for one seed, (seeds, batch) for a SeedSampler.
        self.indices = [torch.zeros_like(index) for _ in range(self.period)]
        graph = torch.cuda.CUDAGraph()
        try:
            captured: dict[str, torch.Tensor] = {}
            with torch.cuda.graph(graph):
                for i, index in enumerate(self.indices):
                    captured.update(self.update(self.sampler.take(index), i) or {})
            self.last = captured or None
        except RuntimeError as exc:
            # No eager fallback: a failed capture leaves the CUDA RNG in capture mode.
            raise RlpipeError(
                f"CUDA graph capture of the update failed ({str(exc).splitlines()[0]}); "
                "run with RLPIPE_CUDA_GRAPHS=0 to train without CUDA graphs"
            ) from exc
        self.graph = graph
        return WARMUP_ROUNDS * self.period
