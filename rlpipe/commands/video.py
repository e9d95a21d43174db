"""Videos of a policy: episodes rendered with ``render_mode="rgb_array"``, written as a GIF
(pillow) or an MP4 (an ffmpeg binary: imageio-ffmpeg's, ``pip install 'rlpipe[video]'``,
or one on PATH). Frames stream from the env to the file, so long videos need no memory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any, cast

import gymnasium as gym
import numpy as np

from rlpipe.errors import RlpipeError
from rlpipe.storage.files import atomic_output, check_output_file
from rlpipe.training.evaluation import EpisodicPolicy, PolicyFn, RewardConditionedPolicy

# Gymnasium's renderers draw with pygame off-screen: no import banner on stdout, no display
# or sound device to look for (headless machines print errors otherwise).
for _name, _value in (("PYGAME_HIDE_SUPPORT_PROMPT", "1"), ("SDL_VIDEODRIVER", "dummy"), ("SDL_AUDIODRIVER", "dummy")):
    os.environ.setdefault(_name, _value)
FORMATS = (".gif", ".mp4")


def check_video_path(path: Path) -> None:
    """Refuse, before any episode runs, a suffix we cannot write, a place no file can be
    written (:func:`rlpipe.storage.files.check_output_file`: a missing folder too) or an MP4 without ffmpeg."""
    if path.suffix.lower() not in FORMATS:
        raise RlpipeError(f"cannot write video {path}: use a .gif or .mp4 file name")
    # No missing folders made: a mistyped folder is refused, as --onnx's is (no pipeline stage
    # needs it made, unlike collect --metrics, which DVC stages point into absent folders).
    check_output_file(path, "--video")
    if path.suffix.lower() == ".mp4":
        ffmpeg_binary()


def ffmpeg_binary() -> str:
    """imageio-ffmpeg's bundled ffmpeg, else one on PATH; an RlpipeError naming the fix."""
    try:
        import imageio_ffmpeg

        return imageio_ffmpeg.get_ffmpeg_exe()
    except (ImportError, RuntimeError):
        found = shutil.which("ffmpeg")
    if found is None:
        raise RlpipeError(
            "writing .mp4 needs ffmpeg: pip install 'rlpipe[video]' (imageio-ffmpeg), or install ffmpeg on PATH, or write a .gif instead"
        )
    return found


def _batch_of_one(obs: object) -> Any:  # an array, or a dict of them for Dict observations (policies take both)
    return {key: value[None] for key, value in obs.items()} if isinstance(obs, dict) else np.asarray(obs)[None]


def render_env(env_id: str) -> gym.Env:
    """``env_id`` made with ``render_mode="rgb_array"``; a missing renderer is an RlpipeError."""
    try:
        return gym.make(env_id, render_mode="rgb_array")
    except gym.error.DependencyNotInstalled as exc:
        raise RlpipeError(f"rendering {env_id} needs an extra dependency: {exc}") from None


def rendered_episodes(policy: PolicyFn, env: gym.Env, episodes: int, seed: int, returns: list[float]) -> Generator[np.ndarray, None, None]:
    """RGB frames of ``episodes`` episodes in ``env`` (episode i reset with ``seed + i``);
    each finished episode's return is appended to ``returns``."""
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        if isinstance(policy, EpisodicPolicy):  # no frame stack or planner state carries over
            policy.start_episodes(np.ones(1, bool))
        frame = env.render()
        if frame is None:
            raise RlpipeError(f"{env.spec.id if env.spec else env} cannot render rgb_array frames")
        yield video_frame(cast(np.ndarray, frame))  # render_mode="rgb_array" renders one array
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(policy(_batch_of_one(obs))[0])
            if isinstance(policy, RewardConditionedPolicy):
                policy.record_rewards(np.array([reward], np.float64))
            total += float(reward)
            done = terminated or truncated
            yield video_frame(cast(np.ndarray, env.render()))
        returns.append(total)


MIN_VIDEO_SIZE = 160  # pixels: smaller renders (MinAtar's 10 x 10 boards) are enlarged to at least this


def video_frame(frame: np.ndarray) -> np.ndarray:
    """An rgb_array render as 8-bit RGB of at least MIN_VIDEO_SIZE pixels a side: float renders
    in [0, 1] (MinAtar's) become bytes, small ones are enlarged by whole pixels (no blur)."""
    if frame.dtype != np.uint8:
        frame = (np.clip(frame, 0.0, 1.0) * 255).round().astype(np.uint8)
    scale = -(-MIN_VIDEO_SIZE // min(frame.shape[:2]))
    return frame.repeat(scale, 0).repeat(scale, 1) if scale > 1 else frame


def _write_gif(frames: Iterator[np.ndarray], path: Path, fps: float) -> None:
    from PIL import Image

    images = (Image.fromarray(frame) for frame in frames)
    first = next(images)
    first.save(path, format="GIF", save_all=True, append_images=images, duration=round(1000 / fps), loop=0)


def _write_mp4(frames: Iterator[np.ndarray], path: Path, fps: float) -> None:
    first = next(frames)
    height, width = first.shape[:2]
    command = [
        ffmpeg_binary(),
        "-y",
        "-loglevel",
        "error",
        "-f",
        "rawvideo",
        "-pix_fmt",
        "rgb24",
        "-s",
        f"{width}x{height}",
        "-r",
        str(fps),
        "-i",
        "-",
        "-vf",
        "pad=ceil(iw/2)*2:ceil(ih/2)*2",  # H.264 wants even sizes
        "-c:v",
        "libx264",
        "-pix_fmt",
        "yuv420p",
        str(path),
    ]
    with subprocess.Popen(command, stdin=subprocess.PIPE, stderr=subprocess.PIPE) as encoder:
        assert encoder.stdin is not None and encoder.stderr is not None  # both are pipes
        try:
            encoder.stdin.write(first.tobytes())
            for frame in frames:
                encoder.stdin.write(frame.tobytes())
        except BrokenPipeError:
            pass  # the encoder died; its stderr says why
        finally:
            encoder.stdin.close()
        error = encoder.stderr.read().decode(errors="replace").strip()
    if encoder.returncode != 0:
        raise RlpipeError(f"ffmpeg failed to write {path}: {error.splitlines()[-1] if error else encoder.returncode}")


def record_video(policy: PolicyFn, env_id: str, path: str | Path, episodes: int = 1, seed: int = 0) -> list[float]:
    """Run ``episodes`` episodes of ``policy`` in ``env_id`` and write their frames to
    ``path`` (.gif or .mp4) at the env's ``render_fps``; returns the episode returns.
    The file appears only when complete (:func:`rlpipe.storage.files.atomic_output`)."""
    path = Path(path)
    check_video_path(path)
    env = render_env(env_id)
    fps = float(env.metadata.get("render_fps") or 30)
    returns: list[float] = []
    frames = rendered_episodes(policy, env, episodes, seed, returns)
    try:
        with atomic_output(path) as partial:
            (_write_gif if path.suffix.lower() == ".gif" else _write_mp4)(frames, partial, fps)
    finally:
        frames.close()
        env.close()
    return returns
