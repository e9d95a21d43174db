"""Decision Transformer: causal, padding-blind predictions; the return-to-go bookkeeping of its
policy in `evaluate`; a saved run evaluates and refuses export; it learns; and the target
return steers it: on mixed-quality data a low target earns less than a high one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlpipe.algos import get_algo, load_policy
from rlpipe.algos.dt import DecisionTransformer, ReturnConditionedPolicy
from rlpipe.training import ActionScaler, evaluate
from rlpipe.training.evaluation import EpisodicPolicy, RewardConditionedPolicy

K, OBS, ACT = 4, 3, 2


def small_model(discrete: bool = False, target_return: float = 10.0) -> DecisionTransformer:
    """K-step windows, timesteps below 50, 16-dim embeddings, 2 layers of 2 heads, no dropout."""
    torch.manual_seed(0)
    return DecisionTransformer(OBS, ACT, discrete, K, 50, target_return, 0.1, 16, 2, 2, 0.0, normalize_obs=False).eval()


def window_inputs(discrete: bool = False, batch: int = 3) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    actions = torch.randint(ACT, (batch, K), generator=generator) if discrete else torch.rand(batch, K, ACT, generator=generator) * 2 - 1
    return [
        torch.randn(batch, K, OBS, generator=generator),
        actions,
        torch.randn(batch, K, generator=generator) * 10,
        torch.randint(50, (batch, K), generator=generator),
        torch.ones(batch, K, dtype=torch.bool),
    ]


@pytest.mark.parametrize("discrete", [False, True])
def test_predicts_an_action_per_step(discrete: bool) -> None:
    out = small_model(discrete)(*window_inputs(discrete))
    assert out.shape == (3, K, ACT)  # logits over the ACT actions, or an ACT-dim action
    if not discrete:
        assert out.abs().max() < 1.0


@pytest.mark.parametrize("discrete", [False, True])
def test_a_later_token_does_not_change_an_earlier_prediction(discrete: bool) -> None:
    model, inputs = small_model(discrete), window_inputs(discrete)
    before = model(*inputs)
    for column in range(4):  # obs, action, return-to-go, timestep of step 2
        changed = [x.clone() for x in inputs]
        value = changed[column][:, 2] + 1  # integers (a discrete action, a timestep) stay in range
        changed[column][:, 2] = value if value.is_floating_point() else value % (ACT if column == 1 else 50)
        after = model(*changed)
        torch.testing.assert_close(after[:, :2], before[:, :2])  # steps 0-1 do not see step 2
        if column == 1:  # nor does step 2's prediction see its own action (the token after its observation)
            torch.testing.assert_close(after[:, 2], before[:, 2])
        else:
            assert not torch.allclose(after[:, 2], before[:, 2])


def test_padding_does_not_change_the_real_steps_predictions() -> None:
    model, inputs = small_model(), window_inputs()
    mask = torch.tensor([[False, False, True, True]] * 3)
    inputs[-1] = mask
    before = model(*inputs)
    garbage = [x.clone() for x in inputs]
    for column in range(4):
        garbage[column][:, :2] = garbage[column][:, :2] * 7 + 3
    after = model(*garbage)
    assert torch.isfinite(after).all()
    torch.testing.assert_close(after[:, 2:], before[:, 2:])


def test_policy_keeps_returns_to_go_per_env() -> None:
    model = small_model(target_return=10.0)
    policy = ReturnConditionedPolicy(model, ActionScaler(spaces.Box(-2, 2, (ACT,))))
    assert isinstance(policy, EpisodicPolicy) and isinstance(policy, RewardConditionedPolicy)
    policy.start_episodes(np.ones(2, bool))
    for step in range(6):
        action = policy(np.full((2, OBS), step, np.float32))
        assert action.shape == (2, ACT) and np.abs(action).max() <= 2.0
        policy.record_rewards(np.array([1.0, 2.0]))
    # Six steps: the window holds the last K, each with the return-to-go it acted for (10 less the
    # rewards before it) and its timestep.
    np.testing.assert_allclose(policy.returns_to_go.numpy(), [[8, 7, 6, 5], [6, 4, 2, 0]])
    np.testing.assert_array_equal(policy.timesteps.numpy(), [[2, 3, 4, 5]] * 2)
    np.testing.assert_array_equal(policy.obs[:, :, 0].numpy(), [[2, 3, 4, 5]] * 2)
    np.testing.assert_allclose(policy.return_to_go, [4.0, -2.0])
    policy.start_episodes(np.array([False, True]))  # env 1 starts again: only its window is empty
    policy(np.zeros((2, OBS), np.float32))
    np.testing.assert_array_equal(policy.length.numpy(), [K, 1])
    np.testing.assert_allclose(policy.returns_to_go[:, -1].numpy(), [4.0, 10.0])
    assert policy.timesteps[1, -1] == 0


class RewardTally:
    """Sums the rewards and counts the steps `evaluate` reports to each env between its episode starts."""

    def __init__(self) -> None:
        self.tally, self.steps = np.zeros(0), np.zeros(0, int)
        self.closed: list[list[tuple[float, int]]] = []

    def start_episodes(self, rows: np.ndarray) -> None:
        if len(self.tally) != len(rows):  # the first call: every env starts
            self.tally, self.steps, self.closed = np.zeros(len(rows)), np.zeros(len(rows), int), [[] for _ in rows]
            return
        for i in np.flatnonzero(rows):
            self.closed[i].append((float(self.tally[i]), int(self.steps[i])))
            self.tally[i], self.steps[i] = 0.0, 0

    def record_rewards(self, rewards: np.ndarray) -> None:
        self.tally += rewards
        self.steps += 1

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        return np.zeros((len(obs), 1), np.float32)


def test_evaluate_reports_each_steps_rewards_before_the_episode_starts() -> None:
    policy = RewardTally()
    result = evaluate(policy, "Pendulum-v1", episodes=6, seed=0, max_envs=3)  # two episodes per env
    assert [closed[0] for closed in policy.closed] == [(result.returns[2 * i], 201) for i in range(3)]
    # 200 steps and the autoreset step (reward 0) before the next start: a new episode starts at step 0.


@pytest.fixture(scope="module")
def cartpole_run(offline_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dt = get_algo("dt")
    out = tmp_path_factory.mktemp("dt") / "run"
    config = dt.make_config(
        "CartPole-v1",
        dataset="cartpole-expert",
        store=str(offline_store),
        updates=20,
        eval_every=20,
        eval_episodes=1,
        heldout_eval_episodes=0,
        embedding_dim=16,
        target_return=123.0,
    )
    dt.train(config, out, progress=False)
    return out


def test_a_saved_run_acts_for_its_target_return_and_evaluates(cli, cartpole_run: Path) -> None:
    policy = load_policy(cartpole_run)
    assert isinstance(policy._fn, ReturnConditionedPolicy) and policy._fn.target_return == 123.0
    result = cli("eval", cartpole_run, "--episodes", "2", "--json")
    assert result.code == 0, result.err
    assert '"algo": "dt"' in result.out


def test_export_refuses_a_dt_run_in_one_line(cli, cartpole_run: Path, tmp_path: Path) -> None:
    result = cli("export", cartpole_run, "--onnx", tmp_path / "p.onnx", "--torchscript", tmp_path / "p.pt")
    assert result.code == 2 and "cannot be exported" in result.err and "returns-to-go" in result.err
    assert len(result.err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


# A DT small enough for a CPU test: 32-dim embeddings, 2 layers, 10-step windows, lr 1e-3.
SMALL = dict(embedding_dim=32, layers=2, context=10, learning_rate=1e-3, warmup_steps=100, heldout_eval_episodes=0)


@pytest.mark.slow
def test_dt_imitates_the_cartpole_expert(offline_store: Path, learning_seed: int, record_property) -> None:
    dt = get_algo("dt")
    config = dt.make_config(
        "CartPole-v1", dataset="cartpole-expert", store=str(offline_store), seed=learning_seed, updates=300, eval_every=300, **SMALL
    )
    result = dt.train(config, progress=False).metrics["eval_return_mean"]
    record_property("eval_return_mean", result)
    assert result >= 450.0, result


def conditioned_returns(offline_store: Path, seed: int, targets: tuple[float, ...], **overrides: float) -> list[float]:
    """A DT trained on `pendulum-mixed` (seed `seed`), evaluated acting for each target return."""
    dt = get_algo("dt")
    config = dt.make_config(
        "Pendulum-v1",
        dataset="pendulum-mixed",
        store=str(offline_store),
        seed=seed,
        updates=1500,
        eval_every=1500,
        eval_episodes=1,
        **{**SMALL, **overrides},
    )
    model = dt.train(config, progress=False).policy
    scaler = ActionScaler(spaces.Box(-2.0, 2.0, (1,), np.float32))
    return [
        evaluate(ReturnConditionedPolicy(model, scaler, target_return=target), "Pendulum-v1", 20, 10_000 + seed).mean for target in targets
    ]


@pytest.mark.slow
def test_a_low_target_return_earns_less_than_a_high_one(offline_store: Path, learning_seed: int, record_property) -> None:
    # The data's episodes (a SAC run from scratch) earn -1775 to -0.5, most of them -800 to -1600.
    high, low = conditioned_returns(offline_store, learning_seed, (-300.0, -1200.0))
    record_property("high_target_return", high)
    record_property("low_target_return", low)
    assert high - low >= 200.0, (high, low)


@pytest.mark.heavy
def test_with_returns_to_go_shuffled_the_target_changes_little(offline_store: Path, learning_seed: int, record_property) -> None:
    """Control: the same training with each row's return-to-go taken from a random row of the
    same timestep, so the token keeps its scale but says nothing of its episode; the two
    targets then act alike (up to the rollouts' own differences)."""
    high, low = conditioned_returns(offline_store, learning_seed, (-300.0, -1200.0), shuffle_returns_to_go=True)
    record_property("high_target_return", high)
    record_property("low_target_return", low)
    assert abs(high - low) < 200.0, (high, low)
