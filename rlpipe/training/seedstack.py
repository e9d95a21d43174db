"""Many seeds of one offline algorithm trained as one batched computation.

K independent runs (seeds) of the same algorithm differ only in their weights, their
minibatches and their random numbers. :class:`SeedStack` stacks the K copies of the
algorithm's modules (``torch.func.stack_module_state``) and runs the algorithm's own
per-seed loss code on all seeds at once with ``torch.vmap`` over ``functional_call``:
every layer becomes one batched matmul over the seeds, so K small updates cost about as
many kernel launches as one. Summing the K losses and calling ``backward`` gives each
seed's gradients in its own slice (the seeds share no weights), and one Adam over the
stacked weights is K Adams (Adam is elementwise). Each seed draws its own minibatches
from its own generator (:class:`rlpipe.training.sampler.SeedSampler`, the same indices as
a separate run of that seed) and its own random numbers (``randomness="different"``).

:func:`train_offline_seeds` is :func:`rlpipe.training.offline.train_offline` for K seeds:
one run directory per seed, written exactly as a separate run writes it.
:func:`train_off_policy_seeds` is :func:`rlpipe.training.offpolicy.train_off_policy` for
K seeds: each seed steps its own envs and fills its own replay buffer, all seeds act and
update together.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, stack_module_state
from torch.utils._pytree import tree_map

from rlpipe.envs.goals import flatten_obs
from rlpipe.envs.stepper import VecStepper
from rlpipe.errors import RlpipeError
from rlpipe.training.buffer import Batch, ReplayBuffer, Update, join_batches
from rlpipe.training.config import OfflineConfig, OnlineConfig, RunConfig
from rlpipe.training.diagnostics import Diagnosed
from rlpipe.training.env import ActionScaler
from rlpipe.training.evaluation import policy_fn
from rlpipe.training.graphs import UpdateStepper, graphs_enabled
from rlpipe.training.offline import Batched, OfflineData, dataset_metrics
from rlpipe.training.offpolicy import (
    OffPolicyConfig,
    OffPolicySetup,
    earned_updates,
    require_off_policy_config,
    run_replay_buffer,
    warmup_actions,
)
from rlpipe.training.optim import mixed_precision
from rlpipe.training.run import Run, TrainResult
from rlpipe.training.sampler import SeedSampler, TransitionSampler


class _Parts(nn.Module):
    """The modules of one seed under their names; calling it runs a function of them, so
    ``functional_call`` can run that function on another seed's weights."""

    def __init__(self, parts: Mapping[str, nn.Module]) -> None:
        super().__init__()
        self.parts = nn.ModuleDict(parts)

    def forward(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)


class SeedStack:
    """K seeds' copies of the same named modules, their weights stacked along a new first
    dimension of size K.

    ``copies[0]``'s modules serve as the template that every :meth:`call` runs on (with
    each seed's weights swapped in); after training, :meth:`unstack` writes every seed's
    weights back into its own copy, for evaluation and checkpoints.
    """

    def __init__(self, copies: Sequence[Mapping[str, nn.Module]]) -> None:
        self.k = len(copies)
        self.copies = [_Parts(parts) for parts in copies]
        self.template = self.copies[0]
        self.params, self.buffers = stack_module_state(self.copies)
        self.device = next(iter(self.params.values())).device

    def parameters(self, part: str) -> list[torch.Tensor]:
        """The stacked weights of module ``part`` ([K, ...] leaves, for an optimiser)."""
        prefix = f"parts.{part}."
        found = [p for name, p in self.params.items() if name.startswith(prefix)]
        if not found:
            raise RlpipeError(f"no module named {part!r} among the stacked seeds")
        return found

    def call(self, fn: Callable[..., Any], *args: Any, train: str | None = None) -> Any:
        """``fn(*args)`` for every seed at once: ``fn`` is per-seed code that reads the
        template's modules; ``args`` (tensors or tuples of them) carry a leading seed
        dimension, and so does every output. Gradients flow only into module ``train``
        (None: into none)."""
        prefix = f"parts.{train}."
        state = {name: p if train is not None and name.startswith(prefix) else p.detach() for name, p in self.params.items()}
        state.update(self.buffers)

        def one_seed(seed_state: dict[str, torch.Tensor], *seed_args: Any) -> Any:
            return functional_call(self.template, seed_state, (fn, *seed_args))

        # Each tensor of ``args`` is split along its seed dimension; an absent field (None) is passed as is.
        in_dims = (0, *(tree_map(lambda leaf: None if leaf is None else 0, arg) for arg in args))
        return torch.vmap(one_seed, in_dims=in_dims, randomness="different")(state, *args)

    @torch.no_grad()
    def unstack(self) -> None:
        """Copy every seed's slice of the stacked weights into that seed's own modules."""
        for k, copy in enumerate(self.copies):
            own = dict(copy.named_parameters()) | dict(copy.named_buffers())
            for name, stacked in (self.params | self.buffers).items():
                own[name].copy_(stacked[k])


def sample_seeds(buffers: Sequence[ReplayBuffer], batch_size: int) -> Batch:
    """A [K, batch_size, ...] minibatch, row k sampled from seed k's buffer with its own generator."""
    return join_batches([buffer.sample(batch_size) for buffer in buffers], torch.stack)


def add_per_seed(runs: Sequence[Run], diagnostics: Diagnosed, finished: Mapping[int, Any]) -> None:
    """Seed k's slice of a batched update's diagnostics ([K] each) to its run, for the seeds not ``finished``."""
    for k, run in enumerate(runs):
        if diagnostics and k not in finished:
            run.diagnostics.add({name: values[k] for name, values in diagnostics.items()})


def check_seed_configs(algo: str, configs: Sequence[RunConfig]) -> None:
    """An RlpipeError unless ``configs`` differ only in their (distinct) seeds and none asks
    for checkpoints to resume from."""
    if len({repr(replace(config, seed=0)) for config in configs}) != 1 or len({c.seed for c in configs}) != len(configs):
        raise RlpipeError(f"{algo}: batched seeds need configs that differ only in their (distinct) seeds")
    if any(config.checkpoint_every is not None for config in configs):
        raise RlpipeError(f"{algo}: batched seeds do not support --checkpoint-every")


def train_offline_seeds(
    algo: str,
    configs: Sequence[OfflineConfig],
    data: OfflineData,
    stack: SeedStack,
    modules: Sequence[dict[str, nn.Module]],
    update: Update,
    out_dirs: Sequence[str | Path | None],
    progress: bool,
    extra_metrics: Callable[[int], dict[str, Any]] | None = None,
) -> list[TrainResult]:
    """Train K seeds (``configs``, equal but for the seed) with ``update``, a batched update
    of ``stack`` on [K, B, ...] minibatches; evaluate and save each seed as
    :func:`rlpipe.training.offline.train_offline` saves one run: ``modules[k]`` are seed
    k's modules to save (among ``stack.copies[k]``'s, with its actor under ``"policy"``),
    ``out_dirs[k]`` its run directory (the progress bar follows seed 0). A seed that reaches its ``stop_at_return`` is finished
    there while the others go on. ``extra_metrics(k)``: seed k's extra metrics.
    Each run's ``wall_seconds`` is the batched training's wall time.
    """
    check_seed_configs(algo, configs)
    if not isinstance(data.sampler, TransitionSampler):
        raise RlpipeError(f"{algo}: batched seeds need the dataset in memory (it is sampled from its memory maps)")
    first = configs[0]
    if not isinstance(first, Batched):
        raise RlpipeError(f"{algo}'s config declares no batch_size")
    runs: list[Run] = []
    actors = [seed_modules["policy"] for seed_modules in modules]
    scaler = ActionScaler(data.action_space)
    policies = [policy_fn(actor, scaler, data.device) for actor in actors]
    sampler = SeedSampler(data.sampler, [config.seed for config in configs])
    update = mixed_precision(update, first.precision, data.device)
    step = UpdateStepper(update, sampler, first.batch_size, first.updates, graph=graphs_enabled(data.device))
    results: dict[int, TrainResult] = {}
    updates = 0
    try:
        for k, (config, out_dir) in enumerate(zip(configs, out_dirs)):
            runs.append(Run(algo, config, out_dir, progress and k == 0))
        while len(results) < len(runs):
            updates += step(updates)
            add_per_seed(runs, step.last, results)
            runs[0].show(updates)
            evaluating = [k for k in range(len(runs)) if k not in results and updates >= runs[k].next_eval]
            if evaluating or updates >= first.updates:
                stack.unstack()
            for k, run in enumerate(runs):
                if k not in results and run.maybe_evaluate(policies[k], updates):
                    extra = {**dataset_metrics(data), **(extra_metrics(k) if extra_metrics else {})}
                    results[k] = run.finish(policies[k], actors[k], modules[k], data.action_space, 0, updates, extra)
        return [results[k] for k in range(len(runs))]
    finally:
        for run in runs:
            run.close()


class _OnlineSeed:
    """One seed's side of batched online training: its envs, replay buffer and update credit,
    as in its own run (rlpipe.training.offpolicy.train_off_policy)."""

    def __init__(self, env: OffPolicySetup, config: OffPolicyConfig, scaler: ActionScaler) -> None:
        self.env, self.config = env, config
        self.stepper = VecStepper(env.envs, scaler, config.seed)
        self.buffer = run_replay_buffer(config, env)
        self.credit = 0.0  # updates earned and not yet run

    @property
    def warming_up(self) -> bool:
        return self.stepper.env_steps < self.config.learning_starts

    def step(self, policy_actions: np.ndarray | None) -> None:
        """Step the envs (uniform random actions from the seed's generator while warming up,
        else ``policy_actions``), store the transitions, earn update credit per transition
        after the warm-up."""
        # policy_actions is None only while every seed warms up
        b = self.stepper.step(warmup_actions(self.env, self.stepper.num_envs) if self.warming_up else cast(np.ndarray, policy_actions))
        self.buffer.store(b)
        self.credit += earned_updates(self.config, self.stepper, b)


def train_off_policy_seeds(
    algo: str,
    configs: Sequence[OnlineConfig],
    setups: Sequence[OffPolicySetup],
    stack: SeedStack,
    modules: Sequence[dict[str, nn.Module]],
    explore: Callable[[np.ndarray], np.ndarray],
    update: Update,
    out_dirs: Sequence[str | Path | None],
    progress: bool,
    extra_metrics: Callable[[int], dict[str, Any]] | None = None,
) -> list[TrainResult]:
    """Train K seeds (``configs``, equal but for the seed) online, as
    :func:`rlpipe.training.offpolicy.train_off_policy` trains one, and save each seed's run.

    Seed k steps ``setups[k]``'s envs (seeded like its own run, with its own generator for
    the warm-up's uniform actions) and fills its own replay buffer, sampled with its own
    generator. ``explore`` maps every seed's observations [K, n, obs_dim] to actions in
    [-1, 1] [K, n, act_dim]; ``update`` updates ``stack`` on [K, B, ...] minibatches, seed k's
    slice from seed k's buffer. ``modules[k]``: seed k's modules to save (its actor under
    ``"policy"``, current after ``stack.unstack()``). All seeds update together: a batched
    update runs when every unfinished seed has earned one (its own run's rule, credits per
    valid transition after ``learning_starts``), so a seed whose episodes end more often
    than another's may trail its own run by a few updates. A finished seed (budget or
    ``stop_at_return``) stops stepping while the others go on.
    """
    check_seed_configs(algo, configs)
    scaler = ActionScaler(setups[0].action_space)
    seeds = [_OnlineSeed(env, require_off_policy_config(algo, config), scaler) for env, config in zip(setups, configs)]
    k_seeds, batch_size = len(configs), seeds[0].config.batch_size
    buffers = [seed.buffer for seed in seeds]
    policies = [
        policy_fn(seed_modules["policy"], scaler, setups[0].device, deterministic=not config.eval_sampled_actions)
        for seed_modules, config in zip(modules, configs)
    ]
    update = mixed_precision(update, configs[0].precision, setups[0].device)
    runs: list[Run] = []
    results: dict[int, TrainResult] = {}
    updates = 0
    try:
        for k, (config, out_dir) in enumerate(zip(configs, out_dirs)):
            runs.append(Run(algo, config, out_dir, progress and k == 0))
        while len(results) < k_seeds:
            active = [seeds[k] for k in range(k_seeds) if k not in results]
            acting = not all(seed.warming_up for seed in active)
            actions = explore(np.stack([flatten_obs(seed.stepper.obs) for seed in seeds])) if acting else [None] * k_seeds
            for k in range(k_seeds):
                if k not in results:
                    seeds[k].step(actions[k])
            earned = int(min(seed.credit for seed in active))
            for _ in range(earned):
                add_per_seed(runs, update(sample_seeds(buffers, batch_size), updates), results)
                updates += 1
            for seed in seeds:
                seed.credit -= earned
            runs[0].show(seeds[0].stepper.env_steps, seeds[0].stepper.last_return)
            if any(seeds[k].stepper.env_steps >= min(runs[k].next_eval, runs[k].total) for k in range(k_seeds) if k not in results):
                stack.unstack()
            for k in range(k_seeds):
                stepper = seeds[k].stepper
                if k not in results and runs[k].maybe_evaluate(policies[k], stepper.env_steps):
                    extra = {"train_episodes": stepper.episodes, **(extra_metrics(k) if extra_metrics else {})}
                    results[k] = runs[k].finish(
                        policies[k], modules[k]["policy"], modules[k], setups[k].action_space, stepper.env_steps, updates, extra
                    )
        return [results[k] for k in range(k_seeds)]
    finally:
        for run in runs:
            run.close()
        for env in setups:
            env.envs.close()
