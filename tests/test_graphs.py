"""The offline loop's update stepper: eager on CPU, CUDA graphs on a GPU (those tests run
only where CUDA is present: `bench/cuda_check.py` runs them on a lent GPU)."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlpipe.datasets.loader import load_dataset
from rlpipe.nets.networks import ObsNormalizer
from rlpipe.training.buffer import Batch
from rlpipe.training.graphs import WARMUP_ROUNDS, UpdateStepper, graphs_enabled
from rlpipe.training.optim import adam
from rlpipe.training.sampler import SeedSampler, TransitionSampler
from tests.test_collector import collect_dataset

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def pendulum_data(tmp_path_factory: pytest.TempPathFactory):
    store = tmp_path_factory.mktemp("graphs")
    collect_dataset(store, "Pendulum-v1", "pendulum", fmt="arrow", episodes=5, num_envs=5)
    return load_dataset("pendulum", store)


def test_draw_and_take_are_sample(pendulum_data) -> None:
    a, b = TransitionSampler(pendulum_data, seed=3), TransitionSampler(pendulum_data, seed=3)
    for _ in range(3):
        for x, y in zip(a.sample(64), b.take(b.draw(64))):
            torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_eager_stepper_runs_every_index_once(pendulum_data) -> None:
    seen: list[int] = []
    step = UpdateStepper(lambda _b, i: seen.append(i), TransitionSampler(pendulum_data), 8, total=25)
    done = 0
    while done < 25:
        done += step(done)
    assert done == 25 and seen == list(range(25))


def test_capture_feeds_the_update_batches_shaped_as_eager_ones(pendulum_data, monkeypatch: pytest.MonkeyPatch) -> None:
    """The capture path on a CPU, with torch.cuda's stream and graph calls stubbed: for one seed
    and for stacked seeds ([K, B] draws) the captured update gets batches of the eager shape,
    and each replay's index buffer is shaped as a draw."""
    no_wait = SimpleNamespace(wait_stream=lambda _stream: None)
    monkeypatch.setattr(torch.cuda, "Stream", lambda: no_wait)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: no_wait)
    monkeypatch.setattr(torch.cuda, "stream", lambda _stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "graph", lambda _graph: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: SimpleNamespace(replay=lambda: None))
    for sampler in (TransitionSampler(pendulum_data, seed=1), SeedSampler(TransitionSampler(pendulum_data, seed=1), [0, 1, 2])):
        shapes: list[torch.Size] = []
        step = UpdateStepper(lambda b, _i: shapes.append(b.obs.shape), sampler, 8, total=10, graph=True)
        done = 0
        while done < 10:
            done += step(done)
        assert len(shapes) == WARMUP_ROUNDS + 1 and set(shapes) == {sampler.sample(8).obs.shape}
        assert [index.shape for index in step.indices] == [sampler.draw(8).shape]


def bc_weights(data, device: str, graph: bool, updates: int = 60) -> list[torch.Tensor]:
    """A deterministic update (MSE regression through an observation normaliser, no sampling
    noise): graph and eager must agree."""
    torch.manual_seed(0)
    norm = ObsNormalizer(3).to(device)
    norm.update(torch.as_tensor(np.asarray(data.obs), device=device))
    net = torch.nn.Sequential(norm, torch.nn.Linear(3, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(device)
    opt = adam(net.parameters(), 1e-3)

    def update(b: Batch, _: int) -> None:
        loss = (net(b.obs) - b.actions).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    step = UpdateStepper(update, TransitionSampler(data, device, seed=1), 32, total=updates, graph=graph)
    done = 0
    while done < updates:
        done += step(done)
    assert done == updates
    assert (step.graph is not None) == graph
    return [p.detach().cpu() for p in net.parameters()]


@needs_cuda
def test_graph_replays_match_eager_updates(pendulum_data) -> None:
    for graphed, eager in zip(bc_weights(pendulum_data, "cuda", True), bc_weights(pendulum_data, "cuda", False)):
        torch.testing.assert_close(graphed, eager, rtol=1e-4, atol=1e-5)


@needs_cuda
def test_graph_keeps_the_index_period(pendulum_data) -> None:
    """TD3-style updates (work depends on i % 2) replay with the right parity."""
    counts = torch.zeros(2, device="cuda")

    def update(_b: Batch, i: int) -> None:
        counts[i % 2] += 1.0

    total = WARMUP_ROUNDS * 2 + 2 * 7 + 1  # warm-up, seven replays of two, one eager at the end
    step = UpdateStepper(update, TransitionSampler(pendulum_data, "cuda"), 8, total=total, graph=True, period=2)
    done = 0
    while done < total:
        done += step(done)
    assert done == total and step.graph is not None
    np.testing.assert_array_equal(counts.cpu().numpy(), [total // 2 + 1, total // 2])


def test_graphs_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    assert graphs_enabled(torch.device("cuda")) and not graphs_enabled(torch.device("cpu"))
    monkeypatch.setenv("RLPIPE_CUDA_GRAPHS", "0")
    assert not graphs_enabled(torch.device("cuda"))
