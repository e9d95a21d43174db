"""Unit tests of the shared networks: tanh-Gaussian log-prob, fused critics, normaliser."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch
from torch import nn

from rlpipe.nets.networks import (
    ActorCritic,
    DeterministicActor,
    EnsembleQ,
    ObsNormalizer,
    TanhGaussianActor,
    build_policy,
    edac_init_,
    mlp,
    tanh_log_det_jacobian,
)


def test_tanh_log_det_is_stable_and_matches_naive_form() -> None:
    u = torch.linspace(-5, 5, 101, dtype=torch.float64).unsqueeze(-1)
    naive = torch.log(1 - torch.tanh(u) ** 2).squeeze(-1)
    assert torch.allclose(tanh_log_det_jacobian(u), naive, atol=1e-9)
    big = torch.tensor([[30.0], [-30.0]])  # tanh saturates: the naive form gives -inf
    assert torch.isfinite(tanh_log_det_jacobian(big)).all()


def test_tanh_gaussian_log_prob_matches_numerical_change_of_variables() -> None:
    torch.manual_seed(0)
    actor = TanhGaussianActor(obs_dim=3, act_dim=2, hidden=(16,)).double()
    obs = torch.randn(64, 3, dtype=torch.float64)
    action, logp = actor.sample(obs)
    # Density of a = tanh(u): p_u(u) / prod |d tanh/du|, derivative by central differences.
    mu, log_std = actor._mu_log_std(obs)
    u = torch.atanh(action)
    h = 1e-6
    dtanh = (torch.tanh(u + h) - torch.tanh(u - h)) / (2 * h)
    log_pu = torch.distributions.Normal(mu, log_std.exp()).log_prob(u).sum(-1)
    numerical = log_pu - torch.log(dtanh).sum(-1)
    assert torch.allclose(logp, numerical, atol=1e-5)
    assert torch.allclose(actor.log_prob(obs, action), logp, atol=1e-4)


def test_tanh_gaussian_density_integrates_to_one() -> None:
    torch.manual_seed(1)
    actor = TanhGaussianActor(obs_dim=1, act_dim=1, hidden=(8,)).double()
    obs = torch.zeros(1, 1, dtype=torch.float64)
    a = torch.linspace(-1 + 1e-7, 1 - 1e-7, 200_001, dtype=torch.float64).unsqueeze(-1)
    density = actor.log_prob(obs.expand(len(a), 1), a, eps=0).exp()
    assert abs(torch.trapezoid(density, a.squeeze(-1)).item() - 1.0) < 1e-3


def test_fused_critics_equal_separate_critics() -> None:
    torch.manual_seed(0)
    n, obs_dim, act_dim, hidden = 3, 5, 2, (32, 16)
    fused = EnsembleQ(obs_dim, act_dim, hidden, n=n)
    separate = []
    for i in range(n):
        net = mlp(obs_dim + act_dim, 1, hidden)
        linears = [m for m in net if isinstance(m, nn.Linear)]
        with torch.no_grad():
            for lin, ens in zip(linears, fused.net.layers):
                lin.weight.copy_(ens.weight[i].T)
                lin.bias.copy_(ens.bias[i, 0])
        separate.append(net)
    obs, act = torch.randn(10, obs_dim), torch.randn(10, act_dim)
    expected = torch.stack([net(torch.cat([obs, act], -1)).squeeze(-1) for net in separate])
    assert fused(obs, act).shape == (n, 10)
    assert torch.allclose(fused(obs, act), expected, atol=1e-6)
    # Members are independent: a loss on member 0 only moves member 0's weights.
    fused(obs, act)[0].sum().backward()
    assert fused.net.layers[0].weight.grad[1:].abs().sum() == 0


def test_edac_init_sets_hidden_biases_and_shrinks_the_last_layer_only() -> None:
    torch.manual_seed(0)
    actor, critic = DeterministicActor(5, 2, (64, 64), layer_norm=True), EnsembleQ(5, 2, (64, 64), n=3, layer_norm=True)
    default_hidden_weight = critic.net.layers[1].weight.clone()
    edac_init_(actor, 1e-3)
    edac_init_(critic, 3e-3)
    actor_linears = [m for m in actor.net if isinstance(m, nn.Linear)]
    for hidden in (*actor_linears[:-1], *critic.net.layers[:-1]):
        assert torch.all(hidden.bias == 0.1)
    for last, bound in ((actor_linears[-1], 1e-3), (critic.net.layers[-1], 3e-3)):
        for p in (last.weight, last.bias):
            assert p.abs().max() <= bound and p.std() > bound / 10  # uniform in the bound, not zeros
    assert torch.equal(critic.net.layers[1].weight, default_hidden_weight)  # hidden weights keep nn.Linear's init
    assert torch.all(critic.net.norms[0].weight == 1)  # LayerNorms untouched
    # A near-zero last layer: every member starts with Q close to 0 and the actor close to a = 0.
    assert critic(torch.randn(8, 5), torch.rand(8, 2)).abs().max() < 0.1
    assert actor(torch.randn(8, 5)).abs().max() < 0.05


def test_obs_normalizer_matches_numpy_moments() -> None:
    rng = np.random.default_rng(0)
    data = rng.normal(3.0, 2.0, size=(1000, 4)).astype(np.float32)
    norm = ObsNormalizer(4)
    for chunk in np.array_split(data, 7):
        norm.update(torch.as_tensor(chunk))
    assert np.allclose(norm.mean.numpy(), data.mean(0), atol=1e-4)
    assert np.allclose(norm.var.numpy(), data.var(0), rtol=1e-3)


def test_obs_normalizer_is_identity_until_updated_and_survives_loading() -> None:
    obs = torch.full((2, 3), 50.0)
    norm = ObsNormalizer(3)
    assert torch.equal(norm(obs), obs)  # not even clipped before any update
    norm.update(torch.randn(100, 3))
    loaded = ObsNormalizer(3)
    loaded.load_state_dict(norm.state_dict())  # a checkpoint of a normalising policy
    assert torch.equal(loaded(obs), norm(obs)) and loaded(obs).max() <= norm.clip


def test_build_policy_rebuilds_every_actor_kind() -> None:
    import rlpipe.training.multiagent.combat  # noqa: F401  (registers combat_actor_critic)

    for kind, spec in [
        ("tanh_gaussian", {"obs_dim": 3, "act_dim": 1, "hidden": [8], "normalize_obs": False}),
        ("deterministic", {"obs_dim": 3, "act_dim": 2, "hidden": [8], "normalize_obs": False}),
        ("categorical", {"obs_dim": 4, "n_actions": 2, "hidden": [8], "activation": "tanh", "normalize_obs": True}),
        (
            "actor_critic",
            {
                "obs_dim": 4,
                "act_dim": 2,
                "discrete": True,
                "hidden": [8],
                "activation": "tanh",
                "normalize_obs": False,
                "init_log_std": 0.0,
            },
        ),
        (
            "combat_actor_critic",
            {"obs_dim": 150, "act_dim": 7, "n_opponents": 2, "hidden": [8], "extra_dim": 0, "mask_attacks": True, "activation": "tanh"},
        ),
    ]:
        actor = build_policy(kind, spec)
        assert actor.kind == kind and actor.spec == spec
        out = actor.act(torch.zeros(5, spec["obs_dim"]), deterministic=True)
        assert out.shape[0] == 5 and not math.isnan(float(out.float().sum()))


def test_a_checkpoints_policy_class_registers_with_its_algorithms_module() -> None:
    """BCQ's policy class lives in rlpipe.algos.bcq: unknown to build_policy until the module
    that registers it is imported (the control), as loading a checkpoint does through the
    registry; a second class under a registered kind is refused."""
    import subprocess
    import sys

    code = (
        "from rlpipe.errors import RlpipeError\n"
        "from rlpipe.nets.networks import build_policy\n"
        "from rlpipe.algos.registry import import_algorithm\n"
        "spec = dict(obs_dim=3, act_dim=1, hidden=[8], vae_hidden=[8], latent_dim=2, max_shift=0.05, n_candidates=4)\n"
        "try:\n    build_policy('bcq', spec)\nexcept RlpipeError as exc:\n    print(exc)\n"
        "import_algorithm('bcq')\n"
        "print(type(build_policy('bcq', spec)).__module__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.splitlines()
    assert out == ["unknown policy kind 'bcq'", "rlpipe.algos.bcq"]

    from rlpipe.errors import RlpipeError
    from rlpipe.nets.networks import register_policy_class

    class Impostor(nn.Module):
        kind = "categorical"

    with pytest.raises(RlpipeError, match="policy kind 'categorical' is registered twice"):
        register_policy_class(Impostor)


def small_policies() -> list[nn.Module]:
    """One small policy of every registered kind (their modules imported, so every kind is registered)."""
    from rlpipe.algos.bcq import BCQPolicy, DiscreteBCQPolicy
    from rlpipe.algos.dt import DecisionTransformer
    from rlpipe.algos.iql import NormalActor
    from rlpipe.algos.maddpg import AgentActors
    from rlpipe.nets.networks import CategoricalActor, GreedyQPolicy
    from rlpipe.nets.recurrent import RecurrentActorCritic, RecurrentCategoricalActor
    from rlpipe.training.multiagent.combat import CombatActorCritic

    return [
        TanhGaussianActor(3, 1, (8,)),
        DeterministicActor(3, 1, (8,)),
        NormalActor(3, 1, (8,)),
        CategoricalActor(4, 2, (8,)),
        ActorCritic(4, 2, True, (8,)),
        GreedyQPolicy(4, 2, (8,)),
        RecurrentActorCritic(4, 2, True, hidden_size=8, hidden=(8,)),
        RecurrentCategoricalActor(4, 2, hidden_size=8, hidden=(8,)),
        BCQPolicy(3, 1, (8,), (8,), 2, 0.05, 4),
        DiscreteBCQPolicy(4, 2, (8,)),
        DecisionTransformer(3, 1, False, context=4, max_timestep=10, target_return=1.0, return_scale=1.0, embedding_dim=8, layers=1),
        CombatActorCritic(150, 7, 2, (8,)),
        AgentActors(["a", "b"], [3, 3], [2, 2], (8,)),
    ]


def spec_of(policies: list[nn.Module], kind: str) -> dict:
    """The spec of the policy of ``kind``, as a checkpoint holds it (through JSON)."""
    return next(json.loads(json.dumps(policy.spec)) for policy in policies if policy.kind == kind)


# Every JSON type, and integers a dimension cannot be.
SPEC_VALUES = {
    "null": None,
    "bool": True,
    "int": 7,
    "float": 0.5,
    "string": "x",
    "list": [1],
    "object": {"k": 1},
    "zero": 0,
    "negative": -1,
}


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")  # the 0 dims
def test_build_policy_refuses_a_spec_value_of_any_other_type_in_one_line() -> None:
    """A checkpoint's policy spec with any field of any JSON type rebuilds or is an
    RlpipeError in one line, for every kind: a wrong type is named before the class sees it
    (an activation of 7 was a KeyError, a BCQ threshold of null a TypeError when acting)."""
    from rlpipe.errors import RlpipeError
    from rlpipe.nets.networks import _POLICY_CLASSES

    policies = small_policies()
    assert sorted(policy.kind for policy in policies) == sorted(_POLICY_CLASSES)
    for policy in policies:
        spec = spec_of(policies, policy.kind)
        assert build_policy(policy.kind, spec).spec == policy.spec  # control: its own spec, through JSON
        for key in spec:
            for value in SPEC_VALUES.values():
                try:
                    build_policy(policy.kind, {**spec, key: value})
                except RlpipeError as exc:
                    assert str(exc).startswith(f"checkpoint policy spec does not fit {policy.kind}: ") and "\n" not in str(exc)
    for kind, key, value, message in [
        ("actor_critic", "activation", 7, "'activation' is 7, not a string"),
        ("actor_critic", "activation", "x", "unknown activation 'x'"),
        ("discrete_bcq", "threshold", None, "'threshold' is null, not a number"),
        ("discrete_bcq", "threshold", {"k": 1}, 'is {"k": 1}, not a number'),
        ("greedy_q", "encoder", "x", "'encoder' is \"x\", not an object or null"),
        ("greedy_q", "hidden", [8, "x"], "'hidden' is [8, \"x\"], not a list of integers"),
        ("recurrent_categorical", "cell", "rnn", '\'cell\' is "rnn", not "lstm" or "gru"'),
        ("agent_actors", "agents", "ab", "'agents' is \"ab\", not a list of strings"),
        ("tanh_gaussian", "obs_dim", True, "'obs_dim' is true, not an integer"),
        ("tanh_gaussian", "hidden", [*range(1, 30), "x"], "'hidden' is [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 1..., not a list"),
    ]:
        with pytest.raises(RlpipeError, match=re.escape(message)):
            build_policy(kind, {**spec_of(policies, kind), key: value})
    assert build_policy("discrete_bcq", {**spec_of(policies, "discrete_bcq"), "threshold": 1}).threshold == 1  # an integer is a number


def test_actor_critic_matches_torch_distributions() -> None:
    torch.manual_seed(0)
    obs = torch.randn(32, 4)
    disc = ActorCritic(4, 3, discrete=True, hidden=(16, 16))
    head, value = disc(obs)
    assert head.shape == (32, 3) and value.shape == (32,)
    a = disc.sample(head)
    dist = torch.distributions.Categorical(logits=head)
    logp, ent = disc.log_prob_entropy(head, a)
    assert torch.allclose(logp, dist.log_prob(a), atol=1e-6) and torch.allclose(ent, dist.entropy(), atol=1e-6)

    cont = ActorCritic(4, 2, discrete=False, hidden=(16, 16), init_log_std=-0.7)
    head, _ = cont(obs)
    a = cont.sample(head)
    dist = torch.distributions.Normal(head, cont.log_std.exp())
    logp, ent = cont.log_prob_entropy(head, a)
    assert torch.allclose(logp, dist.log_prob(a).sum(-1), atol=1e-5)
    assert torch.allclose(ent, dist.entropy().sum(-1), atol=1e-6)


def test_actor_critic_members_are_separate_networks() -> None:
    ac = ActorCritic(4, 2, discrete=True, hidden=(8,))
    head, value = ac(torch.randn(5, 4))
    value.sum().backward()  # the value loss must not move the policy member
    assert all(layer.weight.grad[0].abs().sum() == 0 for layer in ac.body.layers)


def test_policy_shapes_are_the_built_policys_and_allocate_nothing() -> None:
    """Every kind's shapes from the meta device equal a built copy's, and the probe draws no
    random numbers (loading an expert before collecting must not move the collection's RNG)."""
    from rlpipe.nets.networks import policy_shapes

    policies = small_policies()
    for policy in policies:
        before = torch.get_rng_state()
        shapes = policy_shapes(policy.kind, spec_of(policies, policy.kind))
        assert torch.equal(before, torch.get_rng_state()), policy.kind
        assert shapes == {key: tuple(value.shape) for key, value in policy.state_dict().items()}, policy.kind
