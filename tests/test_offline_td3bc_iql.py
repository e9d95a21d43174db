"""TD3+BC and IQL: their losses, the dataset observation normaliser in saved policies,
and learning on the 10k-transition pendulum-mixed dataset."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from rlpipe.algos import get_algo, load_policy
from rlpipe.algos.iql import expectile_loss
from rlpipe.algos.td3_bc import td3_bc_actor_loss
from rlpipe.datasets.loader import load_dataset
from rlpipe.errors import RlpipeError


def test_expectile_loss_by_hand() -> None:
    diff = torch.tensor([2.0, -1.0, 0.5, -3.0])
    # Positive errors weigh tau = 0.7, negative ones 1 - tau = 0.3.
    expected = (0.7 * 4.0 + 0.3 * 1.0 + 0.7 * 0.25 + 0.3 * 9.0) / 4
    assert expectile_loss(diff, 0.7).item() == pytest.approx(expected)
    assert expectile_loss(diff, 0.5).item() == pytest.approx(0.5 * diff.square().mean().item())


def test_expectile_loss_minimiser_is_the_expectile() -> None:
    """Fitting a constant V to samples of Q: tau = 0.5 gives the mean, tau -> 1 the max."""
    q = torch.tensor([0.0, 1.0, 2.0, 10.0])
    fits = []
    for tau in (0.5, 0.7, 0.99):
        v = torch.zeros((), requires_grad=True)
        opt = torch.optim.SGD([v], lr=0.5)
        for _ in range(300):
            opt.zero_grad()
            expectile_loss(q - v, tau).backward()
            opt.step()
        fits.append(v.item())
    assert fits[0] == pytest.approx(q.mean().item(), abs=1e-3)
    assert fits[0] < fits[1] < fits[2] < 10.0 and fits[2] > 8.0


def test_td3_bc_actor_loss_by_hand() -> None:
    pi = torch.tensor([[0.5], [-0.5]], requires_grad=True)
    q = torch.tensor([1.0, -3.0], requires_grad=True)
    actions = torch.zeros(2, 1)
    loss = td3_bc_actor_loss(pi, q, actions, alpha=2.5)
    # lambda = 2.5 / mean|Q| = 1.25; -lambda * mean Q = 1.25; mean (pi - a)^2 = 0.25.
    assert loss.item() == pytest.approx(1.5)
    loss.backward()
    # lambda is a constant: dL/dQ_i = -lambda / B, and dL/dpi_i = 2 (pi_i - a_i) / B.
    torch.testing.assert_close(q.grad, torch.tensor([-0.625, -0.625]))
    torch.testing.assert_close(pi.grad, torch.tensor([[0.5], [-0.5]]))


@pytest.mark.parametrize(("algo", "actor"), [("td3bc", None), ("iql", "gaussian"), ("iql", "normal")])
def test_saved_policy_normalises_observations_with_dataset_statistics(
    offline_store: Path, tmp_path: Path, algo: str, actor: str | None
) -> None:
    module = get_algo(algo)
    config = module.make_config(
        "Pendulum-v1", dataset="pendulum-mixed", store=str(offline_store), updates=20, eval_every=20, eval_episodes=1,
        **({"actor": actor} if actor else {}),
    )  # fmt: skip
    result = module.train(config, tmp_path / algo, progress=False)
    loaded = load_policy(tmp_path / algo)

    obs = load_dataset("pendulum-mixed", offline_store).obs
    norm = loaded.actor.obs_norm
    np.testing.assert_allclose(norm.mean.numpy(), obs.mean(0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(norm.var.numpy(), obs.var(0), rtol=1e-3, atol=1e-4)

    probe = np.random.default_rng(0).uniform([-1, -1, -8], [1, 1, 8], (16, 3)).astype(np.float32)
    with torch.no_grad():
        trained = result.policy.act(torch.as_tensor(probe), True).numpy()
        head = loaded.actor.net(torch.as_tensor((probe - obs.mean(0)) / obs.std(0)))
    by_hand = np.tanh(head[:, :1].numpy())  # the mean action (a tanh-Gaussian head's first half)
    np.testing.assert_allclose(loaded(probe), 2.0 * trained, rtol=1e-5, atol=1e-5)  # Pendulum's torque is +-2
    np.testing.assert_allclose(loaded(probe), 2.0 * by_hand, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("algo", ["td3bc", "iql"])
def test_discrete_dataset_is_refused(offline_store: Path, algo: str) -> None:
    module = get_algo(algo)
    with pytest.raises(RlpipeError, match="cartpole-expert"):
        module.train(module.make_config("CartPole-v1", dataset="cartpole-expert", store=str(offline_store)), progress=False)


def test_normal_actor_likelihood_stays_finite_at_the_action_bounds() -> None:
    """CORL's IQL policy: a Gaussian on tanh(mu(s)). A saturated dataset action (exactly 1.0, as
    float32 rounds tanh of a large pre-activation) has a finite log-likelihood, the plain
    Gaussian's; the tanh-squashed Gaussian pays atanh(1 - 1e-6) for it."""
    from rlpipe.algos.iql import NormalActor
    from rlpipe.nets.networks import TanhGaussianActor

    torch.manual_seed(0)
    obs, actions = torch.randn(4, 3), torch.tensor([[1.0], [-1.0], [0.0], [0.5]])
    normal, squashed = NormalActor(3, 1, (8,)), TanhGaussianActor(3, 1, (8,))
    with torch.no_grad():
        mean = torch.tanh(normal.net(obs))
        by_hand = -0.5 * (actions - mean).square() - 0.5 * np.log(2 * np.pi)  # std 1 at init
        torch.testing.assert_close(normal.log_prob(obs, actions), by_hand.sum(-1))
        assert torch.equal(normal.act(obs, deterministic=True), mean)
        sampled = normal.act(obs[:1].expand(256, 3), deterministic=False)
        assert sampled.abs().max() <= 1.0 and sampled.std() > 0.5
        # The squashed Gaussian pays several times as much for the bound actions.
        assert (-squashed.log_prob(obs, actions))[:2].min() > 5 * (-normal.log_prob(obs, actions))[:2].max()


def test_iql_rejects_bad_options() -> None:
    iql = get_algo("iql")
    with pytest.raises(RlpipeError, match="setting actor='beta': expected 'gaussian' or 'normal' or 'deterministic'"):
        iql.make_config("Pendulum-v1", actor="beta")
    with pytest.raises(RlpipeError, match="expectile"):
        iql.make_config("Pendulum-v1", expectile=1.0)


def test_cosine_schedule_follows_torch_and_resumes_where_it_stopped() -> None:
    """CosineLR is CosineAnnealingLR's curve over its ``total`` steps, held at 0 after it, and
    an optimizer restored from a state dict goes on from its own step count."""
    from rlpipe.training.optim import CosineLR, adam

    ours, theirs = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    optimizer, reference = adam([ours], 0.1), torch.optim.Adam([theirs], lr=0.1)
    schedule, torch_schedule = CosineLR(optimizer, 10), torch.optim.lr_scheduler.CosineAnnealingLR(reference, 10)
    rates = []
    for _ in range(10):
        for opt, param in ((optimizer, ours), (reference, theirs)):
            opt.zero_grad()
            param.square().sum().backward()
            opt.step()
        schedule.step()
        torch_schedule.step()
        rates.append(float(optimizer.param_groups[0]["lr"]))
        assert rates[-1] == pytest.approx(reference.param_groups[0]["lr"], abs=1e-7)
    assert rates[-1] == 0.0
    resumed_param = torch.nn.Parameter(torch.ones(3))
    resumed = adam([resumed_param], 0.1)
    resumed_schedule = CosineLR(resumed, 20)
    resumed.load_state_dict(optimizer.state_dict())  # 10 steps done
    resumed_schedule.step()
    assert float(resumed.param_groups[0]["lr"]) == pytest.approx(0.05, abs=1e-7)  # halfway down 20 steps


def test_iql_cosine_schedule_anneals_the_actor_to_zero(offline_store: Path) -> None:
    module = get_algo("iql")
    config = module.make_config(
        "Pendulum-v1", dataset="pendulum-mixed", store=str(offline_store), updates=40, eval_every=40, eval_episodes=1,
        heldout_eval_episodes=0, actor_lr_schedule="cosine",
    )  # fmt: skip
    rates: list[float] = []
    original = torch.optim.Adam.step

    def recording_step(self: torch.optim.Adam, *args: object, **kwargs: object) -> object:
        if isinstance(self.param_groups[0]["lr"], torch.Tensor):  # the actor's: the one scheduled
            rates.append(float(self.param_groups[0]["lr"]))
        return original(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.optim.Adam, "step", recording_step)
        module.train(config, None, progress=False)
    assert len(rates) == 40 and rates[0] == pytest.approx(3e-4) and rates[-1] < 1e-6 < rates[20]
