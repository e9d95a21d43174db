"""CQL (continuous and discrete) and BCQ: their pieces against hand computations, learning
at small budgets on the shared offline store, and the CLI round trip (train, then eval)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from rlpipe.algos import get_algo, load_policy
from rlpipe.algos.bcq import BCQPolicy, generator_loss
from rlpipe.algos.cql import conservative_gap, data_and_sampled_q, proposal_samples
from rlpipe.nets.networks import EnsembleQ, TanhGaussianActor, build_policy, mlp
from rlpipe.training.optim import adam


def test_conservative_gap_matches_a_hand_computation() -> None:
    # One critic, one state, four sampled actions (two uniform, two from policies).
    q_sampled = torch.tensor([1.0, 2.0, 0.5, -1.0]).view(1, 4, 1)
    log_density = torch.tensor([math.log(0.5), math.log(0.5), -0.3, 0.2]).view(4, 1)
    q_data = torch.tensor([[1.5]])
    expected = math.log(sum(math.exp(q - d) for q, d in [(1.0, math.log(0.5)), (2.0, math.log(0.5)), (0.5, -0.3), (-1.0, 0.2)])) - 1.5
    assert conservative_gap(q_sampled, log_density, q_data).item() == pytest.approx(expected, rel=1e-6)
    # Critics add up; states average.
    two = conservative_gap(q_sampled.expand(2, 4, 3), log_density.expand(4, 3), q_data.expand(2, 3))
    assert two.item() == pytest.approx(2 * expected, rel=1e-6)


@pytest.mark.parametrize("block_rows", [None, 7])
def test_one_critic_pass_equals_a_loop_over_critics_and_samples(block_rows: int | None) -> None:
    torch.manual_seed(0)
    critic = EnsembleQ(3, 2, (16, 16), n=2)
    obs, actions, sampled = torch.randn(5, 3), torch.rand(5, 2) * 2 - 1, torch.rand(4, 5, 2) * 2 - 1
    q_data, q_sampled = data_and_sampled_q(critic, obs, actions, sampled, block_rows)
    assert q_data.shape == (2, 5) and q_sampled.shape == (2, 4, 5)
    for i in range(2):  # critic members, each as a plain MLP
        weights = [(layer.weight[i], layer.bias[i, 0]) for layer in critic.net.layers]

        def member(a: torch.Tensor) -> torch.Tensor:
            x = torch.cat([obs, a], dim=-1)
            for depth, (w, b) in enumerate(weights):
                x = x @ w + b
                x = x.relu() if depth < len(weights) - 1 else x
            return x.squeeze(-1)

        torch.testing.assert_close(q_data[i], member(actions))
        for j in range(4):
            torch.testing.assert_close(q_sampled[i, j], member(sampled[j]))


def test_critic_pass_in_blocks_has_the_same_gradients() -> None:
    torch.manual_seed(0)
    critic = EnsembleQ(3, 1, (16, 16), n=2)
    obs, actions, sampled = torch.randn(9, 3), torch.rand(9, 1) * 2 - 1, torch.rand(3, 9, 1) * 2 - 1
    grads = []
    for block_rows in (None, 8):
        critic.zero_grad()
        q_data, q_sampled = data_and_sampled_q(critic, obs, actions, sampled, block_rows)
        (q_data.square().sum() + q_sampled.exp().sum()).backward()
        grads.append([p.grad.clone() for p in critic.parameters()])
    for blocked, whole in zip(*grads):
        torch.testing.assert_close(blocked, whole)


def test_proposal_samples_and_their_log_densities() -> None:
    torch.manual_seed(0)
    actor = TanhGaussianActor(3, 2, (16, 16))
    obs, next_obs = torch.randn(5, 3), torch.randn(5, 3)
    sampled, log_density = proposal_samples(actor, obs, next_obs, k=4)
    assert sampled.shape == (12, 5, 2) and log_density.shape == (12, 5)
    assert bool((sampled.abs() <= 1).all())
    torch.testing.assert_close(log_density[:4], torch.full((4, 5), 2 * math.log(0.5)))  # uniform on [-1, 1]^2
    with torch.no_grad():
        torch.testing.assert_close(log_density[4:8], actor.log_prob(obs.expand(4, 5, 3), sampled[4:8]), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(log_density[8:], actor.log_prob(next_obs.expand(4, 5, 3), sampled[8:]), rtol=1e-4, atol=1e-4)


def test_bcq_generator_reconstructs_and_keeps_both_modes_of_bimodal_actions() -> None:
    """Half the data turns left, half right, whatever the state: an MSE regressor would
    answer the mean (0); the VAE reconstructs each action from its latent and samples both."""
    torch.manual_seed(0)
    policy, encoder = BCQPolicy(3, 1, (16, 16), (32, 32), latent_dim=2), mlp(4, 4, (32, 32))
    optimizer = adam([*encoder.parameters(), *policy.decoder.parameters()], 3e-3)
    obs, actions = torch.randn(512, 3), torch.where(torch.rand(512, 1) < 0.5, -0.7, 0.7)
    for _ in range(500):
        loss = generator_loss(encoder, policy, obs, actions, kl_weight=0.5)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        latent_mean = encoder(torch.cat([obs, actions], dim=-1)).chunk(2, dim=-1)[0]
        assert float((policy.decode(obs, latent_mean) - actions).square().mean()) < 0.02  # action variance: 0.49
        samples = policy.decode(obs.repeat(8, 1))  # z ~ N(0, 1) clipped to [-0.5, 0.5]
    assert float((samples.abs() > 0.4).float().mean()) > 0.6
    assert 0.3 < float((samples > 0).float().mean()) < 0.7


def test_bcq_policy_picks_its_best_candidate_and_rebuilds_from_json() -> None:
    torch.manual_seed(0)
    policy = BCQPolicy(3, 1, (16, 16), (16, 16), latent_dim=2, n_candidates=6)
    obs = torch.randn(4, 3)
    action = policy.act(obs)
    assert action.shape == (4, 1) and bool((action.abs() <= 1).all())
    # The chosen action is the first critic's best among the candidates the same draw gives.
    torch.manual_seed(1)
    action = policy.act(obs)
    torch.manual_seed(1)
    repeated = obs.repeat_interleave(6, dim=0)
    candidates = policy.perturbation(repeated, policy.decode(repeated)).view(4, 6, 1)
    q = policy.critic(repeated, candidates.view(-1, 1))[0].view(4, 6)
    torch.testing.assert_close(action, candidates[torch.arange(4), q.argmax(1)])
    rebuilt = build_policy(policy.kind, json.loads(json.dumps(policy.spec)))
    rebuilt.load_state_dict(policy.state_dict())


@pytest.mark.slow
def test_discrete_cql_matches_the_cartpole_expert(offline_store: Path, learning_seed: int, record_property) -> None:
    """Trains until a 10-episode eval reaches 475, at most 6k updates (a budget that stops
    where it converges costs nothing past it, and another CPU converges later as another seed
    does): 1k fixed updates gave 343.1 on an Intel Xeon. Seeds 0-4 reach 500.0 after 2000,
    1500, 2000, 1500 and 1000 updates (measured twice: the same)."""
    cql = get_algo("cql")
    config = cql.make_config(
        "CartPole-v1",
        dataset="cartpole-expert",
        store=str(offline_store),
        updates=6000,
        eval_every=500,
        stop_at_return=475.0,
        seed=learning_seed,
    )
    result = cql.train(config, progress=False)
    record_property("eval_return_mean", result.metrics["eval_return_mean"])
    record_property("gradient_updates", result.metrics["gradient_updates"])
    assert result.metrics["eval_return_mean"] >= 400


@pytest.mark.slow
def test_bcq_learns_pendulum_from_a_mixed_dataset(offline_store: Path, learning_seed: int, record_property, non_learning_returns) -> None:
    bcq = get_algo("bcq")
    config = bcq.make_config(
        "Pendulum-v1",
        dataset="pendulum-mixed",
        store=str(offline_store),
        updates=3000,
        hidden=(64, 64),
        vae_hidden=(64, 64),
        eval_every=3000,
        seed=learning_seed,
    )
    result = bcq.train(config, progress=False).metrics["eval_return_mean"]
    controls = non_learning_returns("Pendulum-v1", learning_seed)  # zero torque, uniform random actions
    record_property("eval_return_mean", result)
    record_property("controls", controls)
    # Controls, seeds 0-4 (zero torque / uniform random): -1071.7/-1118.2, -1167.3/-1185.9,
    # -1113.9/-1117.0, -1173.6/-1202.0, -1139.6/-1224.3.
    assert max(controls.values()) < -1000, controls
    assert result >= -300, result  # seeds 0-4: -168.1, -207.7, -195.3, -219.5, -208.7


def test_cql_and_bcq_cli_round_trip_and_bad_input(offline_store: Path, tmp_path: Path, cli) -> None:
    for algo, dataset, kind in [
        ("cql", "cartpole-expert", "greedy_q"),
        ("cql", "pendulum-mixed", "tanh_gaussian"),
        ("bcq", "pendulum-mixed", "bcq"),
        ("bcq", "cartpole-expert", "discrete_bcq"),
    ]:
        out = tmp_path / f"{algo}-{dataset}"
        ok = cli(
            "train",
            algo,
            "--dataset",
            dataset,
            "--store",
            offline_store,
            "--updates",
            "20",
            "--out",
            out,
            "--no-progress",
            "--set",
            "eval_episodes=2",
        )
        assert ok.code == 0, ok.err
        assert json.loads((out / "metrics.json").read_text())["gradient_updates"] == 20
        evaluated = cli("eval", out, "--episodes", "2", "--json")
        assert evaluated.code == 0, evaluated.err
        # BCQ samples its candidates, but one --seed gives one result
        assert json.loads(cli("eval", out, "--episodes", "2", "--json").out)["returns"] == json.loads(evaluated.out)["returns"]
        assert load_policy(out).actor.kind == kind
    for args, message in [
        (["cql", "--dataset", "pendulum-mixed", "--set", "td_loss=l1"], "setting td_loss='l1': expected 'mse' or 'huber'"),
        (
            ["cql", "--dataset", "pendulum-mixed", "--set", "num_sampled_actions=0"],
            "setting num_sampled_actions=0: expected a positive number",
        ),
        (["bcq", "--dataset", "pendulum-mixed", "--set", "lmbda=2"], "setting lmbda=2.0: expected a number in [0, 1]"),
    ]:
        result = cli("train", *args, "--store", offline_store, "--out", tmp_path / "bad", "--no-progress")
        assert result.code == 2 and message in result.err, (args, result.err)
    assert not (tmp_path / "bad").exists()


def test_backup_entropy_off_leaves_the_next_actions_entropy_out_of_the_target() -> None:
    """CQL's `backup_entropy=false` (CORL's and d3rlpy's target): the same sampled next
    actions, the target without SAC's -alpha * log pi(a'|s') term."""
    from rlpipe.algos.cql import Config
    from rlpipe.algos.sac import SoftActorCritic
    from rlpipe.training import Batch

    config = Config(dataset="x", hidden=(8, 8), init_alpha=0.5)
    sac = SoftActorCritic.build(config, 3, 1, torch.device("cpu"))
    b = Batch(torch.randn(6, 3), torch.rand(6, 1) * 2 - 1, torch.randn(6), torch.randn(6, 3), torch.tensor([0.0, 1, 0, 0, 1, 0]))
    torch.manual_seed(1)
    soft = sac.soft_target(b, b.rewards, 0.9)
    torch.manual_seed(1)
    plain = sac.soft_target(b, b.rewards, 0.9, entropy=False)
    torch.manual_seed(1)
    _, next_logp = sac.actor.sample(b.next_obs)
    torch.testing.assert_close(plain - soft, 0.9 * (1 - b.terminated) * 0.5 * next_logp.detach())
