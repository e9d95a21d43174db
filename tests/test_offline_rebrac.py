"""ReBRAC: its actor loss by hand (its critic target is in test_targets.py), the dataset's
next actions in its batches, and learning on narrow data with the control that removes the
penalties (on pendulum-mixed: test_offline_rl_beats_bc.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from rlpipe.algos import get_algo
from rlpipe.algos.rebrac import rebrac_actor_loss
from rlpipe.datasets.loader import TransitionArrays
from rlpipe.errors import RlpipeError
from rlpipe.nets.networks import DeterministicActor, EnsembleQ, build_policy
from rlpipe.training.sampler import TransitionSampler, next_action_rows


def test_actor_loss_by_hand() -> None:
    pi = torch.tensor([[0.5, 0.0], [-0.5, 1.0]], requires_grad=True)
    q = torch.tensor([1.0, -3.0], requires_grad=True)
    actions = torch.zeros(2, 2)
    loss = rebrac_actor_loss(pi, q, actions, bc_coef=0.5, normalize_q=True)
    # ||pi - a||^2 per row (summed over action dims): 0.25, 1.25; times beta_1 = 0.5: 0.125, 0.625.
    # lambda = 1 / mean|Q| = 0.5: rows 0.125 - 0.5 and 0.625 + 1.5, mean 0.875.
    assert loss.item() == pytest.approx(0.875)
    loss.backward()
    # lambda is a constant: dL/dQ_i = -lambda / B; dL/dpi = beta_1 * 2 (pi - a) / B.
    torch.testing.assert_close(q.grad, torch.tensor([-0.25, -0.25]))
    torch.testing.assert_close(pi.grad, torch.tensor([[0.25, 0.0], [-0.25, 0.5]]))
    # Without Q normalisation lambda = 1: rows 0.125 - 1 and 0.625 + 3.
    assert rebrac_actor_loss(pi, q, actions, 0.5, normalize_q=False).item() == pytest.approx(1.375)


def test_layer_norm_normalises_each_members_hidden_features_and_rebuilds_from_the_spec() -> None:
    critic = EnsembleQ(3, 1, (8, 8), n=2, layer_norm=True)
    with torch.no_grad():
        critic.net.norms[1].weight[1].fill_(2.0)  # member 1's own scale
    hidden = []
    critic.net.norms[1].register_forward_hook(lambda module, inputs, out: hidden.extend([inputs[0], out]))
    critic(torch.randn(16, 3), torch.rand(16, 1))
    before, features = hidden  # [2 members, 16 rows, 8 features] after the second hidden layer
    torch.testing.assert_close(features.mean(-1), torch.zeros(2, 16), atol=1e-5, rtol=0)
    spread = before.var(-1, unbiased=False)  # LayerNorm's eps shrinks rows whose ReLU features barely vary
    expected = torch.tensor([1.0, 4.0])[:, None] * spread / (spread + 1e-5)  # F.layer_norm's default eps
    torch.testing.assert_close(features.var(-1, unbiased=False), expected, atol=1e-4, rtol=1e-4)
    actor = DeterministicActor(3, 1, (8,), layer_norm=True)
    rebuilt = build_policy(actor.kind, actor.spec)
    assert actor.spec["layer_norm"] and any(isinstance(m, torch.nn.LayerNorm) for m in rebuilt.modules())
    assert "layer_norm" not in DeterministicActor(3, 1, (8,)).spec  # specs without it are unchanged


def transitions(episode_id: list[int], step: list[int]) -> TransitionArrays:
    n = len(step)
    return TransitionArrays(
        obs=np.zeros((n, 3), np.float32),
        action=np.arange(n, dtype=np.float32)[:, None],
        reward=np.zeros(n, np.float32),
        next_obs=np.zeros((n, 3), np.float32),
        terminated=np.zeros(n, bool),
        truncated=np.zeros(n, bool),
        episode_id=np.asarray(episode_id),
        step=np.asarray(step),
    )


def test_next_actions_are_the_same_episodes_next_step() -> None:
    # Episode 0: steps 0-2; episode 1: steps 0, 1 and (a subset's gap) 3.
    data = transitions([0, 0, 0, 1, 1, 1], [0, 1, 2, 0, 1, 3])
    # An episode's last row, and a row whose next step is missing, keep their own action.
    np.testing.assert_array_equal(next_action_rows(data), [1, 2, 2, 4, 4, 5])
    sampler = TransitionSampler(data, next_actions=True)
    batch = sampler.take(torch.arange(6))
    torch.testing.assert_close(batch.next_actions, torch.tensor([[1.0], [2.0], [2.0], [4.0], [4.0], [5.0]]))
    assert TransitionSampler(data).take(torch.arange(6)).next_actions is None


def test_discrete_dataset_is_refused(offline_store: Path) -> None:
    rebrac = get_algo("rebrac")
    with pytest.raises(RlpipeError, match="cartpole-expert"):
        rebrac.train(rebrac.make_config("CartPole-v1", dataset="cartpole-expert", store=str(offline_store)), progress=False)


def test_negative_penalty_weight_is_refused() -> None:
    with pytest.raises(RlpipeError, match="critic_bc_coef"):
        get_algo("rebrac").make_config("Pendulum-v1", critic_bc_coef=-0.1)


@pytest.mark.heavy  # two runs of a CPU-minute or more
def test_behaviour_penalties_keep_the_policy_on_narrow_data(offline_store: Path, learning_seed: int, record_property) -> None:
    """On `pendulum-expert-sampled` (20 episodes of one SAC policy, actions sampled) ReBRAC at
    its Pendulum defaults learns; the control, both penalties 0 (TD3 with LayerNorm critics),
    follows its critics out of the data and collapses. (On `pendulum-mixed` the penalties hardly
    matter, and no setting tried makes the critic's penalty alone matter: docs/algorithms/offline.md.)"""
    rebrac = get_algo("rebrac")
    returns = {}
    for name, penalties in [("rebrac", {}), ("no_penalties", dict(actor_bc_coef=0.0, critic_bc_coef=0.0))]:
        config = rebrac.make_config(
            "Pendulum-v1", dataset="pendulum-expert-sampled", store=str(offline_store), seed=learning_seed, eval_every=10_000, **penalties
        )
        returns[name] = rebrac.train(config, progress=False).metrics["eval_return_mean"]
        record_property(name, returns[name])
    # Seeds 0-4: ReBRAC -261.2, -227.8, -596.1, -639.8, -515.8; no penalties -1046.3, -1512.8,
    # -1326.8, -1399.4, -1528.8 (gaps 731 to 1285).
    assert returns["rebrac"] >= -900.0 > returns["no_penalties"], returns
    assert returns["rebrac"] >= returns["no_penalties"] + 500.0, returns
