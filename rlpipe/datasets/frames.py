"""Frame stacks gathered at sampling time: datasets store one frame per step, and a policy
that reads the last k frames gets them by index arithmetic over the stored rows.

A row's stack is the rows t-k+1..t of its chain (consecutive steps of one episode); rows
before the chain's first are that first row again, as gymnasium's
``FrameStackObservation(env, k, padding_type="reset")`` pads after a reset. Each row's depth
(how many earlier rows of its chain a stack may reach, at most k-1) is one uint8, so the
offsets cost a byte per row whatever k. Windows of consecutive steps (`rlpipe.training.windows`)
are stacks of every column, with the returns-to-go of `returns_to_go`. Torch-free; the samplers
of `rlpipe.training.sampler` use it.
"""

from __future__ import annotations

import numpy as np

from rlpipe.errors import RlpipeError

MAX_FRAME_STACK = 255  # depths are uint8


def check_frame_stack(frame_stack: int) -> None:
    """Raise unless ``frame_stack`` is a stack depth the samplers support (1..MAX_FRAME_STACK)."""
    if not 1 <= frame_stack <= MAX_FRAME_STACK:
        raise RlpipeError(f"frame_stack must be from 1 to {MAX_FRAME_STACK}, got {frame_stack}")


def chain_starts(episode_id: np.ndarray, step: np.ndarray, previous: tuple[int, int] | None = None) -> np.ndarray:
    """Whether each row starts a chain: its episode differs from the row before, or its step
    does not follow that row's (a subset's gap). ``previous``: the (episode_id, step) of the
    row before the first (a preceding shard's last), else the first row starts one."""
    episode_id, step = np.asarray(episode_id), np.asarray(step, np.int64)
    starts = np.empty(len(episode_id), bool)
    starts[1:] = (episode_id[1:] != episode_id[:-1]) | (step[1:] != step[:-1] + 1)
    if len(starts):
        starts[0] = previous is None or (int(episode_id[0]), int(step[0])) != (previous[0], previous[1] + 1)
    return starts


def stack_depths(starts: np.ndarray, frame_stack: int) -> np.ndarray:
    """Per row, ``min(rows since its chain's start, frame_stack - 1)`` as uint8."""
    check_frame_stack(frame_stack)
    rows = np.arange(len(starts))
    first = np.maximum.accumulate(np.where(starts, rows, 0))
    return np.minimum(rows - first, frame_stack - 1).astype(np.uint8)


def stack_offsets(frame_stack: int) -> np.ndarray:
    """How far back each frame of a stack lies before its last, oldest first: k-1, ..., 0."""
    return np.arange(frame_stack - 1, -1, -1)


def stack_rows(rows: np.ndarray, depths: np.ndarray, frame_stack: int) -> np.ndarray:
    """The stored rows of the stacks ending at ``rows``: ``[*rows.shape, frame_stack]``, oldest first."""
    rows = np.asarray(rows, np.int64)
    return rows[..., None] - np.minimum(stack_offsets(frame_stack), depths[rows][..., None])


def stacked(column: np.ndarray, rows: np.ndarray, depths: np.ndarray, frame_stack: int) -> np.ndarray:
    """``column``'s stacks ending at ``rows``: ``[len(rows), frame_stack, *frame]``."""
    return np.asarray(column)[stack_rows(rows, depths, frame_stack)]


def stacked_next(column: np.ndarray, next_column: np.ndarray, rows: np.ndarray, depths: np.ndarray, frame_stack: int) -> np.ndarray:
    """The stacks after the transitions at ``rows``: the obs stack's last k-1 frames, then next_obs."""
    frames = stacked(column, rows, depths, frame_stack)
    return np.concatenate([frames[:, 1:], np.asarray(next_column)[rows][:, None]], axis=1)


def returns_to_go(reward: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Per row, the undiscounted sum of its chain's rewards from that row on (float32; summed
    in float64). A chain is an episode's consecutive rows, so a subset's gap ends one."""
    reward = np.asarray(reward, np.float64).reshape(len(starts))
    if not len(reward):
        return np.zeros(0, np.float32)
    first = np.flatnonzero(starts)
    totals = np.add.reduceat(reward, first)  # each chain's sum
    before = np.cumsum(reward) - reward  # the rows before each row, of every chain
    chain = np.cumsum(starts) - 1
    return (totals[chain] - (before - before[first][chain])).astype(np.float32)
