"""One offline training run across processes: data parallelism over torch.distributed.

``rlpipe train ALGO --dataset D --nproc N`` starts N processes (ranks) with torch's elastic
launcher (what ``torchrun`` runs; a run started by ``torchrun`` itself, or by Ray Train, joins
the same way). Every rank holds the same networks and optimisers; each update:

- every rank draws the same global batch of indices (one seeded generator, the one a
  single-process run uses) and gathers only its own contiguous share, ``batch_size / N`` rows,
  from the dataset (read-only memory maps: pages the ranks share, see `rlpipe.training.offline`);
- each backward pass's gradients are averaged over the ranks before the optimiser steps
  (`rlpipe.training.optim.optimizer_step`), so every optimiser, target network and learned
  temperature stays identical on every rank.

That is DistributedDataParallel's rule (an average of the ranks' gradients of their shards'
mean losses) applied at the optimiser rather than by wrapping modules: rlpipe's algorithms step
several optimisers on different parameter subsets per update (actor, critics, α, a VAE), update
target networks by Polyak averaging, and run some losses on no-grad targets, which DDP's
module wrapper handles only with ``find_unused_parameters`` and one wrapper per network. Rank 0
alone evaluates, logs, checkpoints and writes the run directory; a batch statistic (TD3+BC's
Q scale, a diagnostic) is each rank's own shard's.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from rlpipe.errors import RlpipeError
from rlpipe.training.buffer import Batch
from rlpipe.training.config import FinetuneFields, OfflineConfig, RunConfig

# A rank's global RNG (exploration noise, sampled actions) is seeded seed + this * rank: rank 0
# draws what a single-process run draws, the others streams of their own.
RANK_SEED_OFFSET = 50_000
# How long a rank waits for the others at a collective before the run ends with an error: rank
# 0's evaluations (100 held-out episodes) run while the others wait.
COLLECTIVE_TIMEOUT = timedelta(minutes=30)
_made_here: list[bool] = []  # whether join() made the process group (then leave() ends it)


@dataclass(frozen=True)
class Ranks:
    """This process's place in a run: ``rank`` of ``size`` (0 of 1 outside a distributed run)."""

    rank: int = 0
    size: int = 1

    @property
    def main(self) -> bool:
        """Whether this rank evaluates, logs and writes the run (rank 0)."""
        return self.rank == 0

    @property
    def parallel(self) -> bool:
        return self.size > 1


def ranks() -> Ranks:
    """The current process's ranks: from torch.distributed's process group once joined."""
    if dist.is_available() and dist.is_initialized():
        return Ranks(dist.get_rank(), dist.get_world_size())
    return Ranks()


def launched_size() -> int:
    """The number of processes a launcher (torchrun, rlpipe's ``--nproc``) started this one
    among: ``WORLD_SIZE``, or 1 when no launcher set it."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise RlpipeError(f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} is not a number of processes") from None


def launched_rank() -> int:
    """This process's rank as its launcher numbered it (``RANK``; 0 without a launcher)."""
    return int(os.environ.get("RANK", "0"))


def join(nproc: int, device: str) -> Ranks:
    """Join the run's process group when ``nproc`` > 1 (gloo on CPU, NCCL on CUDA, each rank on
    the GPU of its ``LOCAL_RANK``); a group Ray Train or a caller already made is used as it is.
    An RlpipeError when ``nproc`` disagrees with the processes launched."""
    if nproc == 1:
        return Ranks()
    if dist.is_initialized():
        joined = ranks()
    else:
        launched = launched_size()
        if launched == 1:
            raise RlpipeError(f"nproc={nproc} needs {nproc} processes: run `rlpipe train ... --nproc {nproc}` (or torchrun)")
        if launched != nproc:
            raise RlpipeError(f"nproc={nproc}, but {launched} processes were launched (WORLD_SIZE)")
        cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if cuda else "gloo", timeout=COLLECTIVE_TIMEOUT)
        _made_here.append(True)
        joined = ranks()
    if joined.size != nproc:
        raise RlpipeError(f"nproc={nproc}, but the process group has {joined.size} ranks")
    return joined


def leave() -> None:
    """Leave the process group :func:`join` made (at the end of a run, on every rank); one
    made by Ray Train or the caller is theirs to end."""
    if _made_here and dist.is_initialized():
        dist.destroy_process_group()
    _made_here.clear()


def average_gradients(optimizer: torch.optim.Optimizer) -> None:
    """Replace the gradient of each of ``optimizer``'s parameters by its mean over the ranks:
    one all-reduce of the gradients flattened into one buffer. Outside a distributed run it
    does nothing (and reads nothing: it runs at every optimiser step)."""
    size = ranks().size
    if size == 1:
        return
    grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if not grads:
        return
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat)
    flat /= size
    for grad, mean in zip(grads, _unflatten_dense_tensors(flat, grads)):
        grad.copy_(mean)


def broadcast_modules(modules: Mapping[str, nn.Module]) -> None:
    """Give every rank rank 0's parameters and buffers (normalisers' statistics included)."""
    for module in modules.values():
        tensors = list(module.state_dict(keep_vars=True).values())
        for tensor in tensors:
            dist.broadcast(tensor.data, 0)


def agree(flag: bool) -> bool:
    """Rank 0's ``flag`` on every rank (whether to stop: only rank 0 evaluates)."""
    value = torch.tensor([int(flag)], device="cuda" if dist.get_backend() == "nccl" else "cpu")  # NCCL moves CUDA tensors only
    dist.broadcast(value, 0)
    return bool(value.item())


def gather_to_main(value: Any) -> list[Any] | None:
    """Every rank's ``value`` (picklable) in rank order on rank 0; None on the others."""
    size = ranks().size
    gathered: list[Any] | None = [None] * size if ranks().main else None
    dist.gather_object(value, gathered, dst=0)
    return gathered


class RankShard:
    """A sampler's batches split over the ranks: each rank draws the global batch of indices
    (the wrapped sampler's generator, seeded alike on every rank) and gathers its contiguous
    share, so N ranks together train on the batches one process would draw."""

    def __init__(self, sampler: Any, ranks: Ranks) -> None:
        self.sampler, self.ranks = sampler, ranks
        self.device = sampler.device
        self.size = sampler.size

    def share(self, batch_size: int) -> int:
        """Rows per rank (`require_data_parallel` refused a batch that does not divide)."""
        return batch_size // self.ranks.size

    def draw(self, batch_size: int) -> torch.Tensor:
        """This rank's indices of the next global batch of ``batch_size``."""
        share = self.share(batch_size)
        return self.sampler.draw(batch_size).narrow(-1, self.ranks.rank * share, share)

    def take(self, index: torch.Tensor) -> Batch | Any:
        return self.sampler.take(index)

    def sample(self, batch_size: int) -> Batch | Any:
        return self.take(self.draw(batch_size))

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)


# Offline algorithms whose batches are not drawn by index from the dataset alone.
NOT_SHARDABLE = {"mopo": "its batches mix the dataset with model rollouts"}


def require_data_parallel(algo: str, config: RunConfig) -> None:
    """Refuse, before any process starts, a data-parallel run of what cannot be split: an
    algorithm in `NOT_SHARDABLE`, offline-to-online fine-tuning (one env, one buffer), or a
    batch that does not divide among the ranks. Only offline runs have ``nproc``."""
    if not isinstance(config, OfflineConfig) or config.nproc == 1:
        return
    nproc = config.nproc
    batch_size = getattr(config, "batch_size", nproc)  # the dynamics ensemble's run has none
    if batch_size % nproc:
        raise RlpipeError(f"batch_size={batch_size} is not divisible by nproc={nproc}")
    if algo in NOT_SHARDABLE:
        raise RlpipeError(f"{algo} cannot train with nproc > 1: {NOT_SHARDABLE[algo]}")
    if isinstance(config, FinetuneFields) and config.finetune_env_steps:
        raise RlpipeError(f"{algo} with nproc > 1: fine-tuning online is not supported across processes")


def launch(nproc: int, module: str, args: Sequence[str]) -> None:
    """Run ``python -m MODULE ARGS`` as ``nproc`` ranks on this machine with torch's elastic
    launcher (torchrun's), and wait. A rank that fails ends the others; that is one
    RlpipeError naming the first failed rank and its exit code."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"rlpipe-{os.getpid()}",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=0.5,
    )
    # The launcher logs each rank's end (and a failure's traceback) at WARNING: the one line below says it.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    try:
        elastic_launch(config, sys.executable)("-m", module, *args)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        raise RlpipeError(f"rank {rank} of {nproc} exited with code {failure.exitcode}; the run stopped") from None
    except SignalException as exc:  # the launcher itself was signalled: it ended the ranks
        raise RlpipeError(f"stopped by signal {exc.sigval.value}; the ranks were ended") from None
