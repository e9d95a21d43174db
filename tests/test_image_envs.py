"""The image env families (MinAtar, Atari with rlpipe's preprocessing) and the partially
observed classic-control envs: their ids resolve, step and vectorize, a missing package is one
line naming the extra, importing them prints nothing, and their specs reopen from a dataset."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from rlpipe.datasets.writer import write_rows
from rlpipe.envs import env_id_for_spec, env_slug, env_spaces, env_spec_json, make_env, make_vec_env, recorded_env_id
from rlpipe.envs.extras import extra_for
from rlpipe.errors import RlpipeError
from rlpipe.training.offline import dataset_env_id
from tests.test_dataset_store import synthetic_rows

MINATAR_CHANNELS = {"Asterix": 4, "Breakout": 4, "Freeway": 7, "Seaquest": 10, "SpaceInvaders": 6}
ATARI = "rlpipe/Breakout-atari-v5"
MASKED = {"rlpipe/CartPoleNoVel-v1": ("CartPole-v1", [0, 2]), "rlpipe/PendulumNoVel-v1": ("Pendulum-v1", [0, 1])}


@pytest.fixture(autouse=True)
def registry_restored() -> Iterator[None]:
    """The ids a test registers for recorded specs are removed after it (the families' own stay:
    ale_py registers its ids once, when imported)."""
    before = set(gym.registry)
    yield
    for env_id in set(gym.registry) - before:
        if env_id.startswith("dataset-"):
            del gym.registry[env_id]


@pytest.fixture
def minatar() -> None:
    pytest.importorskip("minatar", reason="the minatar extra is not installed")


@pytest.fixture
def atari() -> None:
    pytest.importorskip("ale_py", reason="the atari extra (ale-py) is not installed")
    pytest.importorskip("cv2", reason="the atari extra (opencv-python-headless) is not installed")


def test_extras_are_named_by_id() -> None:
    assert extra_for("MinAtar/Breakout-v1") == "minatar"
    assert extra_for("ALE/Pong-v5") == extra_for("rlpipe/Pong-atari-v5") == "atari"
    assert extra_for("rlpipe/CartPoleNoVel-v1") is None


def test_default_names_tell_minatar_from_atari() -> None:
    """Run and dataset names default to the env's slug: MinAtar's Breakout and Atari's differ."""
    assert env_slug("MinAtar/Breakout-v1") == "minatar-breakout"
    assert env_slug("rlpipe/Breakout-atari-v5") == "breakout-atari"
    assert env_slug("CartPole-v1") == "cartpole"


@pytest.mark.parametrize(("game", "channels"), MINATAR_CHANNELS.items())
def test_minatar_ids_resolve_to_bool_images(minatar: None, game: str, channels: int) -> None:
    obs_space, act_space = env_spaces(f"MinAtar/{game}-v1")
    assert obs_space.shape == (10, 10, channels) and obs_space.dtype == np.bool_
    assert isinstance(act_space, gym.spaces.Discrete)


def test_minatar_episode_ends_under_random_play(minatar: None) -> None:
    """MinAtar has no time limit (as in its paper): Breakout's episode ends when the ball is lost."""
    env = make_env("MinAtar/Breakout-v1")
    obs, _ = env.reset(seed=0)
    rng = np.random.default_rng(0)
    for step in range(1000):  # noqa: B007  (the episode's length is checked after the loop)
        obs, _, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
        if terminated or truncated:
            break
    assert terminated and step < 1000 and obs.shape == (10, 10, 4)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_minatar_vector_envs(minatar: None, mode: str) -> None:
    envs = make_vec_env("MinAtar/Breakout-v1", 2, vectorization_mode=mode)
    try:
        obs, _ = envs.reset(seed=0)
        obs, reward, *_ = envs.step(np.zeros(2, dtype=np.int64))
        assert obs.shape == (2, 10, 10, 4) and obs.dtype == np.bool_ and reward.shape == (2,)
    finally:
        envs.close()


def test_minatar_import_is_quiet_without_seaborn(minatar: None) -> None:
    """minatar logs a warning when seaborn is missing; rlpipe's registration hides it (control:
    importing minatar itself prints it)."""
    hide_seaborn = "import sys; sys.modules['seaborn'] = None; "
    quiet = f"{hide_seaborn}from rlpipe.envs import make_env; make_env('MinAtar/Breakout-v1').reset(seed=0)"
    loud = f"{hide_seaborn}import minatar.gym"
    assert _stderr(quiet) == ""
    assert "seaborn" in _stderr(loud)


def test_atari_preprocessed_frames(atari: None) -> None:
    """rlpipe/Breakout-atari-v5: 84x84 grayscale uint8 frames with a channel axis, 4 frames a step."""
    env = make_env(ATARI)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (84, 84, 1) and obs.dtype == np.uint8
    obs, *_ = env.step(1)
    assert env.observation_space.contains(obs) and env.unwrapped.ale.getEpisodeFrameNumber() > 4
    assert env.spec is not None and env.spec.kwargs["frame_skip"] == 4 and env.spec.kwargs["noop_max"] == 30
    quiet = f"from rlpipe.envs import make_env; make_env('{ATARI}').reset(seed=0)"
    assert _stderr(quiet) == ""  # no ALE banner


def test_atari_vector_env(atari: None) -> None:
    envs = make_vec_env(ATARI, 2)
    try:
        obs, _ = envs.reset(seed=0)
        obs, *_ = envs.step(np.ones(2, dtype=np.int64))
        assert obs.shape == (2, 84, 84, 1) and obs.dtype == np.uint8
    finally:
        envs.close()


def test_atari_spec_records_its_preprocessing(atari: None) -> None:
    """A recorded spec with other preprocessing settings rebuilds those, not today's."""
    spec = json.loads(str(env_spec_json(ATARI)))
    assert env_id_for_spec(json.dumps(spec)) == ATARI
    recorded = env_id_for_spec(json.dumps({**spec, "kwargs": {**spec["kwargs"], "screen_size": 42}}))
    assert recorded.startswith("dataset-") and recorded.endswith("-rlpipe/Breakout-atari-v5")
    assert make_env(recorded).observation_space.shape == (42, 42, 1)


def _noop_lives(env: gym.Env, steps: int) -> tuple[int, bool]:
    """Lives left and whether the game ended after `steps` NOOPs from a seeded reset."""
    _, info = env.reset(seed=0)
    for _ in range(steps):
        _, _, terminated, truncated, info = env.step(0)
        if terminated or truncated:
            return info["lives"], terminated
    return info["lives"], False


def test_atari_fire_reset_serves_after_reset_and_each_lost_life(atari: None) -> None:
    """Breakout waits for FIRE to serve: under rlpipe's id a player that only ever picks NOOP
    loses its five lives and the game ends; built from a spec recorded without `fire_reset`
    (as every spec was before it), the same player never sees a ball."""
    assert _noop_lives(make_env(ATARI), 1000) == (0, True)
    spec = json.loads(str(env_spec_json(ATARI)))
    assert spec["kwargs"].pop("fire_reset") is True
    assert _noop_lives(make_env(env_id_for_spec(json.dumps(spec))), 1000) == (5, False)


class _ServeEndsGame(gym.Env):
    """A stand-in game whose first FIRE after each reset ends it: observations count the resets."""

    observation_space = gym.spaces.Discrete(10)
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        self.resets = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[int, dict]:
        self.resets += 1
        return self.resets, {"lives": 1}

    def step(self, action: int) -> tuple[int, float, bool, bool, dict]:
        return self.resets, 0.0, action == 1 and self.resets == 1, False, {"lives": 0}


def test_fire_reset_starts_again_when_the_serve_ends_the_game() -> None:
    """A serve that ends the game is followed by a fresh reset, whose observation is returned."""
    from rlpipe.envs.atari import FireReset

    env = FireReset(_ServeEndsGame(), fire=1)
    assert env.reset(seed=0) == (2, {"lives": 1}) and env.unwrapped.resets == 2


@pytest.mark.parametrize(("package", "env_id", "extra"), [("minatar", "MinAtar/Breakout-v1", "minatar"), ("ale_py", ATARI, "atari")])
def test_missing_package_is_one_line(monkeypatch: pytest.MonkeyPatch, package: str, env_id: str, extra: str) -> None:
    for registered in [key for key in gym.registry if extra_for(key) == extra]:
        monkeypatch.delitem(gym.registry, registered)
    for module in [name for name in sys.modules if name.split(".")[0] == package] + [package]:
        monkeypatch.setitem(sys.modules, module, None)  # importing it raises ImportError
    with pytest.raises(RlpipeError) as raised:
        make_env(env_id)
    assert str(raised.value) == f"environment {env_id!r} needs the {extra} extra: pip install -c constraints.txt -e '.[{extra}]'"


def test_missing_opencv_is_one_line(atari: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """AtariPreprocessing resizes with OpenCV, which the atari extra brings too."""
    monkeypatch.setitem(sys.modules, "cv2", None)
    with pytest.raises(RlpipeError, match=r"^environment 'rlpipe/Breakout-atari-v5' needs the atari extra: pip install "):
        make_env(ATARI)


@pytest.mark.parametrize("env_id", MASKED)
def test_masked_envs_hide_the_velocities(env_id: str) -> None:
    """On the same seed and actions, the masked env observes the full env's observation without
    its velocity terms, for a whole episode, time limit included."""
    full_id, kept = MASKED[env_id]
    masked, full = make_env(env_id), make_env(full_id)
    assert masked.observation_space.shape == (2,) and masked.spec is not None and full.spec is not None
    assert masked.spec.max_episode_steps == full.spec.max_episode_steps
    obs, _ = masked.reset(seed=3)
    full_obs, _ = full.reset(seed=3)
    masked.action_space.seed(3)
    done = False
    while not done:
        assert np.array_equal(obs, full_obs[kept]) and masked.observation_space.contains(obs)
        action = masked.action_space.sample()
        obs, reward, terminated, truncated, _ = masked.step(action)
        full_obs, full_reward, *ends, _ = full.step(action)
        assert reward == full_reward and [terminated, truncated] == ends
        done = terminated or truncated


@pytest.mark.parametrize("env_id", MASKED)
def test_masked_envs_vectorize(env_id: str) -> None:
    envs = make_vec_env(env_id, 3)
    try:
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (3, 2) and env_spaces(env_id)[0].shape == (2,)
    finally:
        envs.close()


def test_masked_env_dataset_reopens_with_its_spec(tmp_path: Path) -> None:
    """A dataset collected in rlpipe/CartPoleNoVel-v1 reopens in it; a recorded spec that differs
    (another time limit) keeps the id's namespace, so it still names the same env."""
    obs_space, act_space = env_spaces("rlpipe/CartPoleNoVel-v1")
    rows = [synthetic_rows([10] * 3, obs_space, act_space)]
    write_rows(
        "nov", rows, obs_space, act_space, env_id="rlpipe/CartPoleNoVel-v1", producer={"algorithm": "test"}, store=tmp_path, fmt="arrow"
    )
    assert dataset_env_id("nov", tmp_path) == "rlpipe/CartPoleNoVel-v1"
    spec = json.loads(str(env_spec_json("rlpipe/CartPoleNoVel-v1")))
    shorter = recorded_env_id("rlpipe/CartPoleNoVel-v1", json.dumps({**spec, "max_episode_steps": 50}), "dataset 'nov'")
    assert shorter.endswith("-rlpipe/CartPoleNoVel-v1")
    env = make_env(shorter)
    assert env.spec is not None and env.spec.max_episode_steps == 50 and env.observation_space.shape == (2,)


def _stderr(code: str) -> str:
    """What a fresh Python process running `code` prints on stderr."""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return result.stderr
