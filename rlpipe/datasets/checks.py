"""The checks every reader of a dataset's rows runs, written once: `load_shards`,
`MappedTransitions` and `datasets inspect` (through `ShardVerifier`) and `datasets validate`.

Per shard (its Arrow batch): the schema the spaces imply, and no nulls at any depth (a null
inside a list column would decode as NaN or turn an integer column into floats) except a
compressed next_obs's, which stand for the next row's obs, so not on an episode's last row
(`rlpipe.datasets.codec`; a frame that does not decode is reported by the loader). Per shard's
rows, in chunks of whole episodes (memory bounded by the chunk, not the shard): the row
invariant of the dataset's kind, finite floats unless the user opted in
(`RLPIPE_ALLOW_NONFINITE=1`), actions inside a Discrete, MultiDiscrete or MultiBinary space,
and for `episodes` datasets rows that chain (next_obs[t] == obs[t + 1], next_info[t] ==
info[t + 1] within an episode, per agent for multi-agent data; compared bit for bit). After
the last shard: the row and episode counts of metadata.

Box actions are not checked against the space's bounds: datasets legitimately hold actions
outside them (policies whose outputs the env clips, noise added for exploration), and the
env clips them again when such a policy is evaluated.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, cast

import gymnasium as gym
import numpy as np
import pyarrow as pa

from rlpipe.datasets.codec import frame_shape_problem, is_frame_column, unchained_null
from rlpipe.datasets.schema import INFO_COLUMNS, Columnar, map_columnar, non_finite_allowed, non_finite_problem
from rlpipe.datasets.store import DatasetInfo

CHECKS_VERSION = 1  # raise when a check is added: shards the loader remembers as checked are checked again
# Rows checked at once: the temporaries of one chunk (a few bytes per row and column) stay
# small even when a shard of another tool holds tens of millions of rows.
CHUNK_ROWS = 1 << 20


def batch_problems(batch: pa.RecordBatch, expected: pa.Schema) -> list[str]:
    """A shard's schema against the one the dataset's spaces imply, and nulls at any depth
    (phrased to follow the shard's name)."""
    if not batch.schema.equals(expected):
        return [f"does not match the dataset's schema: {schema_difference(batch.schema, expected)}"]
    nulls = [field.name for field, column in zip(batch.schema, batch.columns) if _null_count(column) and not field.nullable]
    if nulls:
        return [f"holds nulls in {', '.join(nulls)}"]
    following = batch.column("next_obs")
    if is_frame_column(following):
        shapes = (frame_shape_problem(batch.schema.field(name), expected.field(name)) for name in ("obs", "next_obs"))
        wrong = next((problem for problem in shapes if problem is not None), None)
        if wrong is not None:
            return [wrong]
    row = unchained_null(following, batch.column("episode_id").to_numpy()) if is_frame_column(following) else None
    return [] if row is None else [f"has a null next_obs at row {row}, the last row of its episode (null stands for the next row's obs)"]


def schema_difference(schema: pa.Schema, expected: pa.Schema) -> str:
    """The first column where `schema` differs from `expected`, in words."""
    try:
        actual = {field.name: field for field in schema}
        wrong = next((f for f in expected if not f.equals(actual.get(f.name, pa.field(f.name, pa.null())))), None)
    except Exception:
        return "unreadable schema"
    if wrong is None:
        return f"extra columns {sorted(set(actual) - set(expected.names))}"
    found = actual.get(wrong.name)
    if found is None:
        return f"column {wrong.name!r} is missing"
    return f"column {wrong.name!r} is {found.type}{' (nullable)' if found.nullable else ''}, the dataset's spaces need {wrong.type}"


def _null_count(column: pa.Array) -> int:
    """Nulls in `column` and in its children (struct fields, list values)."""
    nulls = column.null_count
    if pa.types.is_struct(column.type):
        nulls += sum(_null_count(child) for child in column.flatten())
    elif pa.types.is_fixed_size_list(column.type):
        nulls += _null_count(column.flatten())
    return nulls


class RowChecks:
    """The row checks of one dataset, fed its shards in order (module doc).

    `shard(columns)` returns the problems found in one shard's rows, `totals()` those of the
    counts once every shard was fed. Each kind of problem is reported once (its first row),
    so a message stays one line however many rows are wrong.
    """

    def __init__(self, info: DatasetInfo, chunk_rows: int = CHUNK_ROWS) -> None:
        self.metadata = info.metadata
        self.kind = info.metadata.get("kind", "episodes")
        self.multi_agent = bool(info.metadata.get("multi_agent", False))
        self.action_space = info.action_space
        self.expected_rows = info.metadata["total_steps"]
        self.expected_episodes = info.metadata["total_episodes"]
        self.chunk_rows = chunk_rows
        self.rows = self.episodes = 0
        self.last_episode = -1
        self._reported: set[str] = set()

    @property
    def fingerprint(self) -> str:
        """What the per-shard checks depend on besides the shard's bytes (a shard that passed
        them need not be checked again while this and its sha256 are unchanged)."""
        meta = self.metadata
        facts = [
            CHECKS_VERSION,
            self.kind,
            self.multi_agent,
            meta["observation_space"],
            meta["action_space"],
            meta.get("info_space"),
            non_finite_allowed(),
        ] + ([meta["frame_codec"]] if "frame_codec" in meta else [])  # unchanged for datasets without it
        return hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:16]

    def shard(self, columns: dict[str, Columnar], checked: bool = False) -> list[str]:
        """Check one shard's columns (as `loader.read_shard` returns them). `checked`: the
        shard passed these checks before (with this `fingerprint`), so only what depends on
        the shards before it is checked: where its episode ids start, and the counts."""
        episode_id = cast(np.ndarray, columns["episode_id"])  # scalar columns are plain arrays
        if checked:
            return self._counted(episode_id, self._start_problems(episode_id))
        problems = []
        for first, last in _chunk_bounds(episode_id, self.chunk_rows):
            chunk = {key: map_columnar(value, lambda a: a[first:last]) for key, value in columns.items()}
            problems += self._chunk(chunk)
        return problems

    def totals(self) -> list[str]:
        """The shards' row and episode counts against metadata's."""
        problems = []
        if self.rows != self.expected_rows:
            problems.append(f"shards hold {self.rows} rows, metadata says {self.expected_rows}")
        if self.episodes != self.expected_episodes:
            problems.append(f"shards hold {self.episodes} episodes, metadata says {self.expected_episodes}")
        return problems

    def _chunk(self, rows: dict[str, Columnar]) -> list[str]:
        flags = {name: cast(np.ndarray, rows[name]) for name in ("episode_id", "step", "terminated", "truncated")}  # scalar columns
        found: dict[str, list[str] | list[str | None]]
        if self.multi_agent:
            found = {"rows": multi_agent_row_problems(self.last_episode, agent=cast(np.ndarray, rows["agent"]), **flags)}
        else:
            found = {"rows": row_order_problems(self.kind, self.last_episode, **flags)}
        found["finite"] = [non_finite_problem(rows, self.rows)]
        found["action"] = [action_problem(rows["action"], self.action_space, self.rows)]
        if self.kind == "episodes":
            found["chain"] = [self._chain_problem(rows, *pair) for pair in (("obs", "next_obs"), INFO_COLUMNS) if pair[0] in rows]
        problems = []
        for check, messages in found.items():
            messages = [message for message in messages if message]
            if messages and check not in self._reported:
                self._reported.add(check)
                problems += messages[:1] if check != "rows" else messages
        return self._counted(cast(np.ndarray, rows["episode_id"]), problems)

    def _start_problems(self, episode_id: np.ndarray) -> list[str]:
        """Whether a shard's first episode id follows the rows before it."""
        if len(episode_id) == 0 or "rows" in self._reported:
            return []
        if episode_id[0] < self.last_episode:
            problem = "rows are not sorted by episode_id"
        elif self.kind == "episodes" and episode_id[0] != self.last_episode + 1:
            problem = (
                f"episode ids do not run {self.last_episode + 1}, {self.last_episode + 2}, ... without gaps (an episode split or missing)"
            )
        else:
            return []
        self._reported.add("rows")
        return [problem]

    def _counted(self, ids: np.ndarray, problems: list[str]) -> list[str]:
        """Add rows `ids` to the counts; returns `problems`."""
        if len(ids):
            self.episodes += int(ids[0] != self.last_episode or self.rows == 0) + int(np.count_nonzero(ids[1:] != ids[:-1]))
            self.rows += len(ids)
            self.last_episode = int(ids[-1])
        return problems

    def _chain_problem(self, rows: dict[str, Columnar], current: str, following: str) -> str | None:
        """Where `following` at row t is not `current` at row t + 1 inside an episode (per agent)."""
        ids = cast(np.ndarray, rows["episode_id"])  # scalar columns are plain arrays
        groups: list[slice | np.ndarray] = [slice(None)]  # single-agent rows follow each other; a multi-agent episode's, per agent:
        if self.multi_agent:
            groups = [np.flatnonzero(rows["agent"] == name) for name in np.unique(cast(np.ndarray, rows["agent"]))]
        row: np.ndarray | int
        breaks = []
        for at in groups:
            same = ids[at][1:] == ids[at][:-1]
            now, after = (map_columnar(rows[name], lambda a: a[at]) for name in (current, following))
            bad = np.flatnonzero(same & _rows_differ(map_columnar(after, lambda a: a[:-1]), map_columnar(now, lambda a: a[1:])))
            if len(bad):
                row = np.arange(len(ids))[at][bad[0] : bad[0] + 2]
                breaks.append((int(row[0]), int(row[1])))
        if not breaks:
            return None
        row, later = min(breaks)
        return (
            f"{following} at row {self.rows + row} differs from {current} at row {self.rows + later} in episode {int(ids[row])} "
            "(an episodes dataset's rows chain; rows that do not are kind 'transitions')"
        )


def _rows_differ(a: Columnar, b: Columnar) -> np.ndarray:
    """Per row, whether `a` and `b` differ in any bit (NaN equals NaN, -0.0 differs from 0.0)."""
    if isinstance(a, dict):
        return np.logical_or.reduce([_rows_differ(a[key], b[key]) for key in a] or [np.zeros(0, bool)])
    row_bytes = a.dtype.itemsize * int(np.prod(a.shape[1:], dtype=np.int64))
    word = next(size for size in (8, 4, 2, 1) if row_bytes % size == 0)  # compare rows as few wide words
    words = [np.ascontiguousarray(x).reshape(len(x), -1).view(np.dtype(f"u{word}")) for x in (a, b)]
    differ = words[0] != words[1]
    if differ.shape[1] > 8:  # wide rows: one reduction per row is fast
        return differ.any(axis=1)
    return np.logical_or.reduce([differ[:, column] for column in range(differ.shape[1])] or [np.zeros(len(a), bool)])


def action_problem(action: Columnar, space: gym.Space, first_row: int = 0) -> str | None:
    """The first action outside a Discrete, MultiDiscrete or MultiBinary `space` (Dict spaces
    leaf by leaf; Box bounds are not checked, see the module doc)."""
    if isinstance(space, gym.spaces.Dict):
        return next(filter(None, (action_problem(action[key], sub, first_row) for key, sub in space.spaces.items())), None)
    low: np.integer[Any] | np.ndarray
    high: np.integer[Any] | np.ndarray
    if isinstance(space, gym.spaces.Discrete):
        low, high = np.int64(space.start), np.int64(space.start + space.n - 1)
    elif isinstance(space, gym.spaces.MultiDiscrete):
        low, high = space.start.astype(np.int64), (space.start + space.nvec - 1).astype(np.int64)
    elif isinstance(space, gym.spaces.MultiBinary):
        low, high = np.int8(0), np.int8(1)
    else:
        return None
    action = cast(np.ndarray, action)  # a non-Dict space's column is one array
    if len(action) == 0 or (np.all(action.min(axis=0) >= low) and np.all(action.max(axis=0) <= high)):
        return None
    row = int(np.flatnonzero(((action < low) | (action > high)).reshape(len(action), -1).any(axis=1))[0])
    return f"action {action[row].tolist()} outside {space} at row {first_row + row}"


def _chunk_bounds(episode_id: np.ndarray, size: int) -> list[tuple[int, int]]:
    """(first, last) row ranges of about `size` rows that cut only where episode_id changes
    (sorted rows: where an episode ends)."""
    bounds, count = [0], len(episode_id)
    while bounds[-1] < count:
        cut = bounds[-1] + size
        if cut >= count:
            bounds.append(count)
        else:  # the end of the episode at `cut`; unsorted ids (a problem reported anyway) may cut anywhere after it
            bounds.append(max(cut, int(np.searchsorted(episode_id, episode_id[cut - 1], side="right"))))
    return list(zip(bounds[:-1], bounds[1:]))


def row_order_problems(
    kind: str, last_episode: int, episode_id: np.ndarray, step: np.ndarray, terminated: np.ndarray, truncated: np.ndarray
) -> list[str]:
    """Where rows of whole episodes break their kind's invariant (`last_episode`: the episode
    id before these rows, -1 at the start).

    Both kinds: rows sorted by episode_id. "episodes" also: ids last_episode+1, +2, ... with
    no gaps and no episode split across shards, `step` 0..length-1 within each episode, and
    `terminated` or `truncated` (or both) on each episode's last row and on no other row.
    """
    if len(episode_id) == 0:
        return []
    problems = []
    new = episode_id[1:] != episode_id[:-1]  # row i + 1 starts an episode
    if episode_id[0] < last_episode or np.any(episode_id[1:] < episode_id[:-1]):
        problems.append("rows are not sorted by episode_id")
    if kind != "episodes" or problems:
        return problems
    starts = np.flatnonzero(np.r_[True, new])
    if not np.array_equal(episode_id[starts], last_episode + 1 + np.arange(len(starts))):
        problems.append(f"episode ids do not run {last_episode + 1}, {last_episode + 2}, ... without gaps (an episode split or missing)")
    if np.any(step[starts] != 0) or not np.all((np.diff(step) == 1) | new):
        problems.append("step does not count 0, 1, ... within every episode")
    done = terminated | truncated
    last = np.r_[new, True]
    if not np.array_equal(done, last):
        if np.any(done & ~last):
            row = int(np.flatnonzero(done & ~last)[0])
            problems.append(f"episode {int(episode_id[row])} is terminated or truncated before its last row (step {int(step[row])})")
        if np.any(last & ~done):
            row = int(np.flatnonzero(last & ~done)[0])
            problems.append(f"episode {int(episode_id[row])} ends with neither terminated nor truncated")
    return problems


def multi_agent_row_problems(
    last_episode: int, episode_id: np.ndarray, step: np.ndarray, agent: np.ndarray, terminated: np.ndarray, truncated: np.ndarray
) -> list[str]:
    """Where rows of whole multi-agent episodes (one row per living agent per step, rows of an
    episode sorted by (step, agent), the game's terminated/truncated on every row) break
    their invariant: episode ids as for single-agent episodes, each agent's steps 0, 1, ...
    until it dies or the game ends, and done flags on exactly the rows of the last step."""
    if len(episode_id) == 0:
        return []
    if episode_id[0] < last_episode or np.any(np.diff(episode_id) < 0):
        return ["rows are not sorted by episode_id"]
    problems = []
    starts = np.flatnonzero(np.r_[True, episode_id[1:] != episode_id[:-1]])
    if not np.array_equal(episode_id[starts], last_episode + 1 + np.arange(len(starts))):
        problems.append(f"episode ids do not run {last_episode + 1}, {last_episode + 2}, ... without gaps (an episode split or missing)")
    same_episode = episode_id[1:] == episode_id[:-1]
    if np.any(same_episode & (np.diff(step) < 0)):
        problems.append("rows of an episode are not sorted by step")
    for name in np.unique(agent):  # a handful of agents: one vectorised check each
        mine = agent == name
        ids, steps = episode_id[mine], step[mine]
        first = np.r_[True, ids[1:] != ids[:-1]]
        if np.any(steps[first] != 0) or np.any(~first[1:] & (np.diff(steps) != 1)):
            problems.append(f"agent {name}'s steps do not count 0, 1, ... within every episode")
    lengths = np.diff(np.r_[starts, len(episode_id)])
    last_step = np.repeat(step[np.r_[starts[1:], len(step)] - 1], lengths)
    done = terminated | truncated
    if np.any(done != (step == last_step)):
        problems.append("terminated/truncated are not set on exactly the rows of each episode's last step")
    return problems
