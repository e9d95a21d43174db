"""Combat's rules, each by a small scripted scenario, and the PettingZoo API."""

from __future__ import annotations

import numpy as np
import pytest
from pettingzoo.test import parallel_api_test

from rlpipe.envs.combat import INIT_HP, NOOP, CombatEnv, CombatVectorEnv
from rlpipe.errors import RlpipeError

DOWN, LEFT, UP, RIGHT = 0, 1, 2, 3
ATTACK_0, ATTACK_1 = 5, 6


def scenario(agents: list[tuple[int, int]], bots: list[tuple[int, int]], **rules) -> CombatEnv:
    """A 2 vs 2 game with units placed by hand (full hp, all ready)."""
    env = CombatEnv(**rules)
    env.reset(seed=0)
    env.games.pos[0] = np.array(agents + bots)
    return env


def step(env: CombatEnv, a0: int, a1: int = NOOP) -> tuple[dict, dict, dict, dict, dict]:
    return env.step({"agent_0": a0, "agent_1": a1})


def freeze_bots(env: CombatEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bots only wait: isolates the agents' rules from the scripted policy."""
    monkeypatch.setattr(env.games, "bot_actions", lambda rng: np.full((1, 2), NOOP))


def test_parallel_api() -> None:
    parallel_api_test(CombatEnv(), num_cycles=200)


def test_spaces_match_ma_gym() -> None:
    env = CombatEnv()
    assert env.observation_space("agent_0").shape == (150,)
    assert env.action_space("agent_0").n == 7
    assert CombatEnv(n_opponents=3).action_space("agent_0").n == 8


def test_attack_range_is_the_3x3_neighbourhood(monkeypatch: pytest.MonkeyPatch) -> None:
    env = scenario([(5, 5), (0, 0)], [(6, 6), (5, 7)])  # bot 0 diagonal-adjacent, bot 1 two cells away
    freeze_bots(env, monkeypatch)
    _, rewards, *_ = step(env, ATTACK_0)
    assert rewards["agent_0"] == 1.0 and env.games.hp[0, 2] == INIT_HP - 1
    step(env, NOOP)  # cooldown
    _, rewards, *_ = step(env, ATTACK_1)
    assert rewards["agent_0"] == 0.0 and env.games.hp[0, 3] == INIT_HP


def test_cooldown_blocks_the_next_shot_only(monkeypatch: pytest.MonkeyPatch) -> None:
    env = scenario([(5, 5), (0, 0)], [(5, 6), (14, 14)])
    freeze_bots(env, monkeypatch)
    hits = [step(env, ATTACK_0)[1]["agent_0"] for _ in range(4)]
    assert hits == [1.0, 0.0, 1.0, 0.0]
    env = scenario([(5, 5), (0, 0)], [(5, 6), (14, 14)], cooldown=False)
    freeze_bots(env, monkeypatch)
    assert [step(env, ATTACK_0)[1]["agent_0"] for _ in range(2)] == [1.0, 1.0]


def test_cooldown_shows_in_the_observation(monkeypatch: pytest.MonkeyPatch) -> None:
    env = scenario([(5, 5), (0, 0)], [(5, 6), (14, 14)])
    freeze_bots(env, monkeypatch)
    obs, *_ = step(env, ATTACK_0)
    window = obs["agent_0"].reshape(6, 5, 5)
    assert window[3, 2, 2] == -1.0 and window[3, 2, 3] == 1.0  # self cooling, bot ready
    assert window[2, 2, 3] == INIT_HP - 1 and window[0, 2, 3] == -1.0 and window[0, 2, 2] == 1.0
    assert window[4, 2, 3] == pytest.approx(5 / 15) and window[5, 2, 3] == pytest.approx(6 / 15)


def test_three_hits_kill_and_a_dead_unit_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    env = scenario([(5, 5), (6, 6)], [(5, 6), (14, 14)])
    freeze_bots(env, monkeypatch)
    step(env, ATTACK_0, ATTACK_0)  # two agents, two hits in one step
    assert env.games.hp[0, 2] == 1
    step(env, NOOP, NOOP)
    _, rewards, *_ = step(env, ATTACK_0, ATTACK_0)  # the second shot finds it dead: no hit
    assert env.games.hp[0, 2] == 0 and (rewards["agent_0"], rewards["agent_1"]) == (1.0, 0.0)
    obs, *_ = step(env, RIGHT, NOOP)  # its cell is free now
    assert tuple(env.games.pos[0, 0]) == (5, 6)
    team = obs["agent_0"].reshape(6, 5, 5)[0]
    assert team[2, 2] == 1.0 and team[3, 2] == 1.0 and team.sum() == 2.0  # itself and agent_1; the bot is gone


def test_attacks_resolve_on_pre_step_state_then_moves(monkeypatch: pytest.MonkeyPatch) -> None:
    env = scenario([(5, 5), (0, 0)], [(5, 6), (14, 14)])
    env.games.hp[0, [0, 2]] = 1
    monkeypatch.setattr(env.games, "bot_actions", lambda rng: np.array([[ATTACK_0, NOOP]]))
    _, rewards, terminated, _, infos = step(env, ATTACK_0)  # both shoot: both die
    assert env.games.hp[0, 0] == 0 and env.games.hp[0, 2] == 0
    assert rewards["agent_0"] == 0.0  # +1 for the hit, -1 for being hit
    assert not infos["agent_0"]["win"] and not terminated["agent_0"]  # agent_1 and bot 1 live on
    env = scenario([(5, 5), (0, 0)], [(5, 7), (14, 14)])
    monkeypatch.setattr(env.games, "bot_actions", lambda rng: np.array([[LEFT, NOOP]]))
    step(env, ATTACK_0)  # the attack is checked before the bot steps into range: a miss
    assert env.games.hp[0, 2] == INIT_HP and tuple(env.games.pos[0, 2]) == (5, 6)


def test_moves_stay_on_the_board_and_off_occupied_cells(monkeypatch: pytest.MonkeyPatch) -> None:
    env = scenario([(0, 0), (0, 1)], [(14, 14), (13, 14)])
    freeze_bots(env, monkeypatch)
    step(env, UP, LEFT)  # off the board; into agent_0's cell
    assert env.games.pos[0, :2].tolist() == [[0, 0], [0, 1]]
    step(env, DOWN, LEFT)  # agent_0 moves first, freeing its cell for agent_1
    assert env.games.pos[0, :2].tolist() == [[1, 0], [0, 0]]


def test_win_when_the_bots_are_wiped_out(monkeypatch: pytest.MonkeyPatch) -> None:
    env = scenario([(5, 5), (9, 9)], [(5, 6), (9, 10)], win_reward=100.0, step_reward=-0.1)
    freeze_bots(env, monkeypatch)
    env.games.hp[0, 2:] = 1
    _, rewards, terminated, truncated, infos = step(env, NOOP, NOOP)
    assert rewards["agent_0"] == pytest.approx(-0.1) and not infos["agent_0"]["win"]
    _, rewards, terminated, truncated, infos = step(env, ATTACK_0, ATTACK_1)
    assert infos["agent_0"]["win"] and infos["agent_1"]["win"] and terminated["agent_0"] and not truncated["agent_0"]
    assert rewards["agent_0"] == pytest.approx(101.0) and env.agents == []


def test_loss_and_step_limit() -> None:
    env = scenario([(5, 5), (0, 0)], [(5, 6), (14, 14)])
    env.games.hp[0, :2] = [1, 0]
    _, _, terminated, _, infos = step(env, NOOP, NOOP)  # bot 0 shoots the last agent
    assert terminated["agent_0"] and not infos["agent_0"]["win"]
    env = CombatEnv(max_steps=3)
    env.reset(seed=1)
    env.games.pos[0] = np.array([(0, 0), (0, 1), (14, 14), (14, 13)])
    truncated = [step(env, NOOP, NOOP)[3]["agent_0"] for _ in range(3)]
    assert truncated == [False, False, True]


def test_bots_attack_the_nearest_agent_in_range() -> None:
    env = scenario([(5, 7), (5, 6)], [(5, 5), (14, 14)])  # agent_1 is nearer to bot 0
    assert env.games.bot_actions(env.np_random)[0, 0] == ATTACK_1
    env.games.cooling[0, 2] = True  # a cooling bot cannot fire: it approaches instead
    assert env.games.bot_actions(env.np_random)[0, 0] in (DOWN, LEFT, UP, RIGHT, NOOP)


def test_bots_share_vision_and_approach() -> None:
    # agent_0 is 4 rows below bot 0 (out of its view) but in bot 1's view: bot 0 walks down.
    env = scenario([(9, 5), (0, 14)], [(5, 5), (10, 7)])
    assert env.games.bot_actions(env.np_random)[0, 0] == DOWN
    # diagonal target: each of the two distance-reducing moves, chosen at random
    env = scenario([(7, 7), (0, 14)], [(5, 5), (14, 0)])
    moves = {int(env.games.bot_actions(env.np_random)[0, 0]) for _ in range(50)}
    assert moves == {DOWN, RIGHT}


def test_bots_wander_when_nothing_is_visible_and_dead_bots_wait() -> None:
    env = scenario([(0, 0), (0, 1)], [(10, 10), (14, 14)])
    env.games.hp[0, 3] = 0
    acts = np.array([env.games.bot_actions(env.np_random)[0] for _ in range(200)])
    assert set(acts[:, 0]) == {DOWN, LEFT, UP, RIGHT, NOOP} and set(acts[:, 1]) == {NOOP}


def test_dead_agents_observe_zeros(monkeypatch: pytest.MonkeyPatch) -> None:
    env = scenario([(5, 5), (0, 0)], [(14, 14), (13, 14)])
    freeze_bots(env, monkeypatch)
    env.games.hp[0, 1] = 0
    obs, *_ = step(env, NOOP, NOOP)
    assert not obs["agent_1"].any() and obs["agent_0"].any()


def test_teams_start_in_4x4_patches() -> None:
    games = CombatVectorEnv(500)
    games.reset(seed=3)
    pos = games.games.pos
    for team in (slice(0, 2), slice(2, 4)):
        spread = pos[:, team].max(1) - pos[:, team].min(1)
        assert (spread <= 3).all() and (pos >= 0).all() and (pos < 15).all()
    cells = pos[..., 0] * 15 + pos[..., 1]
    assert all(len(set(c)) == 4 for c in cells)  # no two units share a cell


def test_seeded_and_batched_games_agree() -> None:
    env, vec = CombatEnv(), CombatVectorEnv(1)
    obs, _ = env.reset(seed=7)
    vobs, _ = vec.reset(seed=7)
    rng = np.random.default_rng(0)
    for _ in range(40):
        np.testing.assert_array_equal(np.stack(list(obs.values())), vobs[0])
        if not env.agents:
            break
        action = rng.integers(0, 7, size=2)
        obs, rewards, *_ = env.step({"agent_0": action[0], "agent_1": action[1]})
        vobs, vrew, *_ = vec.step(action[None])
        assert list(rewards.values()) == vrew[0].tolist()


def test_vector_env_autoresets_on_the_next_step() -> None:
    vec = CombatVectorEnv(4, max_steps=5)
    vec.reset(seed=0)
    for _ in range(5):
        _, _, term, trunc, info = vec.step(np.full((4, 2), NOOP))
    assert (term | trunc).all() and info["valid"].all()
    _, rewards, term, trunc, info = vec.step(np.full((4, 2), NOOP))
    assert not info["valid"].any() and not (term | trunc).any() and not rewards.any()
    assert (vec.games.steps == 0).all() and (vec.games.hp == INIT_HP).all()


def test_bad_input_is_an_rlpipe_error() -> None:
    env = CombatEnv()
    env.reset(seed=0)
    with pytest.raises(RlpipeError, match="unknown agent"):
        env.step({"agent_7": 0})
    with pytest.raises(RlpipeError, match="outside"):
        env.step({"agent_0": 9})
    with pytest.raises(RlpipeError, match="actions must be in"):
        CombatVectorEnv(2).step(np.full((2, 2), 7))
    with pytest.raises(RlpipeError, match="16"):
        CombatEnv(team_size=10, n_opponents=10)


def test_multi_agent_env_ids_resolve() -> None:
    from rlpipe.envs.multiagent import make_parallel_env

    assert make_parallel_env("Combat-v0").possible_agents == ["agent_0", "agent_1"]
    assert make_parallel_env("simple_adversary_v3").possible_agents == ["adversary_0", "agent_0", "agent_1"]
    assert len(make_parallel_env("simple_spread_v3").possible_agents) == 3
    with pytest.raises(RlpipeError, match="unknown multi-agent environment"):
        make_parallel_env("Combat-v9")
