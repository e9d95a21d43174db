"""EDAC / SAC-N: the diversity term on critics whose action gradients are known, and the
config's checks. EDAC's learning test (it beats BC on `pendulum-mixed`) is in
tests/test_offline_rl_beats_bc.py; there is no learning test of the diversity term: SAC-N
at small N learns as well on that data, and neither learns on the expert-only datasets
(docs/algorithms/offline.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from rlpipe.algos.edac import Config, build, diversity_loss, q_and_action_grads
from rlpipe.errors import RlpipeError
from rlpipe.nets.networks import EnsembleQ


def linear_critics(action_weights: list[list[float]], obs_dim: int = 3) -> EnsembleQ:
    """Critics Q_i(s, a) = w_i . a (no hidden layer, state weights and biases 0): grad_a Q_i = w_i."""
    critic = EnsembleQ(obs_dim, len(action_weights[0]), hidden=(), n=len(action_weights))
    layer = critic.net.layers[0]
    with torch.no_grad():
        layer.weight.zero_()
        layer.bias.zero_()
        layer.weight[:, obs_dim:, 0] = torch.tensor(action_weights)
    return critic


@pytest.mark.parametrize(
    ("weights", "expected"),
    [
        ([[1.0, 2.0], [1.0, 2.0]], 2.0),  # identical: both ordered pairs have cos 1, / (N - 1) = 1
        ([[1.0, 2.0], [-3.0, -6.0]], -2.0),  # opposite: cos -1 whatever the lengths
        ([[1.0, 0.0], [0.0, 5.0]], 0.0),  # orthogonal
        ([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0]], 1.0),  # one aligned pair of three critics: 2 / (3 - 1)
    ],
)
def test_diversity_term_of_linear_critics_is_their_pairwise_cosine_sum(weights: list[list[float]], expected: float) -> None:
    critic = linear_critics(weights)
    obs, actions = torch.randn(5, 3), torch.rand(5, 2) * 2 - 1
    q, grads = q_and_action_grads(critic, obs, actions)
    assert q.shape == (len(weights), 5) and grads.shape == (len(weights), 5, 2)
    torch.testing.assert_close(grads, torch.tensor(weights)[:, None, :].expand(-1, 5, -1))
    torch.testing.assert_close(diversity_loss(grads), torch.tensor(expected), atol=1e-5, rtol=0)


def test_diversity_term_equals_the_gram_matrix_off_diagonal_mean_and_trains_the_critics() -> None:
    grads = torch.randn(6, 4, 3)
    unit = grads / grads.norm(dim=-1, keepdim=True)
    gram = torch.einsum("ibk,jbk->bij", unit, unit)  # [B, N, N]
    off_diagonal = gram.sum((1, 2)) - gram.diagonal(dim1=1, dim2=2).sum(-1)
    torch.testing.assert_close(diversity_loss(grads), off_diagonal.mean() / 5)

    # The term reaches the critics' weights through the action gradients (second order).
    critic = linear_critics([[1.0, 2.0], [1.0, 2.5]])
    _, action_grads = q_and_action_grads(critic, torch.randn(5, 3), torch.zeros(5, 2))
    diversity_loss(action_grads).backward()
    weight_grad = critic.net.layers[0].weight.grad
    assert weight_grad is not None and weight_grad[:, 3:].abs().sum() > 0


def test_config_refuses_a_negative_weight_and_a_single_diversified_critic() -> None:
    with pytest.raises(RlpipeError, match="eta=-1.0"):
        Config(eta=-1.0)
    with pytest.raises(RlpipeError, match="n_critics=1"):
        Config(n_critics=1, eta=1.0)
    assert Config(n_critics=1, eta=0.0).n_critics == 1  # SAC-N with one critic is plain offline SAC


def test_edac_init_reaches_the_actor_the_critics_and_their_targets() -> None:
    torch.manual_seed(0)
    sac = build(Config(n_critics=4, hidden=(32, 32), edac_init=True), obs_dim=3, act_dim=2, device=torch.device("cpu"))
    critic_last = sac.critic.net.layers[-1]
    assert torch.all(sac.critic.net.layers[0].bias == 0.1) and critic_last.weight.abs().max() <= 3e-3
    actor_last = [m for m in sac.actor.net.modules() if isinstance(m, torch.nn.Linear)][-1]
    assert actor_last.weight.abs().max() <= 1e-3  # both heads, mean and log-std
    # The targets start from the initialised critics, not from the default ones built before.
    for target, online in zip(sac.critic_target.state_dict().values(), sac.critic.state_dict().values(), strict=True):
        assert torch.equal(target, online)
    default = build(Config(n_critics=4, hidden=(32, 32)), obs_dim=3, act_dim=2, device=torch.device("cpu"))
    assert default.critic.net.layers[-1].weight.abs().max() > 3e-3


def test_edac_trains_on_a_dataset_and_its_saved_policy_loads(store: Path, tmp_path: Path) -> None:
    from rlpipe.algos import get_algo
    from rlpipe.algos.registry import load_policy
    from rlpipe.commands.collect import collect_dataset

    collect_dataset("Pendulum-v1", steps=400, num_envs=2, seed=0, name="pendulum-tiny", fmt="arrow", store=store, progress=False)
    spec = get_algo("edac")
    config = spec.make_config(
        "Pendulum-v1",
        dataset="pendulum-tiny",
        store=str(store),
        updates=20,
        eval_every=20,
        eval_episodes=1,
        heldout_eval_episodes=0,
        n_critics=3,
    )
    result = spec.train(config, tmp_path / "run", progress=False)
    assert -3 / 2 <= result.metrics["diversity"] <= 3  # N = 3: in [-N / (N - 1), N], as |sum_i u_i|^2 >= 0
    actions = load_policy(tmp_path / "run")(np.zeros((4, 3), np.float32))
    assert actions.shape == (4, 1) and np.all(np.abs(actions) <= 2.0)
