"""TD targets of every value-based algorithm against hand computations.

Each batch has three rows: an ordinary step, a terminated step (no bootstrap) and a step
truncated by the time limit (stored with terminated = 0, so it bootstraps from the real
final observation). Networks are stubs whose outputs are simple functions of their
inputs, so each expected target is written out by hand. Then the real update functions
are checked end to end: the next observation of a terminated row cannot change an update,
that of a truncated row must. Also TD3's policy delay and target smoothing, IQL's weight
clip, and BCQ's max over candidates.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch import nn

from rlpipe.algos import ddpg, get_algo, sac, td3
from rlpipe.algos.bcq import bcq_target
from rlpipe.algos.cql import continuous_cql, discrete_cql, dqn_target
from rlpipe.algos.ddpg import ddpg_target
from rlpipe.algos.iql import awr_weights, q_target
from rlpipe.algos.rebrac import behaviour_penalty
from rlpipe.algos.sac import SoftActorCritic, Temperature
from rlpipe.algos.td3 import smoothed_next_action, td3_target, td3_update
from rlpipe.algos.td3_bc import td3_bc_actor_loss
from rlpipe.datasets.loader import TransitionArrays
from rlpipe.envs.stepper import StepBatch
from rlpipe.nets.networks import DeterministicActor, EnsembleQ
from rlpipe.training.buffer import Batch, ReplayBuffer
from rlpipe.training.offpolicy import OffPolicySetup
from rlpipe.training.sampler import TransitionSampler

GAMMA = 0.9
OBS_SPACE = spaces.Box(-1.0, 1.0, (3,), dtype=np.float32)  # the stand-in datasets' flat observations
TERMINATED_ROW, TRUNCATED_ROW = 1, 2


def hand_batch(actions: torch.Tensor | None = None) -> Batch:
    """Rows: ordinary (s'_0 = 1), terminated (s'_0 = 2), truncated (s'_0 = 3, terminated 0)."""
    next_obs = torch.tensor([[1.0, 0.0, 0.0], [2.0, 0.0, 0.0], [3.0, 0.0, 0.0]])
    actions = torch.tensor([[0.1], [-0.2], [0.3]]) if actions is None else actions
    return Batch(torch.zeros(3, 3), actions, torch.tensor([1.0, -2.0, 0.5]), next_obs, torch.tensor([0.0, 1.0, 0.0]))


class ConstActor(nn.Module):
    """mu(s) = value for every state."""

    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.full((obs.shape[0], 1), self.value)


class TwinQ(nn.Module):
    """Q_1(s, a) = s_0 + a, Q_2(s, a) = 2 s_0 - a, stacked [2, B] like EnsembleQ."""

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return torch.stack([obs[:, 0] + action[:, 0], 2 * obs[:, 0] - action[:, 0]])


def test_ddpg_target() -> None:
    critic = lambda s, a: (10 * s[:, 0] + a[:, 0])[None]  # noqa: E731  one critic, [1, B]
    target = ddpg_target(ConstActor(0.5), critic, hand_batch(), GAMMA)
    # Q'(s', mu'(s')) = 10 s'_0 + 0.5: 10.5 and 30.5 where bootstrapped.
    torch.testing.assert_close(target, torch.tensor([1 + 0.9 * 10.5, -2.0, 0.5 + 0.9 * 30.5]))


def test_td3_target_takes_the_min_of_the_twins() -> None:
    config = SimpleNamespace(gamma=GAMMA, target_noise=0.0, target_noise_clip=0.5)
    target = td3_target(ConstActor(0.5), TwinQ(), hand_batch(), config)
    # min(s'_0 + 0.5, 2 s'_0 - 0.5): 1.5 at s'_0 = 1, 3.5 at s'_0 = 3.
    torch.testing.assert_close(target, torch.tensor([1 + 0.9 * 1.5, -2.0, 0.5 + 0.9 * 3.5]))


def test_rebrac_target_subtracts_the_next_action_penalty() -> None:
    config = SimpleNamespace(gamma=GAMMA, target_noise=0.0, target_noise_clip=0.5)  # a'_pi = mu'(s') = 0.5 exactly
    batch = hand_batch()._replace(next_actions=torch.tensor([[0.5], [0.0], [-0.5]]))  # the dataset's a'
    target = td3_target(ConstActor(0.5), TwinQ(), batch, config, lambda b, a: behaviour_penalty(a, b.next_actions, 2.0))
    # min(s'_0 + 0.5, 2 s'_0 - 0.5) = 1.5, 3.5 as TD3's, less 2 (0.5 - a')^2: 0 (a' = 0.5) and 2 (a' = -0.5).
    torch.testing.assert_close(target, torch.tensor([1 + 0.9 * 1.5, -2.0, 0.5 + 0.9 * (3.5 - 2.0)]))


def test_td3_target_smoothing_clips_noise_and_actions() -> None:
    torch.manual_seed(0)
    obs = torch.zeros(10_000, 3)
    # Huge noise is clipped to +-0.5 around mu' = 0 ...
    centred = smoothed_next_action(ConstActor(0.0), obs, noise_std=100.0, noise_clip=0.5)
    assert float(centred.abs().max()) == 0.5 and float((centred.abs() == 0.5).float().mean()) > 0.99
    # ... and mu' + noise is clipped to the action range: 0.9 + [-0.5, 0.5] -> [0.4, 1.0].
    shifted = smoothed_next_action(ConstActor(0.9), obs, noise_std=100.0, noise_clip=0.5)
    assert float(shifted.max()) == 1.0 and float(shifted.min()) == pytest.approx(0.4)
    assert 0.45 < float((shifted == 1.0).float().mean()) < 0.55
    # Small noise passes unclipped: its spread is the configured std.
    small = smoothed_next_action(ConstActor(0.0), obs, noise_std=0.1, noise_clip=0.5)
    assert float(small.std()) == pytest.approx(0.1, rel=0.05)


def test_sac_soft_target_subtracts_the_entropy_term() -> None:
    class Sampler(nn.Module):
        def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.full((obs.shape[0], 1), 0.5), torch.full((obs.shape[0],), -1.0)  # a' = 0.5, log pi = -1

    sac = SoftActorCritic(Sampler(), None, TwinQ(), Temperature(0.2), -1.0, None, None, None)
    target = sac.soft_target(hand_batch(), hand_batch().rewards, GAMMA)
    # min twin Q (1.5 and 3.5) - alpha * log pi = + 0.2.
    torch.testing.assert_close(target, torch.tensor([1 + 0.9 * 1.7, -2.0, 0.5 + 0.9 * 3.7]))


def test_discrete_cql_target_is_the_max_over_actions() -> None:
    q_net = lambda s: torch.stack([s[:, 0], 2 * s[:, 0], -s[:, 0]], dim=-1)  # noqa: E731  Q'(s', .) [B, 3]
    target = dqn_target(q_net, hand_batch(), torch.tensor([1.0, -2.0, 0.5]), GAMMA)
    torch.testing.assert_close(target, torch.tensor([1 + 0.9 * 2.0, -2.0, 0.5 + 0.9 * 6.0]))


def test_continuous_cql_hands_shifted_scaled_rewards_and_terminals_to_sacs_target(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    original = SoftActorCritic.soft_target

    def spy(self: SoftActorCritic, b: Batch, rewards: torch.Tensor, gamma: float, entropy: bool = True) -> torch.Tensor:
        seen.append((rewards, b.terminated))
        return original(self, b, rewards, gamma, entropy)

    monkeypatch.setattr(SoftActorCritic, "soft_target", spy)
    config = get_algo("cql").config_class(hidden=(8, 8), reward_shift=1.0, reward_scale=2.0, gamma=GAMMA)
    learner = continuous_cql(config, SimpleNamespace(obs_dim=3, act_dim=1, device=torch.device("cpu"), observation_space=OBS_SPACE))
    learner.update(hand_batch(), 0)
    [(rewards, terminated)] = seen
    torch.testing.assert_close(rewards, torch.tensor([4.0, -2.0, 3.0]))  # (r + 1) * 2
    torch.testing.assert_close(terminated, torch.tensor([0.0, 1.0, 0.0]))


def test_iql_target_bootstraps_from_v() -> None:
    value = lambda s: 3 * s[:, 0]  # noqa: E731
    target = q_target(value, hand_batch(), GAMMA)
    torch.testing.assert_close(target, torch.tensor([1 + 0.9 * 3.0, -2.0, 0.5 + 0.9 * 9.0]))


def test_iql_advantage_weights_are_clipped() -> None:
    weights = awr_weights(torch.tensor([-1.0, 0.0, 1.0, 10.0]), beta=3.0, max_weight=100.0)
    torch.testing.assert_close(weights, torch.tensor([np.exp(-3.0), 1.0, np.exp(3.0), 100.0], dtype=torch.float32))


def test_bcq_target_takes_the_best_candidate() -> None:
    n, lmbda = 5, 0.75
    # Candidate j of state i is row j*B + i of the repeated next states; the stub decoder
    # numbers them: a = linspace(-1, 1, n*B)[j*B + i]; the perturbation leaves them.
    decoder = SimpleNamespace(decode=lambda obs: torch.linspace(-1.0, 1.0, obs.shape[0])[:, None])
    twin = lambda s, a: torch.stack([s[:, 0] + a[:, 0], s[:, 0] - a[:, 0]])  # noqa: E731
    target = bcq_target(decoder, twin, lambda s, a: a, hand_batch(), GAMMA, lmbda, n)
    # lmbda min + (1 - lmbda) max = s'_0 - (2 lmbda - 1)|a|: the best candidate has the smallest |a|.
    smallest = torch.linspace(-1.0, 1.0, n * 3).view(n, 3).abs().min(0).values
    torch.testing.assert_close(smallest, torch.tensor([1 / 7, 0.0, 1 / 7]))  # candidates j = 3, 2, 2
    next_v = torch.tensor([1.0, 2.0, 3.0]) - 0.5 * smallest
    torch.testing.assert_close(target, torch.tensor([1.0, -2.0, 0.5]) + GAMMA * torch.tensor([1.0, 0.0, 1.0]) * next_v)


def test_bcq_acts_with_100_candidates_and_bootstraps_with_10(cli, store) -> None:
    assert (
        cli("collect", "--env", "Pendulum-v1", "--episodes", "1", "--num-envs", "1", "--store", store, "--format", "arrow", "--quiet").code
        == 0
    )
    bcq = get_algo("bcq")
    config = bcq.make_config(
        "Pendulum-v1",
        dataset="pendulum-random",
        store=str(store),
        updates=2,
        eval_every=2,
        eval_episodes=1,
        hidden=(8, 8),
        vae_hidden=(8, 8),
    )
    assert (config.n_candidates, config.act_candidates) == (10, 100)
    assert bcq.train(config, progress=False).policy.n_candidates == 100


MAKE_AGENT = {"ddpg": ddpg.make_agent, "td3": td3.make_agent, "sac": sac.make_agent}


def _off_policy_update(name: str) -> tuple[object, nn.Module]:
    """A fresh (seed 0) update function of ``name`` on 3-d observations and its critic."""
    torch.manual_seed(0)
    if name == "cql-discrete":
        config = get_algo("cql").config_class(hidden=(16, 16), gamma=GAMMA)
        learner = discrete_cql(config, SimpleNamespace(obs_dim=3, act_dim=2, device=torch.device("cpu"), observation_space=OBS_SPACE))
        return learner.update, learner.actor
    if name == "td3bc":
        config = get_algo("td3bc").make_config("Pendulum-v1", hidden=(16, 16), gamma=GAMMA)
        actor, critic = DeterministicActor(3, 1, (16, 16)), EnsembleQ(3, 1, (16, 16))
        update, _ = td3_update(actor, critic, config, lambda b, pi, q: td3_bc_actor_loss(pi, q, b.actions, config.alpha))
        return update, critic
    config = get_algo(name).make_config("Pendulum-v1", hidden=(16, 16), gamma=GAMMA)
    env = OffPolicySetup(None, spaces.Box(-2.0, 2.0, (1,)), 3, 1, torch.device("cpu"), np.random.default_rng(0))
    agent = MAKE_AGENT[name](config, env)
    return agent.update, agent.modules["critic"]


def _critic_after_update(name: str, batch: Batch) -> list[torch.Tensor]:
    update, critic = _off_policy_update(name)
    torch.manual_seed(1)  # the same noise draws for every batch
    update(batch, 0)
    return [p.detach().clone() for p in critic.parameters()]


@pytest.mark.parametrize("name", ["ddpg", "td3", "sac", "td3bc", "cql-discrete"])
def test_update_ignores_next_obs_after_termination_but_not_after_truncation(name: str) -> None:
    actions = torch.tensor([0.0, 1.0, 1.0]) if name == "cql-discrete" else None
    base = hand_batch(actions)

    def with_next_obs(row: int) -> Batch:
        next_obs = base.next_obs.clone()
        next_obs[row] = 50.0
        return base._replace(next_obs=next_obs)

    reference = _critic_after_update(name, base)
    after_terminal = _critic_after_update(name, with_next_obs(TERMINATED_ROW))
    after_truncation = _critic_after_update(name, with_next_obs(TRUNCATED_ROW))
    assert all(torch.equal(a, b) for a, b in zip(reference, after_terminal))
    assert not all(torch.equal(a, b) for a, b in zip(reference, after_truncation))


def test_td3_updates_actor_and_targets_every_policy_delay_updates() -> None:
    torch.manual_seed(0)
    actor, critic = DeterministicActor(3, 1, (16, 16)), EnsembleQ(3, 1, (16, 16))
    config = SimpleNamespace(gamma=GAMMA, tau=0.005, actor_lr=1e-3, critic_lr=1e-3, policy_delay=3, target_noise=0.2, target_noise_clip=0.5)
    update, modules = td3_update(actor, critic, config)
    batch = hand_batch()._replace(obs=torch.randn(3, 3))
    changed = {name: [] for name in ("policy", "critic", "policy_target", "critic_target")}
    for i in range(7):
        before = {name: [p.clone() for p in modules[name].parameters()] for name in changed}
        update(batch, i)
        for name in changed:
            changed[name].append(not all(torch.equal(a, b) for a, b in zip(before[name], modules[name].parameters())))
    delayed = [i % 3 == 0 for i in range(7)]  # updates 0, 3 and 6
    assert changed["critic"] == [True] * 7
    assert changed["policy"] == changed["policy_target"] == changed["critic_target"] == delayed


def test_truncated_transitions_are_stored_as_not_terminated() -> None:
    """Both sources of batches keep truncation apart from termination: the replay buffer
    (from vector-env steps) and the dataset sampler (from stored episodes)."""
    obs, next_obs = np.zeros((3, 3), np.float32), np.arange(9, dtype=np.float32).reshape(3, 3)
    terminated, truncated = np.array([False, True, False]), np.array([False, False, True])
    buffer = ReplayBuffer(3, 3, 1)
    buffer.store(
        StepBatch(
            obs,
            np.zeros((3, 1)),
            np.zeros((3, 1)),
            np.ones(3),
            next_obs,
            terminated,
            truncated,
            np.ones(3, bool),
            np.ones(3),
            np.ones(3, np.int64),
        )
    )
    arrays = TransitionArrays(
        obs, np.zeros((3, 1), np.float32), np.ones(3, np.float32), next_obs, terminated, truncated, np.arange(3), np.zeros(3, np.int64)
    )
    sampler = TransitionSampler(arrays)
    for batch in (buffer.sample(64), sampler.sample(64)):
        by_row = {int(row[0]): float(t) for row, t in zip(batch.next_obs / 3, batch.terminated)}
        assert by_row == {0: 0.0, 1: 1.0, 2: 0.0}  # next_obs row k starts with 3k
