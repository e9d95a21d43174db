"""Discrete offline RL: discrete BCQ, CQL on a QR-DQN base, and BC, CQL and BCQ reading
images and frame stacks. Pieces against hand computations, learning at small budgets on the
shared offline store (each with the control that lacks the mechanism), and refusals."""

from __future__ import annotations

import json
import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

import tests.image_env  # noqa: F401  (registers TinyFrames-v0)
from rlpipe.algos import get_algo, load_policy
from rlpipe.algos.bcq import Config as BCQConfig
from rlpipe.algos.bcq import DiscreteBCQPolicy, discrete_bcq_loss, supported_greedy
from rlpipe.algos.cql import Config as CQLConfig
from rlpipe.algos.cql import dqn_loss
from rlpipe.commands.collect import collect_dataset
from rlpipe.datasets.writer import write_rows
from rlpipe.envs.extras import register_optional
from rlpipe.nets.networks import CategoricalActor, GreedyQPolicy, build_policy
from rlpipe.training import Batch
from rlpipe.training.env import encoder_spec, env_spaces
from rlpipe.training.losses import quantile_huber_loss
from rlpipe.training.optim import adam


def test_supported_greedy_skips_actions_the_data_rarely_takes() -> None:
    # pi(a|s) / max pi: 1, 0.5, 0.2; Q grows with the action index.
    logits = torch.log(torch.tensor([[1.0, 0.5, 0.2]]))
    q = torch.tensor([[1.0, 3.0, 5.0]])
    assert supported_greedy(q, logits, 0.3).item() == 1  # action 2 (ratio 0.2) is excluded
    assert supported_greedy(q, logits, 0.0).item() == 2  # no constraint: DQN's argmax
    assert supported_greedy(q, logits, 0.6).item() == 0  # only the mode is left
    assert supported_greedy(q, logits, 1.0).item() == 0


class Fixed(nn.Module):
    """Returns (Q, logits) by whether the observation is the next one (1) or not (0)."""

    def __init__(self, now: tuple[list[float], list[float]], after: tuple[list[float], list[float]]) -> None:
        super().__init__()
        self.now = [nn.Parameter(torch.tensor([values])) for values in now]
        self.after = [torch.tensor([values]) for values in after]

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return tuple(self.after) if bool(obs.all()) else tuple(self.now)  # type: ignore[return-value]


def test_discrete_bcq_loss_matches_a_hand_computation() -> None:
    # At s': the online network's supported greedy action is 1 (action 2's ratio 0.2 < 0.3),
    # valued by the target network at 20: y = 1 + 0.5 * 20 = 11. At s: Q(s, 0) = 12, so the
    # Huber TD error of 1 costs 0.5; uniform logits cost log 3 in cross-entropy and 0 in penalty.
    online = Fixed(now=([12.0, 0.0, 0.0], [0.0, 0.0, 0.0]), after=([1.0, 3.0, 5.0], [0.0, math.log(0.5), math.log(0.2)]))
    target = Fixed(now=([0.0, 0.0, 0.0], [0.0, 0.0, 0.0]), after=([10.0, 20.0, 30.0], [0.0, 0.0, 0.0]))
    b = Batch(torch.zeros(1, 2), torch.tensor([0]), torch.tensor([1.0]), torch.ones(1, 2), torch.tensor([0.0]))
    config = BCQConfig(dataset="x", gamma=0.5)
    loss, td_loss = discrete_bcq_loss(config, online, target, b)
    assert td_loss.item() == pytest.approx(0.5)
    assert loss.item() == pytest.approx(0.5 + math.log(3))
    terminated = Batch(b.obs, b.actions, b.rewards, b.next_obs, torch.tensor([1.0]))  # y = r = 1: TD error 11
    assert discrete_bcq_loss(config, online, target, terminated)[1].item() == pytest.approx(10.5)


def test_quantile_huber_loss_by_hand_and_its_minimiser_is_the_quantiles() -> None:
    # Quantiles 0 and 1 at fractions 1/4 and 3/4 against one target 0.5: both errors are 0.5
    # (Huber 0.125), weighted |0.25 - 0| and |0.75 - 1|.
    assert quantile_huber_loss(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5]])).item() == pytest.approx(0.0625)
    assert quantile_huber_loss(torch.tensor([[0.0]]), torch.tensor([[3.0]])).item() == pytest.approx(0.5 * 2.5)  # linear past kappa
    torch.manual_seed(0)
    quantiles = nn.Parameter(torch.zeros(1, 4))
    samples = torch.rand(1, 2000)  # uniform on [0, 1]: its quantiles at 1/8, 3/8, 5/8, 7/8
    optimizer = adam([quantiles], 1e-2)
    for _ in range(1500):
        optimizer.zero_grad()
        quantile_huber_loss(quantiles, samples, kappa=0.01).backward()
        optimizer.step()
    torch.testing.assert_close(quantiles.detach(), torch.tensor([[0.125, 0.375, 0.625, 0.875]]), atol=0.03, rtol=0)


def test_cql_on_qr_dqn_puts_its_penalty_on_the_quantiles_means() -> None:
    torch.manual_seed(0)
    q_net, q_target = GreedyQPolicy(3, 4, (16,), quantiles=5), GreedyQPolicy(3, 4, (16,), quantiles=5)
    b = Batch(torch.randn(6, 3), torch.randint(4, (6,)), torch.randn(6), torch.randn(6, 3), torch.zeros(6))
    config = CQLConfig(dataset="x", quantiles=5, beta=2.0)
    loss, gap = dqn_loss(config, q_net, q_target, b)
    with torch.no_grad():
        q = q_net.quantile_values(b.obs).mean(-1)
        expected_gap = (torch.logsumexp(q, -1) - q[torch.arange(6), b.actions]).mean()
        next_quantiles = q_target.quantile_values(b.next_obs)
        best = next_quantiles.mean(-1).argmax(-1)
        target = b.rewards[:, None] + config.gamma * next_quantiles[torch.arange(6), best]
        td = quantile_huber_loss(q_net.quantile_values(b.obs)[torch.arange(6), b.actions], target)
    assert gap.item() == pytest.approx(expected_gap.item(), rel=1e-5)
    assert loss.item() == pytest.approx(td.item() + 2.0 * expected_gap.item(), rel=1e-5)


def test_categorical_actor_reads_images_and_old_specs_are_unchanged() -> None:
    obs_space = env_spaces("TinyFrames-v0")[0]
    actor = CategoricalActor(192, 2, (16,), encoder=encoder_spec(obs_space, frame_stack=2))
    frames = torch.randint(0, 256, (5, 2, 8, 8, 3), dtype=torch.uint8)
    assert actor.act(frames).shape == (5,) and actor.dist(frames).logits.shape == (5, 2)
    rebuilt = build_policy(actor.kind, json.loads(json.dumps(actor.spec)))
    rebuilt.load_state_dict(actor.state_dict())
    # Without an encoder, the spec and weights are those checkpoints held before encoders.
    flat = CategoricalActor(4, 2, (8,))
    assert set(flat.spec) == {"obs_dim", "n_actions", "hidden", "activation", "normalize_obs"}
    assert set(flat.state_dict()) == {"net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"}


def test_discrete_bcq_policy_acts_within_the_support_and_rebuilds_from_json() -> None:
    torch.manual_seed(0)
    policy = DiscreteBCQPolicy(4, 3, (16,), threshold=0.3)
    obs = torch.randn(7, 4)
    q, logits = policy(obs)
    action = policy.act(obs)
    ratio = torch.softmax(logits, -1).gather(1, action.view(-1, 1)) / torch.softmax(logits, -1).max(-1, keepdim=True).values
    assert bool((ratio >= 0.3 - 1e-6).all())
    rebuilt = build_policy(policy.kind, json.loads(json.dumps(policy.spec)))
    rebuilt.load_state_dict(policy.state_dict())
    torch.testing.assert_close(rebuilt.act(obs), action)


@pytest.fixture(scope="module")
def frames_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    store = tmp_path_factory.mktemp("frames")
    collect_dataset("TinyFrames-v0", episodes=20, name="frames-random", store=store, progress=False)
    return store


@pytest.mark.parametrize(
    "algo, settings, kind",
    [("bc", {}, "categorical"), ("cql", {"quantiles": 4}, "greedy_q"), ("bcq", {}, "discrete_bcq")],
)
def test_discrete_algorithms_train_on_frame_stacks_and_act(
    frames_store: Path, tmp_path: Path, algo: str, settings: dict, kind: str
) -> None:
    spec = get_algo(algo)
    config = spec.make_config(
        "TinyFrames-v0",
        dataset="frames-random",
        store=str(frames_store),
        updates=10,
        eval_every=10,
        eval_episodes=2,
        hidden=(16,),
        frame_stack=2,
        **settings,
    )
    result = spec.train(config, tmp_path / algo, progress=False)
    assert result.policy.spec["encoder"]["frame_stack"] == 2 and result.metrics["eval_return_mean"] >= 0
    loaded = load_policy(tmp_path / algo)
    assert loaded.actor.kind == kind


@pytest.mark.slow
def test_discrete_bcq_learns_cartpole_and_its_constraint_matters(offline_store: Path, learning_seed: int, record_property) -> None:
    """Expert-only data (one action per state): BCQ acts within it and matches the expert;
    the control without the constraint (threshold 0: double DQN) values the actions the
    data never takes by extrapolation and collapses onto one action."""
    bcq = get_algo("bcq")
    settings = dict(dataset="cartpole-expert", store=str(offline_store), seed=learning_seed)
    result = bcq.train(bcq.make_config("CartPole-v1", updates=3000, eval_every=500, stop_at_return=475.0, **settings), progress=False)
    control = bcq.train(bcq.make_config("CartPole-v1", updates=500, eval_every=500, threshold=0.0, **settings), progress=False)
    returns = result.metrics["eval_return_mean"], control.metrics["eval_return_mean"]
    record_property("returns", returns)
    # Seeds 0-4: BCQ 500.0 at its first evaluation (500 updates) for every seed; the control 9.1-9.7.
    assert returns[0] >= 450 and returns[1] <= 50, returns


@pytest.mark.slow
def test_cql_penalty_matters_on_narrow_data(offline_store: Path, learning_seed: int, record_property) -> None:
    """CQL on expert-only data beats its penalty-0 control (plain DQN on the same data) by
    at least 350. Seeds 0-4: CQL 500.0 after 1000 updates for every seed, the control 9.1-9.7.
    CQL stops at 475 (at most 6000 updates): another CPU converges later, as another seed does."""
    cql = get_algo("cql")
    settings = dict(dataset="cartpole-expert", store=str(offline_store), seed=learning_seed)
    result = cql.train(cql.make_config("CartPole-v1", updates=6000, eval_every=500, stop_at_return=475.0, **settings), progress=False)
    control = cql.train(cql.make_config("CartPole-v1", updates=1000, eval_every=500, beta=0.0, **settings), progress=False)
    returns = result.metrics["eval_return_mean"], control.metrics["eval_return_mean"]
    record_property("returns", returns)
    assert returns[0] - returns[1] >= 350, returns


@pytest.mark.heavy
def test_cql_on_qr_dqn_learns_cartpole(offline_store: Path, learning_seed: int, record_property) -> None:
    """The QR-DQN base (50 quantiles) with the penalty on the quantiles' means matches the
    expert too. The budget runs on until the expert's level (475) is reached, up to 5000
    updates: at 1500 updates an Intel Xeon's seed 0 scored 358.1 (AMD EPYC 466.9), the
    expert data itself differing from CPU to CPU. Seeds 0-9 on AMD EPYC, each stopping at its
    first evaluation at or above 475 or at 5000 updates: 494.1, 487.7, 500.0, 500.0, 500.0,
    491.7, 496.8, 475.2, 491.9, 500.0 (held-out seeds 5-9 included; smallest 475.2)."""
    cql = get_algo("cql")
    config = cql.make_config(
        "CartPole-v1",
        dataset="cartpole-expert",
        store=str(offline_store),
        quantiles=50,
        updates=5000,
        eval_every=500,
        stop_at_return=475.0,
        seed=learning_seed,
    )
    result = cql.train(config, progress=False).metrics["eval_return_mean"]
    record_property("eval_return_mean", result)
    assert result >= 400, result


def test_bad_discrete_settings_are_refused_in_one_line(offline_store: Path, tmp_path: Path, cli) -> None:
    for args, message in [
        (["bcq", "--dataset", "pendulum-mixed", "--set", "frame_stack=2"], "bcq reads images and frame stacks with discrete actions only"),
        (["cql", "--dataset", "pendulum-mixed", "--set", "frame_stack=2"], "cql reads images and frame stacks with discrete actions only"),
        (["bc", "--dataset", "pendulum-mixed", "--set", "frame_stack=2"], "bc reads images and frame stacks with discrete actions only"),
        (["cql", "--dataset", "pendulum-mixed", "--set", "quantiles=5"], "setting quantiles=5: a QR-DQN base needs discrete actions"),
        (["cql", "--dataset", "cartpole-expert", "--set", "quantiles=-1"], "setting quantiles=-1: expected an integer >= 0"),
        (["bcq", "--dataset", "cartpole-expert", "--set", "threshold=1.5"], "setting threshold=1.5: expected a number in [0, 1]"),
        (["bcq", "--dataset", "cartpole-expert", "--set", "frame_stack=0"], "frame_stack=0: expected a positive number"),
    ]:
        result = cli("train", *args, "--store", offline_store, "--out", tmp_path / "bad", "--no-progress")
        assert result.code == 2 and message in result.err and result.err.count("\n") <= 1, (args, result.err)
    assert not (tmp_path / "bad").exists()


BREAKOUT = "MinAtar/Breakout-v1"


def tracker_action(obs: np.ndarray, rng: np.random.Generator, eps: float) -> int:
    """A scripted MinAtar Breakout player: move the paddle (channel 0, bottom row) under the
    ball (channel 1); a uniform random action with probability ``eps``. Actions: 0 stay, 1 left, 2 right."""
    ball = np.argwhere(obs[:, :, 1])
    if rng.random() < eps or len(ball) == 0:
        return int(rng.integers(3))
    ball_x, paddle_x = int(ball[0][1]), int(np.argmax(obs[-1, :, 0]))
    return 1 if ball_x < paddle_x else 2 if ball_x > paddle_x else 0


def tracker_rollout(episodes: int, eps: float, seed: int = 0) -> tuple[gym.Env, list[dict[str, np.ndarray]]]:
    """Episodes of MinAtar Breakout played by `tracker_action`, as dataset row blocks."""
    env, rng, blocks = gym.make(BREAKOUT), np.random.default_rng(seed), []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        rows: dict[str, list] = {name: [] for name in ("obs", "action", "reward", "next_obs", "terminated", "truncated", "step")}
        done = False
        while not done:
            action = tracker_action(obs, rng, eps)
            following, reward, terminated, truncated, _ = env.step(action)
            for name, value in zip(rows, (obs, action, reward, following, terminated, truncated, len(rows["step"]))):
                rows[name].append(value)
            obs, done = following, terminated or truncated
        block = {name: np.asarray(values) for name, values in rows.items()}
        block["episode_id"] = np.full(len(block["step"]), episode)
        blocks.append(block)
    return env, blocks


@pytest.mark.heavy
def test_bc_cql_and_bcq_learn_minatar_breakout_from_images(tmp_path: Path, learning_seed: int, record_property) -> None:
    """30 episodes (920 frames of 10 x 10 x 4) of a noisy scripted tracker (eps 0.1; it
    scores 2.37 in them; uniform random actions score about 0.7): BC, CQL and BCQ read the
    frames through MinAtar's CNN and beat the random policy; CQL's penalty-0 control does not.
    Seeds 0-4 after 1000 updates: BC 3.9, 2.5, 3.8, 2.8, 2.7; CQL 4.0, 3.6, 3.9, 3.6, 3.0;
    BCQ 3.9, 2.3, 2.2, 2.1, 2.3; the control 0.3, 0.0, 0.3, 0.1, 0.1."""
    pytest.importorskip("minatar")
    register_optional(BREAKOUT)
    env, blocks = tracker_rollout(30, eps=0.1)
    producer = {"algorithm": "scripted", "seed": 0, "params": {}, "num_envs": 1, "checkpoint_sha256": None}
    write_rows(
        "breakout-tracker", blocks, env.observation_space, env.action_space, env_id=BREAKOUT, producer=producer, store=tmp_path, fmt="arrow"
    )
    returns = {}
    for name, algo, settings in [("bc", "bc", {}), ("cql", "cql", {}), ("bcq", "bcq", {}), ("cql-beta0", "cql", {"beta": 0.0})]:
        spec = get_algo(algo)
        config = spec.make_config(
            BREAKOUT,
            dataset="breakout-tracker",
            store=str(tmp_path),
            updates=1000,
            eval_every=1000,
            batch_size=64,
            seed=learning_seed,
            **settings,
        )
        returns[name] = spec.train(config, progress=False).metrics["eval_return_mean"]
    record_property("returns", returns)
    assert min(returns["bc"], returns["cql"], returns["bcq"]) >= 1.5 and returns["cql-beta0"] <= 0.5, returns


@pytest.mark.heavy
def test_bcq_beats_its_own_imitation_on_a_dqn_replay_of_minatar_breakout(tmp_path: Path, learning_seed: int, record_property, cli) -> None:
    """Every transition of a 30k-frame DQN run on MinAtar Breakout (seed 0; epsilon falls from
    1 to 0.73, the episodes average 0.49), data like the pipeline's `*-minatar-breakout-30k`
    stages read (their 100k replay's first 30k frames): BCQ's Q-learning within the data's
    support beats the control that removes only it, the same BCQ with ``threshold=1.0`` (the
    same network, trained the same way, acting on its imitation head's most likely action).
    Held-out returns (100 episodes) after 5000 updates, seeds 0-4: BCQ 3.40, 2.89, 3.22, 3.15,
    3.56; the control 0.79, 1.47, 1.50, 1.78, 2.04 (BCQ's lead 1.37 to 2.61). Held-out seeds 5-9:
    BCQ 3.30, 3.16, 2.84, 3.75, 3.84; the control 1.72, 1.77, 1.54, 1.57, 1.42 (lead 1.30 to 2.42)."""
    pytest.importorskip("minatar")
    collect = ["collect", "--expert", "dqn", "--from-training", "--env", BREAKOUT, "--expert-steps", "30000", "--seed", "0"]
    result = cli(*collect, "--expert-run", tmp_path / "dqn", "--name", "replay-30k", "--store", tmp_path, "--quiet")
    assert result.code == 0, result.err
    spec, returns = get_algo("bcq"), {}
    for name, extra in (("bcq", {}), ("threshold=1", {"threshold": 1.0})):
        config = spec.make_config(
            BREAKOUT,
            dataset="replay-30k",
            store=str(tmp_path),
            updates=5000,
            eval_every=5000,
            eval_episodes=50,
            seed=learning_seed,
            **extra,
        )
        returns[name] = spec.train(config, progress=False).metrics["heldout_return_mean"]
    record_property("returns", returns)
    assert returns["bcq"] >= returns["threshold=1"] + 0.5, returns
