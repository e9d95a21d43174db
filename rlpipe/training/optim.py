"""Optimiser and target-network helpers shared by the algorithms."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, TypeVar

import torch
from torch import nn

from rlpipe.training.config import Precision
from rlpipe.training.distributed import average_gradients

ModuleT = TypeVar("ModuleT", bound=nn.Module)
UpdateT = TypeVar("UpdateT", bound=Callable[..., Any])


def adam(params: Iterable[torch.Tensor], lr: float, eps: float = 1e-8) -> torch.optim.Adam:
    """Adam with the fused kernel (one op for all parameters: far less per-step overhead);
    on CUDA capturable, so its steps can be part of a CUDA graph."""
    params = list(params)
    return torch.optim.Adam(params, lr=lr, eps=eps, fused=True, capturable=params[0].is_cuda)


def autocast(precision: Precision, device: torch.device) -> AbstractContextManager[Any]:
    """The arithmetic of ``precision`` on ``device`` for the code it encloses: nothing for fp32;
    for bf16 ``torch.autocast`` (matrix products in bfloat16, weights and optimiser state in
    float32; output layers stay float32: :class:`rlpipe.nets.networks.Float32Linear`). No
    cast cache: an update steps its optimisers between forward passes, and a cached bfloat16
    copy of a weight would outlive the step."""
    if precision == "fp32":
        return nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False)


def mixed_precision(update: UpdateT, precision: Precision, device: torch.device) -> UpdateT:
    """``update`` run under :func:`autocast` (itself for fp32)."""
    if precision == "fp32":
        return update

    def update_in_precision(*args: Any) -> Any:
        with autocast(precision, device):
            return update(*args)

    return update_in_precision  # type: ignore[return-value]


class CosineLR:
    """``optimizer``'s learning rate annealed from its initial value to 0 over ``total`` steps
    along a half cosine (the closed form of torch's ``CosineAnnealingLR``, which CORL's and
    d3rlpy's IQL step after each actor update): call :meth:`step` after each optimizer step.
    The rate is a tensor updated in place from the optimizer's own step count, so a CUDA
    graph replaying the update follows it and a resumed run (its optimizer state restored)
    goes on where it stopped."""

    def __init__(self, optimizer: torch.optim.Optimizer, total: int) -> None:
        group = optimizer.param_groups[0]
        self.optimizer, self.total, self.initial = optimizer, total, float(group["lr"])
        group["lr"] = torch.tensor(self.initial, device=group["params"][0].device)

    def step(self) -> None:
        group = self.optimizer.param_groups[0]
        done = self.optimizer.state[group["params"][0]]["step"]
        progress = (done / self.total).clamp(max=1.0)
        group["lr"].copy_(0.5 * self.initial * (1.0 + torch.cos(math.pi * progress)))


def target_copy(module: ModuleT) -> ModuleT:
    """A frozen copy of ``module`` to be tracked with :func:`polyak_update`."""
    target = copy.deepcopy(module)
    target.requires_grad_(False)
    return target


def optimizer_step(optimizer: torch.optim.Optimizer, loss: torch.Tensor, max_grad_norm: float | None = None) -> None:
    """One gradient step of ``optimizer`` on ``loss``; with ``max_grad_norm`` the gradient of
    all the optimizer's parameters is first clipped to that total norm. In a data-parallel run
    the gradients are first averaged over the ranks (`rlpipe.training.distributed`)."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    average_gradients(optimizer)
    if max_grad_norm is not None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm, foreach=True)
    optimizer.step()


@torch.no_grad()
def polyak_update(target: nn.Module | Sequence[torch.Tensor], source: nn.Module | Sequence[torch.Tensor], tau: float) -> None:
    """target <- (1 - tau) * target + tau * source, in one fused call (modules or their
    parameters as tensor lists, e.g. stacked seeds' weights)."""

    def tensors(x: nn.Module | Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return list(x.parameters()) if isinstance(x, nn.Module) else list(x)

    torch._foreach_lerp_(tensors(target), tensors(source), tau)


@contextmanager
def frozen(params: list[torch.nn.Parameter]) -> Iterator[None]:
    """Temporarily stop gradients into ``params`` (e.g. the critic during the actor update)."""
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)
