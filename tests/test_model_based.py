"""Model-based RL: the dynamics ensemble, the CEM planner, PETS, MBPO, MOPO, the dynamics
trainer, their checkpoints and their errors."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gymnasium import spaces

from rlpipe.algos import get_algo
from rlpipe.envs.spaces import space_to_json
from rlpipe.errors import RlpipeError
from rlpipe.nets.checkpoint import save_checkpoint
from rlpipe.nets.dynamics import GaussianEnsemble, fit_ensemble
from rlpipe.nets.env_fns import never_terminates, reward_fn, termination_fn
from rlpipe.training.buffer import Batch
from rlpipe.training.env import ActionScaler
from rlpipe.training.evaluation import evaluate
from rlpipe.training.model_based import DYNAMICS_MODULE, build_ensemble, fit_on, load_dynamics
from rlpipe.training.planning import CEMPlanner, CEMSettings, ModelEnv

# Small budgets for the learning tests (the sweep in this file's __main__ measures them).
# PETS runs with its Pendulum defaults (model minibatches of 32) for 800 steps.
PETS_TEST = dict(
    env_steps=800, eval_episodes=3, heldout_eval_episodes=0
)  # planning ~0.4 CPU-s per 32-env step: no 100-episode held-out pass here
# MBPO trains until its 5-episode evaluation (every 250 env steps) reaches -300, at most 2500 steps.
MBPO_TEST = dict(env_steps=2_500, stop_at_return=-300.0, model_hidden=(128, 128, 128), model_max_epochs=20, eval_every=250, eval_episodes=5)
# MOPO keeps the paper's penalty 1 here: Pendulum's default 10 (stable to 10k updates on the
# pipeline's dataset) learns too slowly for 3000 updates (seeds 0, 1: -264.3, -1026.1).
MOPO_TEST = dict(
    updates=3_000, penalty=1.0, reward="known", model_hidden=(128, 128, 128), model_max_epochs=10, eval_every=3_000, eval_episodes=5
)
# MOPO on narrow data runs at its Pendulum defaults (10k updates); the control drops the penalty.
MOPO_NARROW_TEST = dict(eval_episodes=10, heldout_eval_episodes=0)
MOPO_NARROW_VARIANTS: dict[str, dict[str, float]] = {"mopo": {}, "penalty 0": {"penalty": 0.0}}
MOPO_NARROW_CONTROL_BELOW = -1000.0
MOPO_NARROW_MARGIN = 200.0
MOPO_NARROW_SEEDS = 5


def linear_system(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs (obs 2-D, action 1-D) and targets (Δobs, reward) of a known linear system."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 3, generator=g) * 2 - 1
    a = torch.tensor([[0.1, -0.2, 0.3], [0.05, 0.1, -0.4], [1.0, -0.5, 0.25]])  # rows: Δobs0, Δobs1, reward
    return x, x @ a.T, a


def test_ensemble_recovers_a_known_linear_system() -> None:
    torch.manual_seed(0)
    x, y, _ = linear_system(2_000, seed=0)
    model = GaussianEnsemble(2, 1, members=3, hidden=(32, 32))
    x_new, y_new, _ = linear_system(200, seed=1)
    before = (model(x_new[:, :2], x_new[:, 2:])[0] - y_new).square().mean()
    report = fit_ensemble(
        model, x, y, torch.optim.Adam(model.parameters(), 3e-3), max_epochs=40, generator=torch.Generator().manual_seed(0)
    )
    mean, std = model(x_new[:, :2], x_new[:, 2:])
    after = (mean - y_new).square().mean()
    assert after < 1e-3 < before  # the untrained model (the control) is far off
    assert max(report.holdout_mse) < 1e-3 and len(report.holdout_mse) == 3
    assert std.max() < 0.1  # noise-free data: the learned std shrinks


def test_bootstrap_is_drawn_once_per_fit_and_scoring_reads_only_the_planned_outputs(monkeypatch) -> None:
    x, y, _ = linear_system(500, seed=0)
    y = torch.cat([y[:, :2], torch.randn(500, 1, generator=torch.Generator().manual_seed(1)) * 1e3], 1)  # reward: noise
    draws = []
    randint = torch.randint
    monkeypatch.setattr(torch, "randint", lambda *a, **k: draws.append(a[2]) or randint(*a, **k))

    def fit(scored: slice) -> tuple[int, list[float]]:
        torch.manual_seed(0)
        model = GaussianEnsemble(2, 1, members=3, hidden=(32, 32))
        report = fit_ensemble(
            model,
            x,
            y,
            torch.optim.Adam(model.parameters(), 3e-3),
            max_epochs=100,
            patience=3,
            scored_outputs=scored,
            generator=torch.Generator().manual_seed(0),
        )
        return report.epochs, report.holdout_mse

    epochs, mse = fit(slice(0, 2))
    assert draws == [(3, 400)] and epochs > 3  # one bootstrap (members x training rows) for all epochs
    # Scored on Δobs only, the fit runs until Δobs is learnt (measured: 40 epochs, Δobs MSE
    # at most 8.0e-5); scored on the unlearnable reward too (the control), it stops earlier
    # with a worse Δobs (35 epochs, 2.5e-4).
    noise_epochs, noise_mse = fit(slice(None))
    assert noise_epochs < epochs and max(mse[:2]) < 0.5 * max(noise_mse[:2]), (epochs, mse, noise_epochs, noise_mse)


def test_batched_ensemble_equals_a_loop_over_members() -> None:
    torch.manual_seed(0)
    model = GaussianEnsemble(3, 2, members=4, hidden=(16, 16), elites=2)
    model.set_normalizer(torch.randn(100, 5) * 3 + 1, torch.randn(100, 4) * 2)
    obs, act = torch.randn(4, 7, 3), torch.randn(4, 7, 2)
    mean, std = model(obs, act)
    for i in range(4):
        h = (torch.cat([obs[i], act[i]], -1) - model.in_mean) / model.in_std
        for j, layer in enumerate(model.layers):
            h = F.linear(h, layer.weight[i].T, layer.bias[i, 0])
            h = F.silu(h) if j < len(model.layers) - 1 else h
        mu, logvar = h.split(4, -1)
        logvar = model.max_logvar - F.softplus(model.max_logvar - logvar)
        logvar = model.target_logvar + model.min_logvar + F.softplus(logvar - model.min_logvar)
        torch.testing.assert_close(mean[i], mu)
        torch.testing.assert_close(std[i], (0.5 * logvar).exp())
    # A subset of members (the elites) gives those members' rows.
    members = torch.tensor([3, 1])
    sub_mean, _ = model(obs[members], act[members], model.member_layers(members))
    torch.testing.assert_close(sub_mean, mean[members])


def static_model_env(act_dim: int, reward: object) -> ModelEnv:
    """A model that never moves the state (zero weights, negligible noise) and a known reward."""
    model = GaussianEnsemble(2, act_dim, members=2, hidden=(8,))
    with torch.no_grad():
        for p in model.layers.parameters():
            p.zero_()
        model.target_logvar.fill_(-40.0)  # std ~1e-8 + the relative lower limit
    box = spaces.Box(-1.0, 1.0, (act_dim,), np.float32)
    return ModelEnv(model, box, never_terminates, reward, torch.Generator().manual_seed(0))


def test_cem_finds_the_optimum_of_a_known_quadratic() -> None:
    target = torch.tensor([0.3, -0.6])
    env = static_model_env(2, lambda obs, action, next_obs: -(action - target).square().sum(-1))
    obs = torch.zeros(3, 2)  # three envs planned together

    def error(settings: CEMSettings) -> float:
        planner = CEMPlanner(env, settings, 2, torch.Generator().manual_seed(0))
        return float((planner.act(obs) - target).abs().max())

    assert error(CEMSettings(horizon=5, population=200, iterations=10)) < 0.02  # measured 0.007
    # The control: one round of 10 random sequences is nowhere near as close.
    assert error(CEMSettings(horizon=5, population=10, iterations=1)) > 0.05


def test_planner_warm_starts_from_its_shifted_plan_and_checks_its_settings() -> None:
    env = static_model_env(1, lambda obs, action, next_obs: -action[..., 0].square())
    planner = CEMPlanner(env, CEMSettings(horizon=4, population=10, iterations=1), 1, torch.Generator().manual_seed(0))
    planner.act(torch.zeros(1, 2))
    first = planner.plan.clone()
    torch.testing.assert_close(planner._initial_mean(1, torch.device("cpu"))[:, :3], first[:, 1:])
    assert planner._initial_mean(2, torch.device("cpu")).abs().sum() == 0  # another batch starts afresh
    planner.act(torch.zeros(3, 2))
    kept = planner.plan[[0, 2]].clone()
    planner.reset(np.array([False, True, False]))  # env 1 starts a new episode
    assert planner.plan[1].abs().sum() == 0 and torch.equal(planner.plan[[0, 2]], kept)
    planner.reset(np.ones(2, bool))  # a batch of another size (an evaluation's envs) starts afresh
    assert planner.plan is None
    with pytest.raises(RlpipeError, match="multiple of the 2 elite members"):
        CEMPlanner(env, CEMSettings(population=5), 1)


def test_evaluation_starts_a_planners_episodes_afresh() -> None:
    started = []

    class Recorder:
        def __call__(self, obs: np.ndarray) -> np.ndarray:
            return np.zeros((len(obs), 1), np.float32)

        def start_episodes(self, rows: np.ndarray) -> None:
            started.append(rows.copy())

    evaluate(Recorder(), "Pendulum-v1", episodes=4, seed=0, max_envs=2)
    firsts = [i for i, rows in enumerate(started) if rows.any()]
    assert all(started[i].all() for i in firsts)  # Pendulum's episodes end together
    assert firsts == [0, 201], firsts  # the start, and after the first episodes' 200 steps and reset step


def test_mbpo_rollout_length_follows_its_schedule() -> None:
    config = get_algo("mbpo").make_config("Pendulum-v1", rollout_schedule=(20_000, 100_000, 1, 15))
    assert [config.rollout_length_at(n) for n in (0, 20_000, 60_000, 100_000, 200_000)] == [1, 1, 8, 15, 15]


def test_dynamics_checkpoint_round_trip(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = GaussianEnsemble(3, 1, members=3, hidden=(16,), elites=2)
    model.set_normalizer(torch.randn(50, 4), torch.randn(50, 4))
    model.elites.copy_(torch.tensor([0, 2]))
    meta = {
        "algo": "dynamics",
        "env_id": "Pendulum-v1",
        "policy": {"kind": model.kind, "spec": model.spec},
        "action_space": space_to_json(spaces.Box(-2.0, 2.0, (1,), np.float32)),
    }
    save_checkpoint(tmp_path / "run", {DYNAMICS_MODULE: model}, meta)
    loaded, _ = load_dynamics(tmp_path / "run", "Pendulum-v1", 3, 1, torch.device("cpu"))
    obs, act = torch.randn(10, 3), torch.randn(10, 1)
    for a, b in zip(model(obs, act), loaded(obs, act)):
        torch.testing.assert_close(a, b)
    assert loaded.elites.tolist() == [0, 2]
    with pytest.raises(RlpipeError, match="trained for Pendulum-v1, not MountainCarContinuous-v0"):
        load_dynamics(tmp_path / "run", "MountainCarContinuous-v0", 3, 1, torch.device("cpu"))
    with pytest.raises(RlpipeError, match="obs/action sizes 3/1, not 2/1"):
        load_dynamics(tmp_path / "run", "Pendulum-v1", 2, 1, torch.device("cpu"))


def test_envs_without_known_functions_are_refused_by_name(cli) -> None:
    with pytest.raises(RlpipeError, match="known reward function for MountainCarContinuous-v0; use --set reward=learned"):
        reward_fn("pets", "MountainCarContinuous-v0", "known")
    assert reward_fn("pets", "MountainCarContinuous-v0", "learned") is None
    with pytest.raises(RlpipeError, match="termination function for MountainCarContinuous-v0"):
        termination_fn("mbpo", "MountainCarContinuous-v0")
    res = cli("train", "pets", "--env", "MountainCarContinuous-v0", "--set", "reward=learned", "--no-progress")
    assert res.code == 2 and "known termination function" in res.err and "Traceback" not in res.err
    res = cli("train", "mbpo", "--env", "CartPole-v1", "--no-progress")
    assert res.code == 2 and "continuous (Box) action space" in res.err


def test_bad_model_settings_are_refused_before_a_run_starts(cli, tmp_path: Path) -> None:
    for algo, setting, message in [
        ("pets", "population=7", "multiple of the 5 elite members"),
        ("mbpo", "elites=9", "elites=9: expected at most members (7)"),
        ("mbpo", "real_ratio=1.5", "real_ratio=1.5: expected a number in [0, 1]"),
        ("mbpo", "rollout_schedule=[5,1,1,1]", "rollout_schedule=[5, 1, 1, 1]: expected [from_step, to_step"),
        ("pets", "reward=exact", "reward='exact': expected 'auto' or 'known' or 'learned'"),
        ("pets", "horizon=0", "horizon=0: expected a positive number"),
    ]:
        res = cli("train", algo, "--env", "Pendulum-v1", "--set", setting, "--out", tmp_path / algo, "--no-progress")
        assert res.code == 2 and message in res.err and "Traceback" not in res.err, (setting, res.err)
        assert not (tmp_path / algo).exists()
    cheap = [
        "env_steps=1",
        "random_steps=1",
        "eval_episodes=1",
        "heldout_eval_episodes=0",
        "model_hidden=[8]",
        "model_max_epochs=1",
        "horizon=2",
        "population=5",
        "iterations=1",
    ]
    res = cli(
        "train", "pets", "--env", "Pendulum-v1", *(a for kv in cheap for a in ("--set", kv)), "--out", tmp_path / "ok", "--no-progress"
    )
    assert res.code == 0, res.err  # the control: valid settings run


@pytest.mark.slow
@pytest.mark.heavy  # a CPU-minute of model fitting and planning
def test_pets_learns_pendulum_in_four_episodes(tmp_path: Path, cli, learning_seed: int, record_property, non_learning_returns) -> None:
    pets = get_algo("pets")
    result = pets.train(pets.make_config("Pendulum-v1", seed=learning_seed, **PETS_TEST), tmp_path / "pets", progress=False)
    m = result.metrics
    controls = non_learning_returns("Pendulum-v1", learning_seed, episodes=PETS_TEST["eval_episodes"])
    record_property("pets_return", m["eval_return_mean"])
    record_property("controls", controls)
    # Seeds 0-4 (1 random + 3 planning episodes, 3 eval episodes): -84.3, -125.3, -170.6, -166.4,
    # -210.0 (~80 CPU-s each).
    # Controls on the same 3 eval episodes (zero torque / uniform random), seeds 0-4: -884.4/-965.1,
    # -1076.2/-934.0, -1153.9/-1067.6, -1258.4/-1233.6, -1381.1/-1523.5.
    assert max(controls.values()) < -600, controls
    assert m["eval_return_mean"] > -400, m
    assert len(m["episode_returns"]) == 4 and m["model_fits"] == 3 and len(m["model_holdout_mse"]) == 4
    res = cli("eval", tmp_path / "pets")
    assert res.code == 2 and "no policy network to load" in res.err


@pytest.mark.slow
@pytest.mark.heavy  # a CPU-minute of model fitting and planning
def test_mbpo_learns_pendulum_within_2500_steps(learning_seed: int, record_property, non_learning_returns) -> None:
    mbpo = get_algo("mbpo")
    m = mbpo.train(mbpo.make_config("Pendulum-v1", seed=learning_seed, **MBPO_TEST), progress=False).metrics
    controls = non_learning_returns("Pendulum-v1", learning_seed, episodes=MBPO_TEST["eval_episodes"])
    record_property("mbpo_return", m["eval_return_mean"])
    record_property("mbpo_env_steps", m["env_steps"])
    record_property("controls", controls)
    # Trains until its 5-episode evaluation (every 250 env steps) reaches -300, at most 2500
    # env steps, at the paper's data settings. Seeds 0-4 stopped at 2000, 1250, 2000, 2000 and
    # 2000 env steps with -122.8, -225.4, -146.8, -174.5 and -172.3 (77-149 CPU-s each). This shows MBPO learns, not that its model helps: the
    # no-model ablation (real_ratio=1.0, same 10 updates per env step) stopped earlier (seed 0:
    # 1000 env steps, -125.1; seed 1: 750, -121.8), so on Pendulum it is no control. The controls on the
    # same eval episodes (zero torque / uniform random), seeds 0-4: -1028.0/-1122.3,
    # -1183.1/-1156.8, -1241.3/-1139.8, -1315.3/-1363.3, -1270.0/-1157.1.
    assert max(controls.values()) < -600, controls
    assert m["eval_return_mean"] >= MBPO_TEST["stop_at_return"], m
    assert m["model_fits"] >= 1 and len(m["episode_returns"]) == m["env_steps"] // 200


@pytest.mark.slow
def test_mopo_learns_pendulum_from_a_mixed_dataset_and_reuses_a_dynamics_run(
    offline_store: Path, tmp_path: Path, cli, learning_seed: int, record_property
) -> None:
    mopo = get_algo("mopo")
    config = mopo.make_config("Pendulum-v1", dataset="pendulum-mixed", store=str(offline_store), seed=learning_seed, **MOPO_TEST)
    m = mopo.train(config, tmp_path / "mopo", progress=False).metrics
    record_property("mopo_return", m["eval_return_mean"])
    # Seeds 0-4 (3000 updates, 5 eval episodes): -130.0, -152.2, -182.3, -182.8, -480.7 (~25 CPU-s
    # each). This shows MOPO's loop learns, not that its penalty or model helps: offline SAC
    # (real_ratio=1.0) also clears the bar on this dataset (README).
    assert m["eval_return_mean"] > -600, m
    # A saved dynamics run is reused instead of refitting.
    res = cli(
        "train",
        "dynamics",
        "--dataset",
        "pendulum-mixed",
        "--store",
        offline_store,
        "--updates",
        "50",
        "--set",
        "model_hidden=[32]",
        "--set",
        "eval_episodes=1",
        "--set",
        "heldout_eval_episodes=0",
        "--set",
        "horizon=3",
        "--out",
        tmp_path / "dyn",
        "--no-progress",
    )
    assert res.code == 0, res.err
    res = cli(
        "train",
        "mopo",
        "--dataset",
        "pendulum-mixed",
        "--store",
        offline_store,
        "--updates",
        "20",
        "--set",
        f"dynamics={tmp_path / 'dyn'}",
        "--set",
        "eval_episodes=1",
        "--set",
        "rollout_every=10",
        "--out",
        tmp_path / "mopo-reuse",
        "--no-progress",
    )
    assert res.code == 0, res.err
    res = cli("train", "mopo", "--dataset", "pendulum-mixed", "--store", offline_store, "--set", f"dynamics={tmp_path / 'mopo'}x")
    assert res.code == 2 and "no checkpoint" in res.err
    res = cli("train", "mopo", "--dataset", "cartpole-expert", "--store", offline_store)
    assert res.code == 2 and "continuous (Box) action space" in res.err


@pytest.mark.heavy
def test_mopo_penalty_is_what_learns_from_sampled_expert_data(offline_store: Path, learning_seed: int, record_property) -> None:
    """MOPO at its Pendulum defaults on 20 episodes of a SAC expert's sampled actions (narrow
    data), against the control without its distinctive part: the same run with penalty 0, over
    five seeds from $RLPIPE_TEST_SEED (0: seeds 0-4; 5: the held-out 5-9). A mean, not a bar
    per seed: MOPO does not learn at every seed (4 and 9 on this code, docs/claims.md)."""
    mopo = get_algo("mopo")
    returns: dict[str, list[float]] = {variant: [] for variant in MOPO_NARROW_VARIANTS}
    for seed in range(learning_seed, learning_seed + MOPO_NARROW_SEEDS):
        for variant, settings in MOPO_NARROW_VARIANTS.items():
            config = mopo.make_config(
                "Pendulum-v1", dataset="pendulum-expert-sampled", store=str(offline_store), seed=seed, **MOPO_NARROW_TEST, **settings
            )
            returns[variant].append(round(mopo.train(config, progress=False).metrics["eval_return_mean"], 1))
    record_property("returns", returns)
    # 10 eval episodes, ~15 CPU-min for the five seeds (docs/claims.md). Seeds 0-4: MOPO -234.9,
    # -253.5, -566.1, -1307.4, -1429.6, penalty 0 -1557.1, -1098.7, -1525.8, -989.7, -1554.0 (means
    # -758.3 / -1345.1); seeds 5-9: MOPO -244.6, -118.3, -118.0, -119.5, -1461.0, penalty 0 -1557.8,
    # -1562.8, -1244.2, -1523.3, -1502.5 (means -412.3 / -1478.1).
    means = {variant: float(np.mean(values)) for variant, values in returns.items()}
    assert means["penalty 0"] < MOPO_NARROW_CONTROL_BELOW, returns
    assert means["mopo"] >= means["penalty 0"] + MOPO_NARROW_MARGIN, returns


def store_for_sweeps(root: Path) -> Path:
    """The offline tests' `pendulum-mixed` (a 10k-step SAC run's every transition) under ``root``."""
    from rlpipe.commands.collect import collect_dataset

    if not (root / "datasets" / "pendulum-mixed").exists():
        collect_dataset(
            "Pendulum-v1",
            expert="sac",
            from_training=True,
            expert_run=root / "sac-mixed",
            seed=0,
            name="pendulum-mixed",
            store=root / "datasets",
            progress=False,
        )
    return root / "datasets"


if __name__ == "__main__":  # the seed sweep behind the thresholds: python tests/test_model_based.py STORE_ROOT [pets|mbpo|mopo]
    import sys

    torch.set_num_threads(1)
    for name in sys.argv[2:] or ["pets", "mbpo", "mopo"]:
        algo, budget = get_algo(name), {"pets": PETS_TEST, "mbpo": MBPO_TEST, "mopo": MOPO_TEST}[name]
        data = dict(dataset="pendulum-mixed", store=str(store_for_sweeps(Path(sys.argv[1])))) if name == "mopo" else {}
        values = []
        for seed in range(5):
            values.append(
                round(
                    algo.train(algo.make_config("Pendulum-v1", seed=seed, **budget, **data), progress=False).metrics["eval_return_mean"], 1
                )
            )
            print(name, seed, values[-1], flush=True)
        print(name, values, flush=True)


def random_transitions(env_id: str, steps: int, seed: int) -> Batch:
    """``steps`` transitions of uniform random actions in ``env_id`` (actions scaled to [-1, 1])."""
    env = gym.make(env_id)
    env.action_space.seed(seed)
    scale = ActionScaler(env.action_space)
    rows, (obs, _) = [], env.reset(seed=seed)
    while len(rows) < steps:
        action = env.action_space.sample()
        next_obs, reward, terminated, truncated, _ = env.step(action)
        rows.append((obs, scale.from_env(action), reward, next_obs, terminated))
        obs = env.reset()[0] if terminated or truncated else next_obs
    return Batch(*(torch.as_tensor(np.array(column, np.float32)) for column in zip(*rows)))


@pytest.mark.heavy
def test_mbpo_fit_on_inverted_pendulum_predicts_velocities_and_terminations(learning_seed: int, record_property) -> None:
    """MBPO's fit at its InvertedPendulum defaults (refits every 250 steps from 500 to 3000
    random transitions), scored on 5000 held-out random transitions: Δobs error of the elites'
    mean and how often the sampled model terminates where the env does not."""
    mbpo = get_algo("mbpo")
    config = mbpo.make_config("InvertedPendulum-v5", seed=learning_seed)
    data, test = random_transitions("InvertedPendulum-v5", 3_000, 100 + learning_seed), random_transitions("InvertedPendulum-v5", 5_000, 1)
    terminated, reward = termination_fn("mbpo", config.env_id), reward_fn("mbpo", config.env_id, config.reward)
    assert reward is not None  # the env's known reward (1 - terminated), by default
    torch.manual_seed(learning_seed)
    model, optimizer = build_ensemble(config, 4, 1, torch.device("cpu"))
    generator = torch.Generator().manual_seed(learning_seed)
    for rows in range(500, 3_001, config.model_train_every):
        fit_on(model, optimizer, data.map_columns(lambda column: column[:rows]), config, generator, known_reward=True)
    model_env = ModelEnv(model, spaces.Box(-3.0, 3.0, (1,), np.float32), terminated, reward, generator)
    with torch.no_grad():
        mean, _ = model(test.obs, test.actions)
        rmse = (mean[model.elites, :, :4].mean(0) - (test.next_obs - test.obs)).square().mean(0).sqrt()
        _, model_reward, model_terminated, _ = model_env.branch(test.obs, test.actions)
    false_terminations = float((model_terminated & ~test.terminated.bool()).float().mean())
    record_property("dobs_rmse", rmse.tolist())
    record_property("false_terminations", false_terminations)
    # Seeds 1-4 (2026-12-03): velocity RMSE (cart, pole) 0.0016/0.0033, 0.0010/0.0032,
    # 0.0014/0.0029, 0.0019/0.0051; false terminations 0.66%, 0.42%, 0.72%, 0.84% (the env
    # terminates on about 16%); seed 0 passed too (~80 CPU-s each). The fit before
    # (normalised targets, the learned reward in the score, a 50-epoch cap, decay on every
    # parameter) failed both bounds on seeds 0-2 (same training data, other test data):
    # 0.015-0.020 / 0.032-0.052, false terminations 1.02-1.36%, and its reward on terminal
    # transitions averaged 0.46-0.48.
    assert rmse[2:].max() < 0.008, rmse
    assert false_terminations < 0.009, false_terminations
    assert model_reward[model_terminated].abs().max() == 0.0  # reward and termination agree


def test_a_memory_mapped_dataset_fits_a_model_as_one_in_ram_does(tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """The dynamics fit reads every transition: from a dataset sampled from its memory maps
    (over 1 GiB) it gets the same batch, actions mapped to [-1, 1] once."""
    from rlpipe.training.env import BOX
    from rlpipe.training.model_based import dataset_batch
    from rlpipe.training.offline import load_offline
    from rlpipe.training.sampler import MappedSampler, TransitionSampler

    store = tmp_path / "datasets"
    assert cli("collect", "--env", "Pendulum-v1", "--episodes", "2", "--store", store, "--quiet").code == 0
    config = get_algo("mopo").make_config("Pendulum-v1", dataset="pendulum-random", store=str(store))
    in_ram = load_offline("mopo", config, (BOX,))
    monkeypatch.setattr("rlpipe.training.offline.MAPPED_SAMPLING_BYTES", 0)  # every dataset sampled from its maps
    mapped = load_offline("mopo", config, (BOX,))
    assert isinstance(in_ram.sampler, TransitionSampler) and isinstance(mapped.sampler, MappedSampler)
    for a, b in zip(dataset_batch(in_ram), dataset_batch(mapped), strict=True):
        assert (a is None and b is None) or torch.equal(a, b)
    assert float(dataset_batch(mapped).actions.abs().max()) <= 1.0
