"""Unit tests of the pieces shared by the online algorithms."""

from __future__ import annotations

import json
import pickle

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlpipe.algos import load_policy
from rlpipe.envs.spaces import require_spaces, space_from_json, space_to_json
from rlpipe.errors import RlpipeError
from rlpipe.nets.checkpoint import load_checkpoint, save_checkpoint
from rlpipe.nets.networks import CategoricalActor, TanhGaussianActor
from rlpipe.training import ActionScaler, ReplayBuffer, VecStepper, evaluate, make_vec_env, policy_fn
from rlpipe.training.env import resolve_device
from rlpipe.training.noise import OUNoise
from rlpipe.training.onpolicy import compute_gae
from rlpipe.training.run import EVAL_SEED_OFFSET


def test_gae_matches_hand_computed_example() -> None:
    # One env, 5 steps: an episode terminates at t=1, t=2 is the autoreset step, t=4 is
    # truncated (bootstraps from V(final obs) = values[t+1] = next_value here).
    g, lam = 0.9, 0.5
    r = [1.0, 2.0, 0.0, 3.0, 4.0]
    v = [0.5, 1.0, 7.0, 2.0, 1.5]
    nv = 3.0
    term = [False, True, False, False, False]
    trunc = [False, False, False, False, True]
    valid = [True, True, False, True, True]
    t = lambda x, dt=torch.float32: torch.tensor(x, dtype=dt).unsqueeze(-1)  # noqa: E731
    adv, ret = compute_gae(t(r), t(v), torch.tensor([nv]), t(term, torch.bool), t(trunc, torch.bool), t(valid), g, lam)
    d4 = 4.0 + g * nv - 1.5
    d3 = 3.0 + g * 1.5 - 2.0
    d1 = 2.0 - 1.0
    d0 = 1.0 + g * 1.0 - 0.5
    expected = [d0 + g * lam * d1, d1, 0.0, d3 + g * lam * d4, d4]
    assert torch.allclose(adv.squeeze(-1), torch.tensor(expected), atol=1e-6)
    assert torch.allclose(ret.squeeze(-1), torch.tensor(expected) + torch.tensor(v), atol=1e-6)


def test_ou_noise_statistics() -> None:
    theta, sigma, dt = 0.5, 0.3, 0.1
    noise = OUNoise((4000, 1), sigma, np.random.default_rng(0), theta=theta, dt=dt)
    xs = np.stack([noise() for _ in range(400)])[:, :, 0]  # [time, independent chains]
    a = 1 - theta * dt
    stationary_var = sigma**2 * dt / (1 - a**2)
    late = xs[200:]
    assert abs(late.mean()) < 0.01
    assert abs(late.var() / stationary_var - 1) < 0.05
    lag1 = np.mean(late[1:] * late[:-1]) / late.var()
    assert abs(lag1 - a) < 0.01
    increments = xs[1:] - a * xs[:-1]  # must be N(0, sigma^2 dt)
    assert abs(increments.std() / (sigma * np.sqrt(dt)) - 1) < 0.02
    noise(np.ones(4000, bool))  # reset restarts from mu, one step later var = sigma^2 dt
    assert abs(noise.x.var() / (sigma**2 * dt) - 1) < 0.1


def test_action_scaler_maps_unit_box_to_bounds() -> None:
    box = spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 10.0], np.float32))
    s = ActionScaler(box)
    a = np.array([[-1.0, -1.0], [0.0, 0.0], [1.0, 1.0], [5.0, -5.0]])
    assert np.allclose(s.to_env(a), [[-2, 0], [0, 5], [2, 10], [2, 0]])
    assert s.to_env(a).dtype == np.float32
    assert np.allclose(s.from_env(s.to_env(a[:3])), a[:3])
    d = ActionScaler(spaces.Discrete(3, start=1))
    assert d.to_env(np.array([0, 2])).tolist() == [1, 3]
    unbounded = ActionScaler(spaces.Box(-np.inf, np.inf, (1,), np.float32))
    assert unbounded.to_env(np.array([7.0])).tolist() == [7.0]


def test_replay_buffer_wraps_and_samples_stored_rows() -> None:
    buf = ReplayBuffer(5, obs_dim=2, act_dim=1, seed=0)
    for i in range(7):
        buf.add(np.full((1, 2), i), np.full((1, 1), i), np.array([i]), np.full((1, 2), i + 1), np.array([i % 2]))
    assert len(buf) == 5 and buf.pos == 2
    assert sorted(buf.rewards.tolist()) == [2, 3, 4, 5, 6]
    b = buf.sample(64)
    assert b.obs.shape == (64, 2) and b.actions.shape == (64, 1)
    assert torch.all(b.next_obs[:, 0] == b.obs[:, 0] + 1) and torch.all(b.rewards == b.obs[:, 0])
    assert torch.all(b.terminated == b.rewards % 2)


def test_replay_buffer_sampling_is_seeded() -> None:
    def draw(seed: int) -> torch.Tensor:
        buf = ReplayBuffer(100, 1, 1, seed=seed)
        buf.add(np.arange(100)[:, None], np.zeros((100, 1)), np.arange(100), np.zeros((100, 1)), np.zeros(100))
        return buf.sample(32).rewards

    assert torch.equal(draw(3), draw(3)) and not torch.equal(draw(3), draw(4))


def test_stepper_reports_real_final_obs_and_marks_reset_steps() -> None:
    envs = make_vec_env("Pendulum-v1", 2, max_episode_steps=5)
    seen = []
    stepper = VecStepper(envs, ActionScaler(envs.single_action_space), seed=0, step_sink=seen.append)
    batches = [stepper.step(np.zeros((2, 1))) for _ in range(7)]
    envs.close()
    assert [b.truncated.all() for b in batches] == [False] * 4 + [True, False, False]
    assert [b.valid.all() for b in batches] == [True] * 5 + [False, True]
    final, reset = batches[4].next_obs, batches[5].next_obs
    assert np.allclose(batches[5].obs, final)  # the reset step starts from the final obs...
    assert not np.allclose(final, reset)  # ...and returns the next episode's first obs
    assert stepper.env_steps == 12 and stepper.episodes == 2
    assert len(seen) == 7 and seen[4] is batches[4] and np.array_equal(seen[5].valid, [False, False])
    assert batches[4].finished.all() and not batches[5].finished.any()
    assert np.array_equal(batches[4].episode_length, [5, 5]) and np.allclose(batches[4].episode_return, sum(b.rewards for b in batches[:5]))
    assert stepper.last_return == pytest.approx(batches[4].episode_return[-1])
    for t in range(4):  # consecutive transitions chain
        assert np.allclose(batches[t].next_obs, batches[t + 1].obs)


def test_stepper_refuses_same_step_autoreset() -> None:
    """A same-step autoreset env returns the reset observation as next_obs: refused, in one line."""
    same_step = gym.make_vec(
        "CartPole-v1", 2, vectorization_mode="sync", vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
    )
    with pytest.raises(RlpipeError, match="autoreset mode .*SAME_STEP"):
        VecStepper(same_step, None, seed=0)
    next_step = gym.make_vec("CartPole-v1", 2, vectorization_mode="sync")  # control: the default mode is accepted
    assert VecStepper(next_step, None, seed=0).step(np.zeros(2, np.int64)).valid.all()


def test_evaluate_is_deterministic_and_counts_episodes() -> None:
    policy = lambda obs: np.zeros(len(obs), dtype=np.int64)  # noqa: E731
    a = evaluate(policy, "CartPole-v1", episodes=7, seed=3, max_envs=3)
    b = evaluate(policy, "CartPole-v1", episodes=7, seed=3, max_envs=3)
    assert len(a.returns) == 7 and a == b
    assert all(5 <= r <= 20 for r in a.returns)  # always pushing left falls over quickly
    assert a.returns == [float(n) for n in a.lengths]


def test_space_and_device_errors_are_one_line() -> None:
    envs = make_vec_env("CartPole-v1", 1)
    with pytest.raises(RlpipeError, match=r"^sac needs a continuous \(Box\) action space; CartPole-v1 has Discrete\(2\)$"):
        require_spaces("sac", "CartPole-v1", envs.single_observation_space, envs.single_action_space, ("box",))
    envs.close()
    with pytest.raises(RlpipeError, match="unknown environment 'NoSuchEnv-v0'"):
        make_vec_env("NoSuchEnv-v0")
    assert resolve_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(RlpipeError, match="no CUDA device"):
            resolve_device("cuda")


def _save_tiny_run(tmp_path, seed: int = 0):
    torch.manual_seed(seed)
    actor = TanhGaussianActor(3, 1, hidden=(8,))
    space = gym.make("Pendulum-v1").action_space
    meta = {
        "algo": "sac",
        "env_id": "Pendulum-v1",
        "action_space": space_to_json(space),
        "policy": {"kind": actor.kind, "spec": actor.spec},
        "config": {"seed": seed},
    }
    return actor, space, save_checkpoint(tmp_path, {"policy": actor}, meta)


def test_checkpoint_round_trip_without_pickle(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    actor, space, digest = _save_tiny_run(tmp_path)
    assert (tmp_path / "model.safetensors").read_bytes()[8:9] == b"{"  # safetensors header, not a pickle
    _, _, digest_again = _save_tiny_run(tmp_path / "again")
    assert digest == digest_again  # same weights -> same file -> same hash

    def no_pickle(*args, **kwargs):
        raise AssertionError("checkpoint loading must not unpickle")

    monkeypatch.setattr(pickle, "load", no_pickle)
    monkeypatch.setattr(pickle, "loads", no_pickle)
    monkeypatch.setattr(pickle, "Unpickler", no_pickle)
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.sha256 == digest
    for key, value in actor.state_dict().items():
        assert torch.equal(ckpt.state_dict("policy")[key], value)
    policy = load_policy(tmp_path)
    obs = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    expected = policy_fn(actor, ActionScaler(space))(obs)
    assert np.allclose(policy(obs), expected) and policy(obs).shape == (4, 1)
    assert np.all(np.abs(policy(obs)) <= 2.0)
    assert policy.env_id == "Pendulum-v1" and policy.checkpoint_sha256 == digest


@pytest.mark.parametrize(
    "old_form",
    [
        {"type": "Box", "low": [-2.0], "high": [2.0], "dtype": "float32"},  # checkpoint.json before Minari's form
        {"type": "Box", "low": [-2.0], "high": [2.0]},
    ],
)
def test_checkpoints_with_the_old_space_json_still_load(tmp_path, old_form: dict) -> None:
    actor, space, _ = _save_tiny_run(tmp_path)
    meta_path = tmp_path / "checkpoint.json"
    meta = json.loads(meta_path.read_text())
    assert meta["action_space"] == {"type": "Box", "dtype": "float32", "shape": [1], "low": [-2.0], "high": [2.0]}  # Minari's
    meta["action_space"] = old_form
    meta_path.write_text(json.dumps(meta))
    policy = load_policy(tmp_path)
    obs = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    assert policy.action_space == space and np.array_equal(policy(obs), policy_fn(actor, ActionScaler(space))(obs))
    assert space_from_json({"type": "Discrete", "n": 3, "start": 1}) == spaces.Discrete(3, start=1)


def test_corrupted_checkpoint_is_rejected(tmp_path) -> None:
    _save_tiny_run(tmp_path)
    weights = tmp_path / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(RlpipeError, match="do not match their recorded sha256"):
        load_policy(tmp_path)
    with pytest.raises(RlpipeError, match="no checkpoint"):
        load_policy(tmp_path / "missing")


def test_categorical_policy_fn_returns_env_actions() -> None:
    actor = CategoricalActor(4, 3)
    fn = policy_fn(actor, ActionScaler(spaces.Discrete(3, start=10)))
    out = fn(np.zeros((5, 4), np.float32))
    assert out.shape == (5,) and set(out.tolist()) <= {10, 11, 12}


def test_eval_sampled_actions_scores_the_policy_as_it_samples() -> None:
    """With eval_sampled_actions the evaluation (and so stop_at_return) acts with the policy's
    sampled actions: the same untrained SAC actor (same seed, no updates yet) scores otherwise
    than with its mode, which the default evaluation scores."""
    from rlpipe.algos import get_algo

    sac = get_algo("sac")
    common = dict(env_steps=100, learning_starts=1_000, eval_every=100, eval_episodes=2, heldout_eval_episodes=0, hidden=(16, 16))
    mode = sac.train(sac.make_config("Pendulum-v1", **common), progress=False)
    sampled = sac.train(sac.make_config("Pendulum-v1", eval_sampled_actions=True, **common), progress=False)
    assert all(torch.equal(a, b) for a, b in zip(mode.policy.state_dict().values(), sampled.policy.state_dict().values()))
    scaler = ActionScaler(gym.make("Pendulum-v1").action_space)
    assert evaluate(policy_fn(mode.policy, scaler), "Pendulum-v1", 2, EVAL_SEED_OFFSET).mean == mode.metrics["eval_return_mean"]
    assert sampled.metrics["eval_return_mean"] != mode.metrics["eval_return_mean"]
