"""Cal-QL: discounted returns-to-go (dataset rows and online rows), the bound on the policy
proposals' Q against a hand computation, its settings, the control against CQL, a fine-tuned CLI
run, and fine-tuning's lift on random data against the same updates offline."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from rlpipe.algos import get_algo
from rlpipe.algos.calql import Config
from rlpipe.algos.cql import critic_loss, data_and_sampled_q, proposal_samples
from rlpipe.algos.sac import SoftActorCritic
from rlpipe.datasets.frames import chain_starts, discounted_returns_to_go, returns_to_go
from rlpipe.datasets.loader import TransitionArrays
from rlpipe.envs.stepper import StepBatch
from rlpipe.training.buffer import Batch, ReplayBuffer, ReturnsToGo
from rlpipe.training.offline import DatasetAndOnline
from rlpipe.training.sampler import TransitionSampler


def looped_returns(reward: np.ndarray, episode_id: np.ndarray, step: np.ndarray, gamma: float) -> np.ndarray:
    """The reference: row by row from the end, restarting where the next row is not the same episode's next step."""
    out = np.zeros(len(reward))
    for t in reversed(range(len(reward))):
        continues = t + 1 < len(reward) and episode_id[t + 1] == episode_id[t] and step[t + 1] == step[t] + 1
        out[t] = reward[t] + (gamma * out[t + 1] if continues else 0.0)
    return out


def transitions(rewards: list[float], episode_id: list[int], step: list[int]) -> TransitionArrays:
    rows = len(rewards)
    return TransitionArrays(
        obs=np.arange(rows, dtype=np.float32).reshape(rows, 1),
        action=np.zeros((rows, 1), np.float32),
        reward=np.asarray(rewards, np.float32),
        next_obs=np.zeros((rows, 1), np.float32),
        terminated=np.zeros(rows, bool),
        truncated=np.zeros(rows, bool),
        episode_id=np.asarray(episode_id, np.int64),
        step=np.asarray(step, np.int64),
    )


@pytest.mark.parametrize("gamma", [0.9, 0.99])
def test_discounted_returns_to_go_match_a_loop_over_episodes_and_gaps(gamma: float) -> None:
    rng = np.random.default_rng(0)
    lengths = [1, 7, 300, 2, 64, 1000, 5]  # the 300-step episode loses steps 100-109 (a subset's gap)
    episode_id = np.concatenate([np.full(n, i) for i, n in enumerate(lengths)])
    step = np.concatenate([np.arange(n) for n in lengths])
    keep = ~((episode_id == 2) & (step >= 100) & (step < 110))
    episode_id, step = episode_id[keep], step[keep]
    reward = rng.normal(size=len(step)).astype(np.float32)
    got = discounted_returns_to_go(reward, chain_starts(episode_id, step), gamma)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, looped_returns(reward, episode_id, step, gamma), rtol=1e-5, atol=1e-5)
    # gamma 1 is the undiscounted sum the sequence models read
    starts = chain_starts(episode_id, step)
    np.testing.assert_allclose(discounted_returns_to_go(reward, starts, 1.0), returns_to_go(reward, starts), rtol=1e-5, atol=1e-4)
    assert discounted_returns_to_go(np.zeros(0), np.zeros(0, bool), gamma).shape == (0,)


def test_the_sampler_carries_returns_to_go_of_the_learnt_rewards() -> None:
    data = transitions([1, 2, 3, 4, 5], [0, 0, 0, 1, 1], [0, 1, 2, 0, 1])
    sampler = TransitionSampler(data, returns_to_go=ReturnsToGo(gamma=0.5, reward_shift=1.0, reward_scale=0.5))
    batch = sampler.take(torch.arange(5))
    # learnt rewards (r + 1) * 0.5: [1, 1.5, 2 | 2.5, 3]
    torch.testing.assert_close(batch.returns_to_go, torch.tensor([1 + 0.75 + 0.5, 1.5 + 1.0, 2.0, 2.5 + 1.5, 3.0]))
    torch.testing.assert_close(batch.obs[:, 0], torch.arange(5.0))  # rows stay whole
    assert TransitionSampler(data).take(torch.arange(5)).returns_to_go is None


def one_step(reward: float, terminated: bool = False, truncated: bool = False, valid: bool = True) -> StepBatch:
    """One step of a single env with one-number observations."""
    zeros = np.zeros((1, 1), np.float32)
    flags = [np.array([flag]) for flag in (terminated, truncated, valid)]
    return StepBatch(zeros, np.zeros((1, 1)), np.zeros((1, 1)), np.array([reward]), zeros, *flags, np.zeros(1), np.zeros(1))


def test_online_rows_get_their_returns_to_go_when_their_episode_ends() -> None:
    online = ReplayBuffer(10, 1, 1, returns_to_go=ReturnsToGo(gamma=0.5))
    for reward in (1.0, 2.0):
        online.store(one_step(reward))
    assert torch.isinf(online.take(torch.arange(2)).returns_to_go).all()  # no bound before the episode ends
    online.store(one_step(4.0, truncated=True))  # a truncated episode just ends: no bootstrap
    online.store(one_step(0.0, valid=False))  # the autoreset step is not stored
    online.store(one_step(8.0))
    torch.testing.assert_close(online.take(torch.arange(4)).returns_to_go, torch.tensor([3.0, 4.0, 4.0, -math.inf]))
    online.store(one_step(-2.0, terminated=True))
    torch.testing.assert_close(online.take(torch.arange(5)).returns_to_go, torch.tensor([3.0, 4.0, 4.0, 7.0, -2.0]))
    # joined to a dataset's batches, the column goes along
    data = transitions([1.0], [0], [0])
    replay = DatasetAndOnline(TransitionSampler(data, returns_to_go=ReturnsToGo(0.5)), online, seed=0)
    assert replay.sample(64).returns_to_go.shape == (64,)
    # resumable with the episode under way; the buffer without the column is as before
    online.store(one_step(1.0))
    restored = ReplayBuffer(10, 1, 1, returns_to_go=ReturnsToGo(gamma=0.5))
    restored.load_state_dict(online.state_dict())
    restored.store(one_step(1.0, terminated=True))
    torch.testing.assert_close(restored.take(torch.arange(5, 7)).returns_to_go, torch.tensor([1.5, 1.0]))
    assert "values" not in ReplayBuffer(10, 1, 1).state_dict() and ReplayBuffer(10, 1, 1).take(torch.arange(1)).returns_to_go is None


def test_the_bound_raises_only_the_policy_proposals_q() -> None:
    torch.manual_seed(0)
    config = Config(dataset="unused", hidden=(8, 8), num_sampled_actions=2, beta=1.0)
    sac = SoftActorCritic.build(config, 3, 1, torch.device("cpu"))
    obs, next_obs = torch.randn(3, 3), torch.randn(3, 3)
    b = Batch(obs, torch.rand(3, 1) * 2 - 1, torch.zeros(3), next_obs, torch.zeros(3))
    bound = torch.tensor([5.0, -math.inf, 0.0])  # above every Q at state 0 (a new net's are near 0), none at state 1
    torch.manual_seed(1)
    _, gap, rate = critic_loss(config, sac, b, None, bound)
    torch.manual_seed(1)  # the same samples (after the target's own draw), valued by hand
    with torch.no_grad():
        sac.soft_target(b, b.rewards, config.gamma)
        sampled, log_density = proposal_samples(sac.actor, obs, next_obs, 2)
        q_data, q_sampled = data_and_sampled_q(sac.critic, obs, b.actions, sampled)
    expected, raised = 0.0, 0
    for n in range(2):  # critics
        for i in range(3):  # states
            terms = []
            for j in range(6):  # samples: uniform 0-1, pi(s) 2-3, pi(s') 4-5
                q = float(q_sampled[n, j, i])
                if j >= 2 and q < bound[i]:
                    q, raised = float(bound[i]), raised + 1
                terms.append(q - float(log_density[j, i]))
            expected += (math.log(sum(math.exp(t) for t in terms)) - float(q_data[n, i])) / 3
    assert gap.item() == pytest.approx(expected, rel=1e-5)
    assert rate.item() == pytest.approx(raised / (2 * 4 * 3)) and raised >= 2 * 4  # state 0's policy proposals at least
    torch.manual_seed(1)
    _, plain_gap, plain_rate = critic_loss(config, sac, b, None)
    assert plain_rate.item() == 0.0 and plain_gap.item() < gap.item()  # raising Q only raises the logsumexp


def test_bad_settings_are_one_line_errors(tmp_path: Path, cli) -> None:
    store = tmp_path / "datasets"
    assert cli("collect", "--env", "Pendulum-v1", "--episodes", "1", "--store", store, "--quiet").code == 0
    for setting, message in [
        ("calibrate=maybe", "setting calibrate="),
        ("quantiles=2", "calql has continuous actions only"),
        ("frame_stack=4", "calql reads flat observations only"),
        ("num_sampled_actions=0", "expected a positive number"),
    ]:
        result = cli("train", "calql", "--dataset", "pendulum-random", "--store", store, "--set", setting, "--out", tmp_path / "bad")
        assert result.code == 2 and message in result.err and len(result.err.strip().splitlines()) == 1, (setting, result.err)
    assert not (tmp_path / "bad").exists()


def test_returns_to_go_are_not_gathered_from_memory_maps(tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "datasets"
    assert cli("collect", "--env", "Pendulum-v1", "--episodes", "1", "--store", store, "--quiet").code == 0
    monkeypatch.setattr("rlpipe.training.offline.MAPPED_SAMPLING_BYTES", 0)  # every dataset sampled from its maps
    result = cli("train", "calql", "--dataset", "pendulum-random", "--store", store, "--out", tmp_path / "run", "--no-progress")
    assert result.code == 2 and "calql needs the dataset's returns-to-go: not gathered from the memory maps" in result.err, result.err
    assert len(result.err.strip().splitlines()) == 1


def test_calql_fine_tunes_from_the_cli(tmp_path: Path, cli) -> None:
    store = tmp_path / "datasets"
    collect = ("collect", "--env", "Pendulum-v1", "--policy", "random", "--episodes", "4", "--num-envs", "4", "--name", "pr4")
    assert cli(*collect, "--store", store, "--quiet").code == 0
    run = tmp_path / "calql"
    small = ("--set", "eval_every=50", "--set", "eval_episodes=2", "--set", "heldout_eval_episodes=2", "--set", "hidden=[16, 16]")
    args = ("--dataset", "pr4", "--store", store, "--updates", "50", "--finetune-env-steps", "250", "--set", "finetune_eval_every=125")
    result = cli("train", "calql", *args, *small, "--out", run, "--no-progress", "--device", "cpu")
    assert result.code == 0, result.err
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["offline_updates"] == 50 and metrics["finetune_env_steps"] == 250 and metrics["gradient_updates"] == 300
    assert 0.0 <= metrics["bound_rate"] <= 1.0 and "offline_eval_return_mean" in metrics
    assert cli("eval", run, "--episodes", "1", "--json").code == 0


def test_without_calibration_it_is_cql_on_the_same_batches_and_still_measures_the_bound(tmp_path: Path, cli) -> None:
    """The control: the same numbers as `rlpipe train cql`, with `bound_rate` measured but not applied."""
    store = tmp_path / "datasets"
    assert cli("collect", "--env", "Pendulum-v1", "--episodes", "2", "--store", store, "--quiet").code == 0
    settings = dict(dataset="pendulum-random", store=str(store), updates=40, eval_every=40, eval_episodes=1, hidden=(16, 16), seed=3)
    runs = [("cql", {}), ("calql", dict(calibrate=False))]
    cql, control = (
        get_algo(name).train(get_algo(name).make_config("Pendulum-v1", **settings, **extra), progress=False).metrics for name, extra in runs
    )
    for key in ("eval_return_mean", "conservative_gap", "alpha"):
        assert control[key] == cql[key], key
    assert 0.0 <= control["bound_rate"] <= 1.0 and "bound_rate" not in cql


@pytest.mark.heavy  # two runs of about a CPU-minute each
def test_finetuning_lifts_calql_far_above_the_same_updates_offline(tmp_path: Path, learning_seed: int, record_property, cli) -> None:
    """On four random-policy Pendulum episodes (`pr4`, docs/algorithms/offline.md#cal-ql)
    Cal-QL's 2000 offline updates leave a policy near random, and 5000 env steps of
    fine-tuning lift it. The control, 7000 updates on the dataset alone (the same gradient
    work, no online data), stays far below."""
    store = tmp_path / "datasets"
    collect = ("collect", "--env", "Pendulum-v1", "--policy", "random", "--episodes", "4", "--num-envs", "4", "--name", "pr4")
    assert cli(*collect, "--store", store, "--quiet").code == 0
    calql = get_algo("calql")
    returns = {}
    for name, settings in [("finetuned", dict(updates=2000, finetune_env_steps=5000)), ("offline", dict(updates=7000))]:
        config = calql.make_config("Pendulum-v1", dataset="pr4", store=str(store), seed=learning_seed, eval_every=1000, **settings)
        returns[name] = calql.train(config, progress=False).metrics["eval_return_mean"]
        record_property(name, returns[name])
    # Seeds 0-4: fine-tuned -123.6, -135.8, -123.2, -149.5, -120.6; offline -1346.4, -809.9, -566.2,
    # -727.6, -1024.7 (gaps 443 to 1223).
    assert returns["finetuned"] >= -300.0 and returns["finetuned"] >= returns["offline"] + 250.0, returns
