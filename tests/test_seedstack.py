"""Batched seeds (rlpipe.training.seedstack): K seeds' CQL and SAC updates on stacked weights
equal K separate updates on the same minibatches, a batched SAC run is K separate runs given
the same random numbers, and ``rlpipe sweep --batched`` writes the run directories separate
runs write. (Returns of 15 seeds batched and separate: bench/batched_seeds.py --returns.)"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from rlpipe.algos import get_algo
from rlpipe.algos.cql import ACTION_SPACES, batched_continuous_cql, batched_discrete_cql, continuous_cql, discrete_cql
from rlpipe.algos.sac import make_agent, make_stacked_agent
from rlpipe.commands.collect import collect_dataset
from rlpipe.commands.runs import prepare_run
from rlpipe.commands.sweep import SweepSpec, plan_trials, run_sweep, run_trial
from rlpipe.errors import RlpipeError
from rlpipe.training.buffer import Batch
from rlpipe.training.graphs import UpdateStepper
from rlpipe.training.offline import Learner, load_offline
from rlpipe.training.sampler import SeedSampler
from rlpipe.training.seeding import seed_everything

SEEDS = [0, 1, 2]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (bench/cuda_check.py runs it on a lent GPU)")
TINY = {"hidden": (16, 16), "batch_size": 8, "num_sampled_actions": 2, "updates": 6, "eval_every": 3, "eval_episodes": 1}
SAC_TINY = {
    "hidden": (16, 16),
    "batch_size": 8,
    "env_steps": 240,
    "learning_starts": 200,
    "eval_every": 120,
    "eval_episodes": 1,
    "heldout_eval_episodes": 1,
}


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    store = tmp_path_factory.mktemp("seedstack")
    collect_dataset("Pendulum-v1", episodes=2, name="pendulum-random", store=store, progress=False)
    collect_dataset("CartPole-v1", episodes=4, name="cartpole-random", store=store, progress=False)
    return store


def _fixed_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replace the update's random draws by fixed numbers: the batched and the separate
    updates then must agree up to float rounding (their real draws come from different streams)."""

    def pattern(shape: tuple[int, ...], device: torch.device | None) -> torch.Tensor:
        return (torch.arange(math.prod(shape), dtype=torch.float32, device=device).view(shape) * 0.618).frac()

    monkeypatch.setattr(torch, "randn_like", lambda t: pattern(tuple(t.shape), t.device) * 2.0 - 1.0)
    monkeypatch.setattr(torch, "rand", lambda *shape, device=None: pattern(tuple(shape), device))


def _weights(mods: dict[str, torch.nn.Module]) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for name in sorted(mods) for p in mods[name].parameters()])


def _batched_and_separate(store: Path, dataset: str, device: str) -> tuple[Any, list[dict[str, torch.nn.Module]], Any, list[Learner], Any]:
    """The batched CQL of SEEDS and each seed's own CQL (seeded, then built as its run builds
    it), checked to start from the same weights: (stack, its seeds' modules, its update,
    the separate `Learner` per seed, the loaded data)."""
    configs = [prepare_run("cql", dataset=dataset, store=store, settings={**TINY, "seed": s, "device": device}).config for s in SEEDS]
    data = load_offline("cql", configs[0], ACTION_SPACES)
    batched, separate = (batched_discrete_cql, discrete_cql) if data.discrete else (batched_continuous_cql, continuous_cql)
    stack, modules, update, _ = batched(configs, data)
    eager = []
    for config in configs:
        seed_everything(config.seed)
        eager.append(separate(config, data))
    for copy, learner in zip(modules, eager):
        for name, own in learner.modules.items():
            torch.testing.assert_close(dict(copy[name].named_parameters()), dict(own.named_parameters()), rtol=0, atol=0)
    return stack, modules, update, eager, data


def _check_seeds_apart(modules: list[dict[str, torch.nn.Module]], separate: list[dict[str, torch.nn.Module]]) -> None:
    """The batched seeds' modules equal each separately trained seed's, and differ from each other."""
    for k, own in enumerate(separate):
        torch.testing.assert_close(_weights(modules[k]), _weights(own), rtol=1e-4, atol=1e-5)
    # Control: the seeds trained apart from each other (a mix-up of seeds would not match).
    assert not torch.allclose(_weights(modules[0]), _weights(separate[1]), atol=1e-3)
    assert not torch.allclose(_weights(modules[1]), _weights(modules[2]), atol=1e-3)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
@pytest.mark.parametrize("dataset", ["pendulum-random", "cartpole-random"])
def test_batched_updates_equal_separate_updates_per_seed(
    tiny_store: Path, monkeypatch: pytest.MonkeyPatch, dataset: str, device: str
) -> None:
    stack, modules, update, eager, data = _batched_and_separate(tiny_store, dataset, device)
    _fixed_noise(monkeypatch)
    sampler = SeedSampler(data.sampler, SEEDS)
    for i in range(3):
        b = sampler.sample(8)
        update(b, i)
        for k, learner in enumerate(eager):
            learner.update(b.map_columns(lambda t: t[k]), i)
    stack.unstack()
    _check_seeds_apart(modules, [learner.modules for learner in eager])


@needs_cuda
def test_batched_updates_replay_as_a_cuda_graph(tiny_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stack, modules, update, eager, data = _batched_and_separate(tiny_store, "pendulum-random", "cuda")
    _fixed_noise(monkeypatch)
    step = UpdateStepper(update, SeedSampler(data.sampler, SEEDS), 8, total=6, graph=True)
    done = 0
    while done < 6:  # eager warm-up rounds, capture, then replays
        done += step(done)
    assert step.graph is not None
    twin = SeedSampler(data.sampler, SEEDS)  # the same draws in the same order
    for i in range(6):
        b = twin.sample(8)
        for k, learner in enumerate(eager):
            learner.update(b.map_columns(lambda t: t[k]), i)
    stack.unstack()
    _check_seeds_apart(modules, [learner.modules for learner in eager])


@pytest.mark.parametrize("algo", ["cql", "sac"])
def test_batched_sweep_writes_the_run_directories_of_separate_runs(tiny_store: Path, tmp_path: Path, algo: str) -> None:
    if algo == "cql":
        spec, updates = SweepSpec("cql", dataset="pendulum-random", store=str(tiny_store), fixed=TINY), TINY["updates"]
    else:  # Pendulum's episodes all end at 200 steps: the seeds keep in step, each earns its own run's updates
        spec, updates = SweepSpec("sac", env_id="Pendulum-v1", fixed=SAC_TINY), SAC_TINY["env_steps"] - SAC_TINY["learning_starts"]
    summary = run_sweep(spec, {}, [0, 1], tmp_path / "batched", batched=True)
    assert summary["settings"]["default"]["seeds"] == 2
    separate = plan_trials({}, [0], tmp_path / "separate")[0]
    alone = run_trial(spec, separate)
    together_dir = tmp_path / "batched" / "runs" / "default" / "seed-0"
    together = json.loads((together_dir / "metrics.json").read_text())
    assert set(together) == set(alone)
    assert together["gradient_updates"] == alone["gradient_updates"] == updates
    assert sorted(p.relative_to(together_dir).as_posix() for p in together_dir.rglob("*")) == sorted(
        p.relative_to(separate.run_dir).as_posix() for p in separate.run_dir.rglob("*")
    )
    seed_1 = json.loads((tmp_path / "batched" / "runs" / "default" / "seed-1" / "metrics.json").read_text())
    assert seed_1["seed"] == 1 and seed_1["checkpoint_sha256"] != together["checkpoint_sha256"]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_batched_sac_updates_and_actions_equal_separate_ones_per_seed(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    configs = [prepare_run("sac", env_id="Pendulum-v1", settings={**SAC_TINY, "seed": s, "device": device}).config for s in SEEDS]
    env = SimpleNamespace(obs_dim=3, act_dim=1, device=torch.device(device))
    stacked, update = make_stacked_agent(configs, env)
    agents = []
    for config in configs:  # each seed's own run: seeded, then its agent built
        seed_everything(config.seed)
        agents.append(make_agent(config, env))
    for copy, agent in zip(stacked.modules(), agents):
        assert _weights(copy).equal(_weights(agent.modules))
    draws = torch.Generator().manual_seed(0)
    k, batch = len(SEEDS), 8
    batches = [
        Batch(
            torch.randn(k, batch, 3, generator=draws),
            torch.rand(k, batch, 1, generator=draws) * 2 - 1,
            torch.randn(k, batch, generator=draws),
            torch.randn(k, batch, 3, generator=draws),
            (torch.rand(k, batch, generator=draws) < 0.2).float(),
        )
        for _ in range(3)
    ]
    batches = [b.map_columns(lambda t: t.to(device)) for b in batches]
    obs = torch.randn(k, 2, 3, generator=draws).numpy()
    _fixed_noise(monkeypatch)
    for i, b in enumerate(batches):
        update(b, i)
        for seed, agent in enumerate(agents):
            agent.update(b.map_columns(lambda t: t[seed]), i)
    stacked.stack.unstack()
    _check_seeds_apart(stacked.modules(), [agent.modules for agent in agents])
    for seed, agent in enumerate(agents):
        assert stacked.seeds[seed].alpha() == pytest.approx(agent.extra_metrics()["alpha"], rel=1e-5)
        torch.testing.assert_close(stacked.explore(obs)[seed], agent.explore(obs[seed], None, 0), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_batched_sac_run_is_the_separate_runs_given_the_same_random_numbers(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    """With the policies' noise fixed, K seeds trained together (own envs, warm-up actions,
    replay buffers and minibatches per seed) end with the weights of K separate runs: the
    batched run differs from separate runs only in which normal draws each seed gets, so
    its returns have the separate runs' distribution."""
    sac = get_algo("sac")
    configs = [sac.make_config("Pendulum-v1", seed=s, device=device, **SAC_TINY) for s in (0, 1)]
    _fixed_noise(monkeypatch)
    together = sac.train_seeds(configs, [None, None], progress=False)
    apart = [sac.train(config, progress=False) for config in configs]
    for batched, alone in zip(together, apart):
        assert batched.metrics["gradient_updates"] == alone.metrics["gradient_updates"] == 40
        torch.testing.assert_close(_weights({"policy": batched.policy}), _weights({"policy": alone.policy}), rtol=1e-4, atol=1e-5)
        assert batched.metrics["eval_return_mean"] == pytest.approx(alone.metrics["eval_return_mean"], rel=1e-4)
    # Control: the two seeds' runs differ (a seed mix-up would not match).
    assert not torch.allclose(_weights({"policy": together[0].policy}), _weights({"policy": apart[1].policy}), atol=1e-3)


def test_batched_sweep_is_refused_for_an_algorithm_without_it(tiny_store: Path, tmp_path: Path) -> None:
    spec = SweepSpec("bc", dataset="pendulum-random", store=str(tiny_store), fixed={"updates": 2})
    with pytest.raises(RlpipeError, match="cannot train seeds batched"):
        run_sweep(spec, {}, [0, 1], tmp_path / "bc", batched=True)
    assert not (tmp_path / "bc").exists()
