"""IPPO and MADDPG: bad input, the pieces of their maths, and runs through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from rlpipe.algos import load_policy, maddpg
from rlpipe.errors import RlpipeError


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "ippo", "--env", "CartPole-v1"], "ippo trains on Combat-v0; got 'CartPole-v1'"),
        (["train", "maddpg", "--env", "Combat-v0"], "maddpg trains on simple_adversary_v3, simple_spread_v3"),
        (["train", "maddpg", "--env", "simple_adversary_v3", "--num-envs", "4"], "maddpg steps one env"),
        (["train", "maddpg", "--env", "simple_adversary_v3", "--set", "n_step=0"], "n_step must be >= 1; got 0"),
        (["train", "ippo", "--env", "Combat-v0", "--set", "team_size=20"], "team_size + n_opponents must be <= 16"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(cli, tmp_path: Path, args: list[str], message: str) -> None:
    result = cli(*args, "--out", tmp_path / "run")
    assert result.code == 2 and result.err.startswith("error: ") and message in result.err, result.err
    assert not (tmp_path / "run").exists()


def test_ippo_run_writes_win_rate_and_eval_prints_it(cli, tmp_path: Path) -> None:
    result = cli(
        "train",
        "ippo",
        "--env",
        "Combat-v0",
        "--env-steps",
        "2048",
        "--out",
        tmp_path / "run",
        "--no-progress",
        "--num-envs",
        "16",
        "--set",
        "num_steps=64",
        "--set",
        "eval_episodes=8",
    )
    assert result.code == 0, result.err
    assert "win rate" in result.out
    metrics = json.loads((tmp_path / "run/metrics.json").read_text())
    for key in (
        "eval_win_rate",
        "eval_team_return_mean",
        "eval_return_agent_0",
        "eval_return_agent_1",
        "eval_episode_length_mean",
        "agent_steps",
        "eval_curve",
    ):
        assert key in metrics
    assert metrics["eval_win_rate"] == metrics["eval_success_rate"]
    report = json.loads(cli("eval", tmp_path / "run", "--episodes", "6", "--json").out)
    assert 0.0 <= report["win_rate"] <= 1.0 and report["episodes"] == 6 and len(report["agent_returns"]) == 2
    again = json.loads(cli("eval", tmp_path / "run", "--episodes", "6", "--json").out)
    assert again == report  # seeded evaluation
    crossed = cli("eval", tmp_path / "run", "--episodes", "6", "--adversary-run", tmp_path / "run")
    assert crossed.code == 2 and "--adversary-run applies to MPE runs only" in crossed.err
    with pytest.raises(RlpipeError, match="multi-agent ippo run: evaluate it with `rlpipe eval`"):
        load_policy(tmp_path / "run")  # no single observation -> action map
    collected = cli(
        "collect",
        "--env",
        "Combat-v0",
        "--expert",
        "ippo",
        "--expert-run",
        tmp_path / "run",
        "--episodes",
        "4",
        "--store",
        tmp_path / "store",
        "--quiet",
        "--stochastic",
    )
    assert collected.code == 0, collected.err
    meta = json.loads((tmp_path / "store/combat-expert/metadata.json").read_text())
    assert meta["producer"]["checkpoint_sha256"] == metrics["checkpoint_sha256"] and meta["multi_agent"]
    assert meta["producer"]["rules"]["win_reward"] == 0.0  # ma-gym's reward: IPPO's win bonus only shapes its training


# True: eval's policies keep (and reset) the last observation; with it, 3-step targets, twin critics and
# a policy ensemble (eval draws the same members as training's evaluation did, from the same seed).
@pytest.mark.parametrize("obs_deltas", [False, True])
def test_maddpg_run_writes_side_returns_and_eval_prints_them(cli, tmp_path: Path, obs_deltas: bool) -> None:
    extra = ["--set", "n_step=3", "--set", "twin_critics=true", "--set", "ensemble=2"] if obs_deltas else []
    result = cli(
        "train",
        "maddpg",
        "--env",
        "simple_adversary_v3",
        "--env-steps",
        "300",
        "--out",
        tmp_path / "run",
        "--no-progress",
        "--set",
        "learning_starts=100",
        "--set",
        "batch_size=64",
        "--set",
        "update_every=50",
        "--set",
        "eval_episodes=2",
        "--set",
        f"obs_deltas={str(obs_deltas).lower()}",
        *extra,
    )
    assert result.code == 0, result.err
    metrics = json.loads((tmp_path / "run/metrics.json").read_text())
    assert metrics["gradient_updates"] == 5 and metrics["centralised"] is True
    report = json.loads(cli("eval", tmp_path / "run", "--episodes", "2", "--seed", "10000", "--json").out)  # training's eval seed
    assert report["adversary_return_mean"] == pytest.approx(metrics["adversary_return_mean"])
    assert report["good_return_mean"] == pytest.approx(metrics["good_return_mean"])
    crossed = json.loads(
        cli("eval", tmp_path / "run", "--episodes", "2", "--seed", "10000", "--json", "--adversary-run", tmp_path / "run").out
    )  # cross-play with itself is self-play
    assert crossed["good_return_mean"] == report["good_return_mean"] and crossed["adversary_run"] == str(tmp_path / "run")
    wrong = cli("eval", tmp_path / "run", "--adversary-run", tmp_path / "nowhere")
    assert wrong.code == 2 and "no checkpoint" in wrong.err


def test_centralised_critics_see_every_agent_independent_ones_only_their_own() -> None:
    obs_dims, n_actions = [8, 10, 10], [5, 5, 5]
    central = maddpg.Critics(obs_dims, n_actions, (16,), centralised=True)
    independent = maddpg.Critics(obs_dims, n_actions, (16,), centralised=False)
    assert [net[0].in_features for net in central.nets] == [43, 43, 43]
    assert [net[0].in_features for net in independent.nets] == [13, 15, 15]
    obs = [torch.randn(4, d, requires_grad=True) for d in obs_dims]
    acts = [torch.eye(5)[:4] for _ in n_actions]
    central(0, obs, acts).sum().backward()
    assert all(o.grad is not None for o in obs)
    obs = [o.detach().requires_grad_() for o in obs]
    independent(0, obs, acts).sum().backward()
    assert obs[0].grad is not None and obs[1].grad is None and obs[2].grad is None


def test_actor_loss_reaches_only_its_own_actor_through_the_gumbel_softmax() -> None:
    from rlpipe.algos.maddpg import AgentActors

    torch.manual_seed(0)
    actors = AgentActors(["a", "b"], [3, 3], [4, 4], (8,))
    critics = maddpg.Critics([3, 3], [4, 4], (8,), centralised=True)
    batch = {"obs": [torch.randn(32, 3), torch.randn(32, 3)], "members": torch.zeros(32, 2, dtype=torch.long)}
    maddpg.actor_loss(0, batch, critics, actors, logits_l2=1e-3).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in actors.nets[0].parameters())
    assert all(p.grad is None for p in actors.nets[1].parameters())


def test_obs_deltas_carry_the_velocity_that_mpe_observations_lack() -> None:
    from rlpipe.envs.multiagent import make_parallel_env
    from rlpipe.training.multiagent.mpe import with_obs_delta

    env = make_parallel_env("simple_adversary_v3")
    obs, _ = env.reset(seed=0)
    world, scenario = env.unwrapped.world, env.unwrapped.scenario
    adversary = world.agents[0]
    for _ in range(3):  # the adversary accelerates to the right
        prev, velocity = obs["adversary_0"], adversary.state.p_vel.copy()  # the velocity this step moves with
        obs, *_ = env.step({a: 2 if a == "adversary_0" else 0 for a in env.agents})
    x = with_obs_delta(obs["adversary_0"], prev)
    # The control: the raw observation is the same at rest; the landmarks' change is -velocity * dt.
    moving = scenario.observation(adversary, world)
    adversary.state.p_vel[:] = 0.0
    assert np.array_equal(scenario.observation(adversary, world), moving) and velocity[0] > 0.5
    np.testing.assert_allclose(x[8:10], -velocity * world.dt, atol=1e-6)
    np.testing.assert_allclose(x[10:12], -velocity * world.dt, atol=1e-6)


def test_agent_policy_feeds_the_observation_change_and_evaluation_resets_it() -> None:
    from rlpipe.algos.maddpg import AgentActors
    from rlpipe.training.multiagent.mpe import AgentPolicy, evaluate_sides

    actors = AgentActors(["a"], [2], [3], (4,), obs_deltas=True)
    assert actors.nets[0][0].in_features == 4
    seen: list[list[float]] = []
    actors.act = lambda i, x, deterministic=True, member=0: (seen.append(x[0].tolist()), torch.zeros(1, dtype=torch.long))[1]
    policy = AgentPolicy(actors, 0, torch.device("cpu"))
    for o in ([1.0, 2.0], [1.5, 2.0]):
        policy(np.array(o, np.float32))
    policy.reset()
    policy(np.array([3.0, 3.0], np.float32))
    policy(np.array([4.0, 3.0], np.float32))  # the control: without a reset the change carries over
    assert seen == [[1.0, 2.0, 0.0, 0.0], [1.5, 2.0, 0.5, 0.0], [3.0, 3.0, 0.0, 0.0], [4.0, 3.0, 1.0, 0.0]]

    class Counting:
        resets = 0

        def reset(self) -> None:
            self.resets += 1

        def __call__(self, obs: np.ndarray) -> int:
            return 0

    policies = {a: Counting() for a in ("adversary_0", "agent_0", "agent_1")}
    evaluate_sides(policies, "simple_adversary_v3", 3, 0)
    assert [p.resets for p in policies.values()] == [3, 3, 3]


def test_ippo_ends_an_agents_episode_at_its_death() -> None:
    """A dead agent's value is not bootstrapped: GAE sees its death as a termination."""
    from rlpipe.training.onpolicy import compute_gae

    rewards = torch.tensor([[0.0], [-1.0], [0.0]])
    values = torch.ones(3, 1)
    term = torch.tensor([[False], [True], [False]])  # died at step 1
    valid = torch.tensor([[True], [True], [False]])  # not acting afterwards
    adv, _ = compute_gae(rewards, values, torch.ones(1), term, torch.zeros(3, 1, dtype=torch.bool), valid, 0.9, 1.0)
    assert adv[1, 0].item() == pytest.approx(-2.0) and adv[2, 0].item() == 0.0
    assert adv[0, 0].item() == pytest.approx(0.9 * 1.0 - 1.0 + 0.9 * -2.0)


def test_ippo_win_bonus_shapes_its_rows_reward_and_not_the_envs(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlpipe.envs.combat import NOOP, CombatVectorEnv
    from rlpipe.training.multiagent.combat import CombatRows

    envs = CombatVectorEnv(1)
    rows = CombatRows(envs, agent_ids=False, seed=0, win_bonus=10.0)
    envs.games.pos[0] = np.array([(5, 5), (9, 9), (5, 6), (9, 10)])  # each agent next to one bot
    envs.games.hp[0, 2:] = 1
    monkeypatch.setattr(envs.games, "bot_actions", lambda rng: np.full((1, 2), NOOP))
    step = rows.step(np.array([5, 6]))  # both bots shot dead: the team wins
    assert envs.rules.win_reward == 0.0  # ma-gym's reward: +1 per hit
    assert step.rewards.tolist() == [11.0, 11.0] and rows.wins == 1


def _death_then_win(monkeypatch: pytest.MonkeyPatch, **options: bool) -> tuple[list, torch.Tensor]:
    """Agent 0 is shot dead, then agent 1 kills the last bot: the two rows' steps and their
    GAE advantages (values 0, gamma = lambda = 1: each step's return-to-go)."""
    from rlpipe.envs.combat import NOOP, CombatVectorEnv
    from rlpipe.training.multiagent.combat import CombatRows
    from rlpipe.training.onpolicy import compute_gae

    envs = CombatVectorEnv(1)
    rows = CombatRows(envs, agent_ids=False, seed=0, win_bonus=10.0, **options)
    envs.games.pos[0] = np.array([(5, 5), (6, 7), (5, 6), (12, 12)])  # bot 2 next to both agents
    envs.games.hp[0] = [1, 3, 1, 0]  # bot 3 already dead
    bot_moves = iter([np.array([[5, NOOP]]), np.array([[NOOP, NOOP]])])  # bot 2 shoots agent 0, then idles
    monkeypatch.setattr(envs.games, "bot_actions", lambda rng: next(bot_moves))
    steps = [rows.step(np.array([NOOP, NOOP])), rows.step(np.array([NOOP, 5]))]  # agent 1 shoots bot 2: a win
    field = lambda name: torch.tensor(np.stack([getattr(s, name) for s in steps]))  # noqa: E731
    adv, _ = compute_gae(
        field("rewards").float(), torch.zeros(2, 2), torch.zeros(2), field("terminated"), field("truncated"), field("valid"), 1.0, 1.0
    )
    return steps, adv


def test_ippo_carry_dead_credits_a_dead_agent_with_its_teams_later_win(monkeypatch: pytest.MonkeyPatch) -> None:
    steps, adv = _death_then_win(monkeypatch, carry_dead=True)
    assert steps[0].terminated.tolist() == [False, False] and steps[1].terminated.tolist() == [True, True]
    assert steps[1].valid.tolist() == [True, True] and steps[1].acting.tolist() == [False, True]  # value-only when dead
    assert adv[0, 0].item() == pytest.approx(-1.0 + 10.0)  # its fatal step earns the win that followed
    steps, adv = _death_then_win(monkeypatch)  # control: its row ends at its death
    assert steps[0].terminated.tolist() == [True, False] and adv[0, 0].item() == pytest.approx(-1.0)


def test_ippo_team_reward_gives_every_agent_the_teams_mean(monkeypatch: pytest.MonkeyPatch) -> None:
    steps, _ = _death_then_win(monkeypatch, team_reward=True, carry_dead=True)
    assert steps[0].rewards.tolist() == [-0.5, -0.5] and steps[1].rewards.tolist() == [10.5, 10.5]
    steps, _ = _death_then_win(monkeypatch, carry_dead=True)  # control: each agent's own reward
    assert steps[0].rewards.tolist() == [-1.0, 0.0] and steps[1].rewards.tolist() == [10.0, 11.0]


def test_ppo_loss_trains_only_the_value_on_rows_that_do_not_act() -> None:
    """A carried dead agent's rows (``acting`` False) teach the value, never the policy."""
    from types import SimpleNamespace

    from rlpipe.algos.ppo import clipped_loss
    from rlpipe.nets.networks import ActorCritic
    from rlpipe.training.onpolicy import PPOBatch

    torch.manual_seed(0)
    net = ActorCritic(3, 4, True, (8,))
    settings = SimpleNamespace(normalize_advantages=True, vf_coef=0.5, ent_coef=0.01)
    obs, actions = torch.randn(6, 3), torch.tensor([0, 1, 2, 3, 0, 1])
    log_probs = net.log_prob_entropy(net(obs)[0], actions)[0].detach()
    adv, ret = torch.randn(6), torch.randn(6)
    acting = torch.tensor([True, True, True, True, False, False])

    def loss(acting: torch.Tensor | None, adv: torch.Tensor, ret: torch.Tensor) -> float:
        batch = PPOBatch(obs, actions, log_probs + torch.linspace(-0.1, 0.1, 6), adv, ret, acting)
        return clipped_loss(net, batch, torch.arange(6), 0.2, settings)[0].item()

    other_adv, other_ret = adv.clone(), ret.clone()
    other_adv[4:], other_ret[4:] = 5.0, 5.0
    assert loss(acting, other_adv, ret) == pytest.approx(loss(acting, adv, ret))  # their advantages are unused
    assert loss(acting, adv, other_ret) != pytest.approx(loss(acting, adv, ret))  # their value targets are not
    assert loss(None, other_adv, ret) != pytest.approx(loss(None, adv, ret))  # control: every row acts


def test_ippo_central_critic_values_teammates_observations_the_policy_only_its_own() -> None:
    from rlpipe.algos.ippo import CentralCriticActorCritic
    from rlpipe.envs.combat import CombatVectorEnv
    from rlpipe.nets.networks import ActorCritic
    from rlpipe.training.multiagent.combat import CombatRows

    rows = CombatRows(CombatVectorEnv(8), agent_ids=True, seed=0, teammates_obs=True)
    assert rows.obs.shape == (16, 152 + 150)
    games = rows.obs.reshape(8, 2, -1)
    assert (games[:, 0, 152:] == games[:, 1, :150]).all() and (games[:, 1, 152:] == games[:, 0, :150]).all()
    torch.manual_seed(0)
    net = CentralCriticActorCritic(ActorCritic(152, 7, True, (16,)), 152, 302, (16,))
    x = torch.randn(4, 302, requires_grad=True)
    head, value = net(x)
    (grad_head,) = torch.autograd.grad(head.sum(), x, retain_graph=True)
    (grad_value,) = torch.autograd.grad(value.sum(), x)
    assert (grad_head[:, 152:] == 0).all() and (grad_head[:, :152] != 0).any()
    assert (grad_value[:, 152:] != 0).any()


def test_combat_dataset_has_one_row_per_living_agent_per_step(cli, store: Path) -> None:
    import polars as pl

    result = cli("collect", "--env", "Combat-v0", "--policy", "random", "--episodes", "12", "--num-envs", "4", "--store", store, "--quiet")
    assert result.code == 0, result.err
    rows = pl.read_ipc(next((store / "combat-random/steps").glob("*.arrow")))
    assert set(rows["agent"].unique()) == {"agent_0", "agent_1"} and rows["episode_id"].n_unique() == 12
    per_step = rows.group_by("episode_id", "step").agg(pl.len().alias("n"), pl.col("agent").n_unique().alias("agents"))
    assert (per_step["n"] == per_step["agents"]).all() and per_step["n"].max() == 2
    # A living agent sees itself at the centre of its window (team +1, hp >= 1).
    centre = np.stack(rows["obs"].to_numpy()).reshape(-1, 6, 5, 5)[:, :3, 2, 2]
    assert (centre[:, 0] == 1.0).all() and (centre[:, 2] >= 1).all()
    ends = rows.group_by("episode_id").agg((pl.col("terminated") | pl.col("truncated")).sum().alias("ends"), pl.col("step").max())
    assert (ends["ends"] >= 1).all() and (ends["step"] < 100).all()
    again = cli(
        "collect",
        "--env",
        "Combat-v0",
        "--policy",
        "random",
        "--episodes",
        "12",
        "--num-envs",
        "4",
        "--store",
        store,
        "--quiet",
        "--name",
        "again",
    )
    assert again.code == 0
    assert pl.read_ipc(next((store / "again/steps").glob("*.arrow"))).equals(rows)  # same seed, same rows


def test_every_combat_episode_starts_at_step_0_and_validates(cli, store: Path) -> None:
    """One game plays the episodes back to back (each after an autoreset step): every agent's
    rows count 0, 1, ...; the validator's multi-agent invariant holds, and catches a shard
    whose first step is missing (the control)."""
    import polars as pl

    from rlpipe.datasets.checks import multi_agent_row_problems
    from rlpipe.datasets.store import list_datasets
    from rlpipe.datasets.validate import validate_dataset

    assert (
        cli("collect", "--env", "Combat-v0", "--policy", "random", "--episodes", "4", "--num-envs", "1", "--store", store, "--quiet").code
        == 0
    )
    rows = pl.read_ipc(next((store / "combat-random/steps").glob("*.arrow")))
    assert rows.group_by("episode_id", "agent").agg(pl.col("step").min())["step"].to_list() == [0] * 8
    assert validate_dataset(list_datasets(store)[0]) == []
    late = rows.filter(~((pl.col("episode_id") == 1) & (pl.col("step") == 0)))
    columns = {name: late[name].to_numpy() for name in ("episode_id", "step", "agent", "terminated", "truncated")}
    assert any("steps do not count" in p for p in multi_agent_row_problems(-1, **columns))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--format", "hdf5"], "multi-agent datasets are Arrow-only"),
        (["--format", "both"], "multi-agent datasets are Arrow-only"),
        (["--expert", "ppo"], "--expert ippo --expert-run"),
        (["--steps", "100"], "give --episodes N"),
    ],
)
def test_bad_multi_agent_collection_is_exit_2(cli, store: Path, args: list[str], message: str) -> None:
    result = cli(
        "collect", "--env", "Combat-v0", "--store", store, "--quiet", *(["--episodes", "3"] if "--steps" not in args else []), *args
    )
    assert result.code == 2 and message in result.err, result.err
    assert not any(store.iterdir())


def test_combat_rows_end_an_agents_episode_at_its_death_and_skip_it_afterwards() -> None:
    """IPPO's rows (one per game x agent) for the shared on-policy storage: an agent's death
    is a termination of its row, and a dead agent's later steps are not trained on."""
    from rlpipe.envs.combat import CombatVectorEnv
    from rlpipe.training.multiagent.combat import CombatRows

    rows = CombatRows(CombatVectorEnv(8), agent_ids=True, seed=0)
    assert rows.obs.shape == (16, 150 + 2) and (rows.obs[:, -2:] == np.tile(np.eye(2), (8, 1))).all()
    rng = np.random.default_rng(0)
    deaths = 0
    for _ in range(300):
        alive = rows.alive.reshape(-1).copy()
        step = rows.step(rng.integers(0, 7, size=16))
        died = alive & ~rows.alive.reshape(-1) & step.valid
        deaths += int(died.sum())
        assert step.terminated[died].all()
        assert not step.valid[~alive].any()  # dead before the step: not acting
    assert deaths > 0 and rows.episodes > 0


def test_bc_learns_one_shared_policy_from_an_ippo_teams_combat_data(cli, tmp_path: Path, record_property) -> None:
    """Imitation from the pipeline's own multi-agent data: a greedy IPPO team's rows (both
    agents) train one BC policy that picks the team's actions; a run that does not learn
    (learning rate 0) is the control. The run is scored by win rate like IPPO."""
    import polars as pl

    from rlpipe.algos import get_algo
    from rlpipe.datasets.loader import load_shards
    from rlpipe.datasets.store import open_dataset
    from rlpipe.datasets.summary import agent_table

    ippo = get_algo("ippo")
    ippo.train(
        ippo.make_config("Combat-v0", env_steps=2048, num_envs=16, num_steps=64, eval_episodes=4, eval_deterministic=True),
        tmp_path / "ippo",
        progress=False,
    )
    store = tmp_path / "store"
    assert (
        cli(
            "collect",
            "--env",
            "Combat-v0",
            "--expert",
            "ippo",
            "--expert-run",
            tmp_path / "ippo",
            "--episodes",
            "16",
            "--num-envs",
            "8",
            "--store",
            store,
            "--quiet",
        ).code
        == 0
    )
    inspect = cli("datasets", "inspect", "combat-expert", "--store", store)
    assert "per-agent episode returns" in inspect.out and "agent_0" in inspect.out and "agent_1" in inspect.out
    rows = pl.read_ipc(next((store / "combat-expert/steps").glob("*.arrow")))
    per_agent = rows.group_by("agent").agg(pl.col("reward").sum() / 16, pl.len()).sort("agent")
    table = agent_table(open_dataset("combat-expert", store))
    assert table["return mean"].to_list() == pytest.approx(per_agent["reward"].to_list())
    assert table["steps"].to_list() == per_agent["len"].to_list() and table["episodes"].to_list() == [16, 16]

    data = load_shards(open_dataset("combat-expert", store))
    bc = get_algo("bc")

    def agreement(learn: bool = True) -> float:
        config = bc.make_config("Combat-v0", dataset="combat-expert", store=str(store), updates=300, eval_every=300, eval_episodes=4)
        if not learn:  # the control: set on the built config, whose checks refuse a zero rate
            config.learning_rate = 0.0
        actor = bc.train(config, progress=False).policy
        agree = float((actor.act(torch.as_tensor(data.obs)).numpy() == data.action).mean())
        record_property(f"bc_agreement_learn_{learn}", agree)
        return agree

    # Seed 0: 0.998 of the rows' actions after 300 updates; 0.0004 without learning.
    assert agreement() >= 0.9
    assert agreement(learn=False) < 0.5

    result = cli(
        "train",
        "bc",
        "--dataset",
        "combat-expert",
        "--store",
        store,
        "--updates",
        "50",
        "--set",
        "eval_every=50",
        "--set",
        "eval_episodes=6",
        "--out",
        tmp_path / "bc",
        "--no-progress",
        "--device",
        "cpu",
    )
    assert result.code == 0 and "win rate" in result.out, result.err
    metrics = json.loads((tmp_path / "bc/metrics.json").read_text())
    assert metrics["eval_win_rate"] == metrics["eval_success_rate"] and "eval_return_agent_1" in metrics
    report = json.loads(cli("eval", tmp_path / "bc", "--episodes", "6", "--json").out)
    assert report["algo"] == "bc" and 0.0 <= report["win_rate"] <= 1.0 and len(report["agent_returns"]) == 2
    with pytest.raises(RlpipeError, match="multi-agent bc run: evaluate it with `rlpipe eval`"):
        load_policy(tmp_path / "bc")
    refused = cli("train", "td3bc", "--dataset", "combat-expert", "--store", store, "--out", tmp_path / "td3bc")
    assert refused.code == 2 and "Discrete" in refused.err and not (tmp_path / "td3bc").exists(), refused.err


def test_ippo_attack_mask_is_exactly_the_attacks_that_can_hit() -> None:
    """The mask read from an agent's own observation agrees with the rules' hit condition
    (target alive in the 3x3 neighbourhood, attacker alive and ready) in random games, and
    gives the useless attacks zero probability; the unmasked policy (control) does not."""
    from rlpipe.envs.combat import N_MOVES, CombatVectorEnv
    from rlpipe.training.multiagent.combat import CombatActorCritic

    envs = CombatVectorEnv(64)
    obs, _ = envs.reset(seed=0)
    masked, unmasked = (CombatActorCritic(150, 7, 2, (16,), mask_attacks=m).requires_grad_(False) for m in (True, False))
    rng = np.random.default_rng(0)
    seen = np.zeros(2, np.int64)  # (can hit, cannot hit) agent-opponent pairs
    for _ in range(200):
        g = envs.games
        near = (np.abs(g.pos[:, :2, None] - g.pos[:, None, 2:]).max(-1) <= 1) & (g.hp[:, None, 2:] > 0)
        can_hit = (near & ((g.hp[:, :2] > 0) & ~g.cooling[:, :2])[..., None]).reshape(-1, 2)  # [games x agents, opponents]
        x = torch.as_tensor(obs.reshape(-1, 150))
        assert (masked.attack_mask(x).numpy() == can_hit).all()
        head = masked(x)[0]
        probs = head.softmax(-1)[:, N_MOVES:].numpy()
        assert (probs[~can_hit] == 0).all() and (probs[can_hit] > 0).all()
        assert masked.log_prob_entropy(head, masked.sample(head))[1].isfinite().all()  # no nan from 0 * log 0
        assert (unmasked(x)[0].softmax(-1)[:, N_MOVES:].numpy()[~can_hit] > 0).all()  # the control
        seen += can_hit.sum(), (~can_hit).sum()
        obs, *_ = envs.step(rng.integers(0, 7, size=(64, 2)))
    assert seen.min() > 100


def test_ippo_attack_mask_survives_the_checkpoint(cli, tmp_path: Path) -> None:
    """A masked run is rebuilt with its mask for `rlpipe eval` and `collect --expert ippo`."""
    result = cli(
        "train",
        "ippo",
        "--env",
        "Combat-v0",
        "--env-steps",
        "2048",
        "--out",
        tmp_path / "run",
        "--no-progress",
        "--num-envs",
        "16",
        "--set",
        "num_steps=64",
        "--set",
        "eval_episodes=8",
        "--set",
        "mask_attacks=true",
    )
    assert result.code == 0, result.err
    from rlpipe.commands.experts import load_saved_actor

    actor = load_saved_actor(tmp_path / "run").actor
    assert actor.mask_attacks and actor(torch.zeros(1, 152))[0][0, 5:].max() < -1e8  # a dead agent cannot attack
    report = json.loads(cli("eval", tmp_path / "run", "--episodes", "8", "--json").out)
    assert 0.0 <= report["win_rate"] <= 1.0 and report["episodes"] == 8
    collected = cli(
        "collect",
        "--env",
        "Combat-v0",
        "--expert",
        "ippo",
        "--expert-run",
        tmp_path / "run",
        "--episodes",
        "4",
        "--store",
        tmp_path / "store",
        "--quiet",
    )
    assert collected.code == 0, collected.err


def test_n_step_window_sums_discounted_rewards_and_flushes_at_the_episode_end() -> None:
    def episode(n: int, terminated: bool) -> list[tuple[float, float, float, float]]:
        window, out = maddpg.NStepWindow(n, gamma=0.5), []
        for t in range(4):  # rewards 1..4; observation t, next observation t + 1
            last = t == 3
            done = window.push([np.array([t])], np.array([0]), np.array([t + 1.0]), [np.array([t + 1])], terminated and last, last)
            out += [(float(o[0][0]), float(r[0]), float(o2[0][0]), d) for o, _, r, o2, d in done]
        return out

    # (o_t, sum_k 0.5^k r_{t+k}, o_{t+m}, 0.5^m): m = 3, then fewer at the truncation, all bootstrapping from o_4.
    assert episode(3, terminated=False) == [(0, 2.75, 3, 0.125), (1, 4.5, 4, 0.125), (2, 5.0, 4, 0.25), (3, 4.0, 4, 0.5)]
    assert [d for *_, d in episode(3, terminated=True)] == [0.125, 0.0, 0.0, 0.0]  # a termination ends every bootstrap
    # The control: n = 1 is the one-step transition (r_t, o_{t+1}, gamma).
    assert episode(1, terminated=False) == [(t, t + 1.0, t + 1, 0.5) for t in range(4)]


def test_twin_critics_regress_both_copies_on_the_smaller_target() -> None:
    torch.manual_seed(0)
    from rlpipe.algos.maddpg import AgentActors

    actors = AgentActors(["a", "b"], [3, 3], [4, 4], (8,))
    batch = {
        "obs": [torch.randn(16, 3)] * 2,
        "next_obs": [torch.randn(16, 3)] * 2,
        "actions": torch.zeros(16, 2, dtype=torch.long),
        "rewards": torch.zeros(16, 2),
        "discount": torch.ones(16),
        "members": torch.zeros(16, 2, dtype=torch.long),
    }

    def constant(critics: maddpg.Critics, values: list[float]) -> maddpg.Critics:
        for net, v in zip([critics.nets[0], *(critics.twins or [])[:1]], values):
            with torch.no_grad():
                net[-1].weight.zero_()
                net[-1].bias.fill_(v)
        return critics

    online = constant(maddpg.Critics([3, 3], [4, 4], (8,), True, twin=True), [0.0, 0.0])
    target = constant(maddpg.Critics([3, 3], [4, 4], (8,), True, twin=True), [5.0, 2.0])
    next_actions = maddpg.target_next_actions(batch, actors)
    assert maddpg.critic_loss(0, batch, online, target, next_actions, [4, 4]).item() == pytest.approx(2 * 2.0**2)  # both copies vs 2
    # The control: one critic regresses on its own target copy (5).
    single = constant(maddpg.Critics([3, 3], [4, 4], (8,), True), [0.0])
    assert maddpg.critic_loss(0, batch, single, target, next_actions, [4, 4]).item() == pytest.approx(5.0**2)


def test_policy_ensemble_draws_one_member_per_agent_and_episode_from_a_seeded_stream() -> None:
    from rlpipe.algos.maddpg import AgentActors
    from rlpipe.training.multiagent.mpe import AgentPolicy

    torch.manual_seed(0)
    actors = AgentActors(["a", "b"], [2, 2], [3, 3], (4,), ensemble=3)
    assert len(actors.nets) == 6 and actors.spec["ensemble"] == 3
    for k in range(3):  # member k of agent 0 always picks action k
        with torch.no_grad():
            actors.nets[k * 2][-1].weight.zero_()
            actors.nets[k * 2][-1].bias.copy_(torch.eye(3)[k])

    def episodes(seed: int, agent: int = 0, count: int = 40) -> list[int]:
        policy, acted = AgentPolicy(actors, agent, torch.device("cpu"), seed=seed), []
        for _ in range(count):
            policy.reset()
            acted.append(policy.member)
            if agent == 0:
                assert policy(np.zeros(2, np.float32)) == policy.member  # the drawn member acts
        return acted

    assert episodes(7) == episodes(7) and set(episodes(7)) == {0, 1, 2}
    assert episodes(7) != episodes(8) and episodes(7) != episodes(7, agent=1)  # a stream per seed and agent
    # The control: a single policy never draws.
    single = AgentActors(["a"], [2], [3], (4,))
    policy = AgentPolicy(single, 0, torch.device("cpu"), seed=7)
    for _ in range(5):
        policy.reset()
        assert policy.member == 0


def test_ensemble_rows_use_the_member_that_acted_and_member_k_learns_from_its_rows() -> None:
    from rlpipe.algos.maddpg import AgentActors

    torch.manual_seed(0)
    actors = AgentActors(["a", "b"], [3, 3], [4, 4], (8,), ensemble=2)
    obs, members = torch.randn(6, 3), torch.tensor([0, 1, 1, 0, 1, 0])
    picked = actors.member_logits(1, obs, members)
    for row, k in enumerate(members.tolist()):
        assert torch.equal(picked[row], actors.logits(1, obs, k)[row])
    assert not torch.allclose(actors.logits(1, obs, 0), actors.logits(1, obs, 1))  # the members differ

    critics = maddpg.Critics([3, 3], [4, 4], (8,), centralised=True)
    critics.forward = lambda i, o, a, copy=0: 10 * o[0][:, 0] + 0 * sum(x.sum(-1) for x in a)  # Q_0 known per row
    batch = {"obs": [obs, torch.randn(6, 3)], "members": torch.stack([members, 1 - members], 1)}
    loss = maddpg.actor_loss(0, batch, critics, actors, logits_l2=0.0, member=1)
    assert loss.item() == pytest.approx(-10 * obs[members == 1, 0].mean().item(), rel=1e-5)  # agent 0's member-1 rows
    loss.backward()
    assert all(p.grad is None for p in actors.nets[0].parameters())  # member 0 of agent 0 untouched
    # The control: a single policy averages over every row.
    single = AgentActors(["a", "b"], [3, 3], [4, 4], (8,))
    assert maddpg.actor_loss(0, batch, critics, single, logits_l2=0.0).item() == pytest.approx(-10 * obs[:, 0].mean().item(), rel=1e-5)


def test_gumbel_targets_draw_from_the_target_actors_softmax_greedy_targets_take_its_argmax() -> None:
    from rlpipe.algos.maddpg import AgentActors

    torch.manual_seed(0)
    actors = AgentActors(["a", "b"], [3, 3], [4, 4], (8,))
    probs = torch.tensor([0.1, 0.6, 0.3, 0.0])
    with torch.no_grad():  # agent 0's logits are log(probs) whatever it observes
        actors.nets[0][-1].weight.zero_()
        actors.nets[0][-1].bias.copy_(probs.clamp(min=1e-9).log())
    batch = {"next_obs": [torch.randn(20_000, 3)] * 2, "members": torch.zeros(20_000, 2, dtype=torch.long)}
    sampled = maddpg.target_next_actions(batch, actors, sample=True)[0]
    assert torch.equal(sampled.sum(-1), torch.ones(20_000))  # one-hot rows
    assert torch.allclose(sampled.mean(0), probs, atol=0.015)
    # The control: greedy targets always take the most probable action.
    assert torch.equal(maddpg.target_next_actions(batch, actors)[0], torch.eye(4)[1].expand(20_000, 4))


def test_replayed_others_put_the_others_replayed_actions_in_the_actor_loss() -> None:
    from rlpipe.algos.maddpg import AgentActors

    torch.manual_seed(0)
    actors = AgentActors(["a", "b"], [3, 3], [4, 4], (8,))
    critics = maddpg.Critics([3, 3], [4, 4], (8,), centralised=True)
    critics.forward = lambda i, o, a, copy=0: a[1][:, 2] + 0 * a[0].sum(-1)  # Q_0 = 1 where agent 1 took action 2
    obs = [torch.randn(8, 3), torch.randn(8, 3)]
    replayed = torch.tensor([2, 2, 2, 2, 0, 0, 1, 3])
    batch = {
        "obs": obs,
        "actions": torch.stack([torch.zeros(8, dtype=torch.long), replayed], 1),
        "members": torch.zeros(8, 2, dtype=torch.long),
    }
    assert maddpg.actor_loss(0, batch, critics, actors, 0.0, replayed_others=True).item() == pytest.approx(-0.5)
    # The control: by default agent 1's current greedy actions stand in for the replayed ones.
    greedy = actors.logits(1, obs[1]).argmax(-1)
    default = maddpg.actor_loss(0, batch, critics, actors, 0.0).item()
    assert default == pytest.approx(-(greedy == 2).float().mean().item()) and default != pytest.approx(-0.5)
