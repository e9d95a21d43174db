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
# Per-row index arithmetic runs over blocks of rows: its int64/float64 temporaries stay ~40 MB
# whatever the dataset's size (over all 50M rows at once they peaked at ~2 GB).
BLOCK_ROWS = 1 << 20


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
    depths = np.empty(len(starts), np.uint8)
    since = -1  # rows since the chain start of the row before the block
    for first in range(0, len(starts), BLOCK_ROWS):
        rows = np.arange(min(BLOCK_ROWS, len(starts) - first))
        head = np.maximum.accumulate(np.where(starts[first : first + len(rows)], rows, -since - 1))  # a chain going on starts before
        depths[first : first + len(rows)] = np.minimum(rows - head, frame_stack - 1)
        since = int(rows[-1] - head[-1])
    return depths


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
    reward = np.asarray(reward).reshape(len(starts))
    out = np.empty(len(reward), np.float32)
    carry = 0.0  # the return-to-go of the row after the block (float64)
    for first in range((len(reward) - 1) // BLOCK_ROWS * BLOCK_ROWS, -1, -BLOCK_ROWS):
        last = min(first + BLOCK_ROWS, len(reward))
        to_end = np.r_[np.cumsum(reward[first:last][::-1], dtype=np.float64)[::-1], 0.0]  # sums to the block's end
        heads = np.flatnonzero(np.r_[True, starts[first + 1 : last]])  # the block's chains, the first maybe begun before
        ends = np.r_[heads[1:], last - first]
        block = to_end[:-1] - np.repeat(to_end[ends], ends - heads)
        if last < len(reward) and not starts[last]:  # the block's last chain goes on after it
            block[heads[-1] :] += carry
        carry = float(block[0])
        out[first:last] = block
    return out


def discounted_returns_to_go(reward: np.ndarray, starts: np.ndarray, gamma: float) -> np.ndarray:
    """Per row t, ``sum_k gamma**k * reward[t + k]`` over its chain's rows from t to the chain's
    last (float32; summed in float64). Nothing is added after a chain's last row: a truncated
    episode (or a subset's gap) just ends there, with no bootstrap.

    By pointer doubling: each pass adds to every row's partial sum that of the row its sum
    reaches, doubling the span it covers, so ceil(log2(longest chain)) passes over the arrays.
    """
    starts = np.asarray(starts, bool)
    n = len(starts)
    total = np.r_[np.asarray(reward, np.float64).reshape(n), 0.0]  # row n: past every chain's end, sums to 0
    # The row each partial sum reaches next: the next row while the chain goes on, else row n.
    reach = np.r_[np.where(np.r_[~starts[1:], False], np.arange(1, n + 1), n), n]
    discount = float(gamma)  # gamma ** (the span each partial sum covers)
    while (reach[:n] < n).any():
        total += discount * total[reach]  # the right side is read in full before the sum is written
        reach = reach[reach]
        discount *= discount
    return total[:n].astype(np.float32)
