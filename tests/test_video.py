"""`rlpipe eval RUN --video`: episodes rendered with render_mode="rgb_array" to a GIF or MP4,
and GoalWorld's numpy renderer."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from PIL import Image, ImageSequence

import rlpipe.envs  # noqa: F401  (registers GoalWorld-v0)
from rlpipe.commands.video import ffmpeg_binary, video_frame
from rlpipe.envs.goalworld import COLOURS, GoalWorldEnv
from rlpipe.errors import RlpipeError
from tests.test_report import assert_not_blank


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Barely trained runs (short episodes keep the videos small): PPO on CartPole,
    DDPG+HER on GoalWorld."""
    from rlpipe.algos import get_algo

    root = tmp_path_factory.mktemp("video-runs")
    ppo, her = get_algo("ppo"), get_algo("ddpg-her")
    ppo.train(ppo.make_config("CartPole-v1", env_steps=128, eval_episodes=1), root / "ppo", progress=False)
    config = her.make_config("GoalWorld-v0", env_steps=200, learning_starts=100, eval_every=200, eval_episodes=1)
    her.train(config, root / "her", progress=False)
    return {"CartPole-v1": root / "ppo", "GoalWorld-v0": root / "her"}


def test_goalworld_draws_plane_goal_and_agent() -> None:
    env = gym.make("GoalWorld-v0", render_mode="rgb_array")
    env.reset(seed=0)
    first = env.render()
    env.step(np.array([1.0, 1.0], np.float32))
    second = env.render()
    env.close()
    assert first.shape == (256, 256, 3) and first.dtype == np.uint8
    colours = {tuple(c) for c in np.unique(first.reshape(-1, 3), axis=0)}
    assert {COLOURS["plane"], COLOURS["goal_region"], COLOURS["goal"], COLOURS["agent"]} <= colours
    # The agent moved from (0, 0) to (1, 1): its disc is now around pixel (row 204, col 51).
    assert tuple(second[204, 51]) == COLOURS["agent"] and tuple(first[204, 51]) != COLOURS["agent"]
    plain = GoalWorldEnv()
    plain.reset(seed=0)
    assert plain.render() is None  # no render mode, no frame


@pytest.mark.parametrize("env_id", ["CartPole-v1", "GoalWorld-v0"])
def test_eval_records_a_gif(cli, runs: dict[str, Path], tmp_path: Path, env_id: str) -> None:
    video = tmp_path / "out.gif"
    res = cli("eval", runs[env_id], "--episodes", "1", "--video", video, "--video-episodes", "2")
    assert res.code == 0, res.err
    assert "recorded 2 episode(s)" in res.out and video.is_file()
    assert not list(tmp_path.glob(".*partial*"))
    with Image.open(video) as gif:
        frames = [frame.convert("RGB") for frame in ImageSequence.Iterator(gif)]
    assert len(frames) > 2
    for frame in (frames[0], frames[-1]):
        frame.save(tmp_path / "frame.png")
        assert_not_blank(tmp_path / "frame.png")
    assert any(np.any(np.asarray(a) != np.asarray(b)) for a, b in zip(frames, frames[1:]))  # it moves


def test_eval_records_an_mp4_or_names_the_fix(cli, runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    video = tmp_path / "out.mp4"
    try:
        ffmpeg_binary()
    except RlpipeError:
        pass
    else:
        res = cli("eval", runs["GoalWorld-v0"], "--episodes", "1", "--video", video)
        assert res.code == 0, res.err
        assert video.stat().st_size > 1000
        video.unlink()
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # import fails
    monkeypatch.setattr(shutil, "which", lambda name: None)
    res = cli("eval", runs["GoalWorld-v0"], "--episodes", "1", "--video", video)
    assert res.code == 2 and "pip install 'rlpipe[video]'" in res.err and len(res.err.strip().splitlines()) == 1
    assert not video.exists()


def test_eval_refuses_an_unknown_video_format(cli, runs: dict[str, Path], tmp_path: Path) -> None:
    res = cli("eval", runs["CartPole-v1"], "--video", tmp_path / "out.avi")
    assert res.code == 2 and "use a .gif or .mp4" in res.err


def test_small_float_renders_become_enlarged_rgb_bytes() -> None:
    """MinAtar renders 10 x 10 float boards in [0, 1]: videos get 8-bit pixels, 16 x 16 per cell."""
    board = np.zeros((10, 10, 3))
    board[2, 3] = (1.0, 0.5, 0.0)
    frame = video_frame(board)
    assert frame.dtype == np.uint8 and frame.shape == (160, 160, 3)
    assert (frame[32:48, 48:64] == (255, 128, 0)).all() and frame[:32].max() == 0
    atari = np.full((210, 160, 3), 7, np.uint8)
    assert video_frame(atari) is atari  # big enough, bytes already: untouched
