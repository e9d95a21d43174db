"""Collecting datasets from gymnasium vector envs with any batched policy.

The hot loop does one vector-env step and a handful of array copies per step: rows go into
a staging buffer in time-major order, and completed episodes are sorted out of it in bulk
(one lexsort per flush), so there is no per-step or per-env Python bookkeeping.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

import gymnasium as gym
import numpy as np
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from rlpipe.datasets.schema import Columnar, info_value_space, map_columnar
from rlpipe.envs import make_env, make_vec_env
from rlpipe.envs.stepper import StepBatch, VecStepper
from rlpipe.errors import RlpipeError
from rlpipe.limits import MAX_ENV_STEPS

RowSink = Callable[[dict[str, Columnar]], None]


class Policy(Protocol):
    """Anything mapping a batch of observations (one row per env) to a batch of env actions."""

    def __call__(self, obs: Columnar) -> np.ndarray: ...


class RandomPolicy:
    """Uniform random actions for a batch of envs, from its own seeded generator.

    Actions are drawn `BLOCK` steps at a time (one generator call per block, not per step:
    a call costs microseconds, as much as a CartPole step), so the actions depend only on
    the seed and `num_envs`.
    """

    BLOCK = 1024

    def __init__(self, action_space: gym.Space, num_envs: int, seed: int = 0) -> None:
        self.space = action_space
        self.num_envs = num_envs
        self.rng = np.random.default_rng(seed)
        self._block = self._draw()
        self._next = 0

    def __call__(self, obs: Columnar) -> np.ndarray:
        if self._next == self.BLOCK:
            self._block, self._next = self._draw(), 0
        self._next += 1
        return self._block[self._next - 1]

    def _draw(self) -> np.ndarray:
        space, size = self.space, (self.BLOCK, self.num_envs) + tuple(self.space.shape or ())
        if isinstance(space, gym.spaces.Discrete):
            return space.start + self.rng.integers(space.n, size=size)
        if isinstance(space, gym.spaces.Box):
            low = np.where(np.isfinite(space.low), space.low, -1.0)
            high = np.where(np.isfinite(space.high), space.high, 1.0)
            return self.rng.uniform(low, high, size=size).astype(space.dtype)
        if isinstance(space, gym.spaces.MultiDiscrete):
            return space.start + (self.rng.random(size) * space.nvec).astype(np.int64)
        if isinstance(space, gym.spaces.MultiBinary):
            return self.rng.integers(2, size=size, dtype=np.int8)
        raise RlpipeError(f"random policy does not support action space {space!r}")


def split_evenly(total: int, parts: int) -> np.ndarray:
    """`total` split into `parts` shares that differ by at most one, larger shares first."""
    return total // parts + (np.arange(parts) < total % parts).astype(np.int64)


class EpisodeAssembler:
    """Turns batched env steps into rows of whole episodes, sorted by (episode_id, step).

    Which episodes are kept is decided per env, never by a race between envs: keeping the
    first N episodes to *finish* across envs over-represents short episodes (random
    CartPole, 64 envs: mean length -23%). Each env gets a fixed share of the budget and
    keeps the episodes it *starts* while its share is not yet used up:
    - `episodes=N`: env i keeps its first N/num_envs episodes (shares differ by at most
      one), like `evaluate()`; each is an unbiased draw of the episode distribution.
    - `steps=S`: env i runs whole episodes until it has S/num_envs steps, keeping the
      episode that crosses its share. Whether another episode starts depends only on the
      lengths of the episodes before it (a stopping time), so by Wald's identity the
      expected number of kept episodes of each length is proportional to that length's
      probability; dropping the crossing episode would bias towards short ones again.
    An env whose share is used up keeps running (the vector env steps all envs), but its
    rows are discarded. Episode ids are given in order of completion (ties by env index),
    so they are deterministic and increase through the output. Rows of unfinished episodes
    wait in the staging buffer; they are dropped at `close`. Without a budget every
    episode is kept.

    Args:
        num_envs: batch size of every `add_step` call.
        sink: receives each flushed block of rows (e.g. `DatasetWriter.write`).
        episodes, steps: the budget (at most one), split evenly over the envs.
        capacity: initial staging rows; doubled when unfinished episodes fill half of it.
        info_space: the info keys stored as `info`/`next_info` columns (see `resolve_env`);
            `obs_info` must then hold the columns that came with the first observations.
    """

    def __init__(
        self,
        num_envs: int,
        sink: RowSink,
        episodes: int | None = None,
        steps: int | None = None,
        capacity: int = 1 << 16,
        info_space: gym.spaces.Dict | None = None,
    ) -> None:
        if episodes is not None and steps is not None:
            raise ValueError("give at most one of episodes and steps")
        self.num_envs = num_envs
        self.sink = sink
        self._count_steps = steps is not None
        budget = episodes if episodes is not None else steps
        # what each env may still keep, in episodes or steps; an env is open while it is > 0
        self._left = np.full(num_envs, np.iinfo(np.int64).max) if budget is None else split_evenly(budget, num_envs)
        self.capacity = max(capacity, 4 * num_envs)
        self.episodes_done = 0
        self.steps_done = 0
        self.recent_returns: deque[float] = deque(maxlen=100)
        self.return_sum = 0.0  # over every emitted episode
        self._buffers: dict[str, Columnar] | None = None
        self._size = 0
        self._env_key = np.arange(num_envs, dtype=np.int64)
        self._next_key = num_envs
        self._done_keys: list[np.ndarray] = []
        self.info_space = info_space
        self.obs_info: dict[str, np.ndarray] | None = None  # info columns of the envs' current observations

    def add_step(self, step: StepBatch) -> None:
        """Record one vector-env step (a :data:`~rlpipe.envs.stepper.StepSink`); rows where
        ``valid`` is False (autoreset steps) or whose env has used up its share are dropped.

        All rows are copied as they come (slices, no fancy indexing); dropped rows get the
        key -1, which never completes, so `flush` discards them in bulk.
        """
        live = (self._left > 0) & step.valid
        row = {
            "key": np.where(live, self._env_key, -1),
            "step": step.episode_length - 1,  # the row's index in its episode (valid rows)
            "obs": step.obs,
            "action": np.asarray(step.env_actions),
            "reward": np.asarray(step.rewards),
            "next_obs": step.next_obs,
            "terminated": np.asarray(step.terminated),
            "truncated": np.asarray(step.truncated),
        }
        if self.info_space is not None:
            next_info = info_columns(step.infos, self.info_space, self.num_envs)
            row.update(info=self.obs_info, next_info=next_info)
            self.obs_info = next_info
        if self._buffers is None:
            self._buffers = {k: map_columnar(v, lambda a: np.empty((self.capacity,) + a.shape[1:], a.dtype)) for k, v in row.items()}
        if self._size + self.num_envs > self.capacity:
            self.flush()
        self._store(row, self._size)
        self._size += self.num_envs

        done = np.flatnonzero(live & step.done)
        if len(done):  # every episode an open env finishes is kept: it was started within its share
            self._done_keys.append(self._env_key[done].copy())
            self.episodes_done += len(done)
            self.steps_done += int(step.episode_length[done].sum())
            self.recent_returns.extend(step.episode_return[done].tolist())
            self.return_sum += float(step.episode_return[done].sum())
            self._left[done] -= step.episode_length[done] if self._count_steps else 1
            self._env_key[done] = self._next_key + np.arange(len(done))
            self._next_key += len(done)

    @property
    def finished(self) -> bool:
        """Whether every env has used up its share of the budget."""
        return not np.any(self._left > 0)

    def _store(self, values: dict[str, Columnar], at: int) -> None:
        def put(buffer: Columnar, value: Columnar) -> None:
            if isinstance(buffer, dict):
                for key in buffer:
                    put(buffer[key], value[key])
            else:
                buffer[at : at + len(value)] = value

        assert self._buffers is not None  # add_step makes them before storing a row
        for name, value in values.items():
            put(self._buffers[name], value)

    def flush(self) -> None:
        """Emit the rows of every completed episode; keep unfinished ones (growing if needed)."""
        if self._buffers is None or self._size == 0:
            return
        size, buffers = self._size, self._buffers
        keys = cast(np.ndarray, buffers["key"])[:size]  # key and step are plain arrays
        if self._done_keys:
            done_keys = np.concatenate(self._done_keys)
            first_id = self.episodes_done - len(done_keys)
            sorter = np.argsort(done_keys, kind="stable")
            position = np.searchsorted(done_keys, keys, sorter=sorter)
            position = np.minimum(position, len(done_keys) - 1)
            complete = done_keys[sorter[position]] == keys
            rows = np.flatnonzero(complete)
            episode_id = first_id + sorter[position[rows]]
            order = np.lexsort((cast(np.ndarray, buffers["step"])[rows], episode_id))
            rows, episode_id = rows[order], episode_id[order]
            self._done_keys = []
            out = {name: map_columnar(buffers[name], lambda a: a[rows]) for name in buffers if name != "key"}
            out["episode_id"] = episode_id
            self.sink(out)
            keep = np.flatnonzero(~complete & (keys >= 0))
        else:
            keep = np.flatnonzero(keys >= 0)
        kept = {name: map_columnar(buffers[name], lambda a: a[keep]) for name in buffers}
        if len(keep) > self.capacity // 2:
            self.capacity *= 2
            self._buffers = {k: map_columnar(v, lambda a: np.empty((self.capacity,) + a.shape[1:], a.dtype)) for k, v in buffers.items()}
        self._store(kept, 0)
        self._size = len(keep)

    def close(self) -> None:
        """Flush completed episodes and drop the rows of unfinished ones."""
        self.flush()
        self._size = 0


CollectionEnvs = gym.Env | gym.vector.VectorEnv  # what a collection steps: one env, or a vector env


@dataclass(frozen=True)
class EnvRef:
    """An env resolved once, at the edge of a collection (`resolve_env`): its id, its
    single-env spaces and the info keys it reports, passed down instead of building the env
    again to read them."""

    env_id: str
    observation_space: gym.Space
    action_space: gym.Space
    info_space: gym.spaces.Dict | None  # the info keys stored as info/next_info columns (see `EpisodeAssembler`)


def open_envs(env_id: str, num_envs: int) -> CollectionEnvs:
    """The envs a collection of `num_envs` steps: one ``gym.make`` env (see `OneEnvRollout`), or a vector env."""
    return make_env(env_id) if num_envs == 1 else make_vec_env(env_id, num_envs)


def resolve_env(env_id: str, info_keys: tuple[str, ...], num_envs: int | None = None) -> tuple[EnvRef, CollectionEnvs | None]:
    """Build `env_id` once and read its `EnvRef`: its spaces, and the Dict of those `info_keys`
    it reports at reset or on a random first step, each as the Box its values fit (None when it
    reports none of them).

    With `num_envs` the env is built as the envs a collection of that many steps
    (`open_envs`) and returned for `collect` to step (its reset with the collection's seed
    starts them afresh), so the collection builds none; the caller closes them. Without, a
    one-env probe is built and closed here: the collection runs elsewhere (tasks, a training run).
    """
    envs = open_envs(env_id, num_envs or 1)
    try:
        if isinstance(envs, gym.vector.VectorEnv):
            spaces = envs.single_observation_space, envs.single_action_space
        else:
            spaces = envs.observation_space, envs.action_space
        ref = EnvRef(env_id, *spaces, _probe_info_space(envs, info_keys) if info_keys else None)
    except BaseException:
        envs.close()
        raise
    if num_envs is None:
        envs.close()
        return ref, None
    return ref, envs


def _probe_info_space(envs: CollectionEnvs, keys: tuple[str, ...]) -> gym.spaces.Dict | None:
    """`resolve_env`'s info space, from the first env's reset (seed 0) and first random step."""
    envs.action_space.seed(0)
    infos = [envs.reset(seed=0)[1], envs.step(envs.action_space.sample())[-1]]
    if not isinstance(envs, gym.vector.VectorEnv):
        infos = [{key: [value] for key, value in info.items()} for info in infos]  # as a one-env vector env reports them
    found: dict[str, gym.Space] = {}
    for key in keys:
        values = [info[key][0] for info in infos if key in info and info.get(f"_{key}", np.ones(1, bool))[0]]
        space = info_value_space(values[0]) if values else None
        if space is not None:
            found[key] = space
    return gym.spaces.Dict(found) if found else None


def info_columns(info: dict, space: gym.spaces.Dict, num_envs: int) -> dict[str, np.ndarray]:
    """The `space` keys of a vector env's info as arrays, one row per env; an env that did not
    report a key this step gets 0/False (gymnasium marks reports in `_<key>`)."""
    columns = {}
    for key, sub in space.spaces.items():
        column = np.zeros((num_envs,) + cast("tuple[int, ...]", sub.shape), sub.dtype)  # info spaces hold Boxes
        if key in info:
            reported = np.asarray(info.get(f"_{key}", np.ones(num_envs, bool)), bool)
            column[reported] = np.asarray(info[key])[reported]
        columns[key] = column
    return columns


@dataclass
class CollectStats:
    """What a collection run produced."""

    episodes: int
    steps: int
    env_steps: int
    seconds: float
    mean_return: float  # over every stored episode


def check_budget(episodes: int | None, steps: int | None) -> None:
    """An RlpipeError unless exactly one of `episodes` and `steps` is given, from 1 to
    MAX_ENV_STEPS (a run's env steps; an episode is at least one step), as `rlpipe.collect` checks them."""
    if (episodes is None) == (steps is None):
        raise RlpipeError("give exactly one of --episodes and --steps")
    budget = cast(int, episodes if episodes is not None else steps)  # exactly one is given (checked above)
    if budget < 1:
        raise RlpipeError("--episodes/--steps must be at least 1")
    if budget > MAX_ENV_STEPS:  # 2**32 episodes ran until killed
        raise RlpipeError(f"--episodes/--steps must be at most {MAX_ENV_STEPS} (the env steps of one run), got {budget}")


def collect(
    env_id: str,
    make_policy: Callable[[gym.Space, int], Policy],
    sink: RowSink,
    *,
    episodes: int | None = None,
    steps: int | None = None,
    num_envs: int = 8,
    seed: int = 0,
    show_progress: bool = True,
    info_space: gym.spaces.Dict | None = None,
    envs: CollectionEnvs | None = None,
) -> CollectStats:
    """Run a policy in `num_envs` vector envs until `episodes` whole episodes (or at least
    `steps` transitions in whole episodes) are done, sending rows to `sink`. The budget is
    split evenly over the envs, so the kept episodes are not biased towards short ones (see
    `EpisodeAssembler`).

    `make_policy` receives the single-env action space and the number of envs and returns
    the batched policy. Truncation and termination stay apart, and `next_obs` of a truncated
    step is the real final observation: the env steps through
    :class:`~rlpipe.envs.stepper.VecStepper`, which marks the reset step after an episode's
    end (next-step autoreset), and that row is dropped. With `info_space` the rows also get
    those info keys (`info` with obs, `next_info` with next_obs; see `resolve_env`).

    With one env there is nothing to batch: `OneEnvRollout` steps a plain ``gym.make`` env
    (a 1-env vector env costs several times a CartPole step) and gives the same rows as a
    1-env SyncVectorEnv would. `envs` are the `num_envs` envs to step when the caller built
    them already (`resolve_env`) and closes them; by default they are built here (`open_envs`).
    """
    check_budget(episodes, steps)
    owned = envs is None
    envs = open_envs(env_id, num_envs) if envs is None else envs
    try:
        if num_envs == 1:
            return OneEnvRollout(env_id, make_policy, sink, episodes, steps, info_space).run(cast(gym.Env, envs), seed, show_progress)
        vector = cast(gym.vector.VectorEnv, envs)
        policy = make_policy(vector.single_action_space, num_envs)
        assembler = EpisodeAssembler(num_envs, sink, episodes=episodes, steps=steps, info_space=info_space)
        stepper = VecStepper(vector, None, seed, assembler.add_step)
        if info_space is not None:
            assembler.obs_info = info_columns(stepper.infos, info_space, num_envs)
        start_episodes = _episode_starts(policy)
        start_episodes(np.ones(num_envs, bool))
        start = time.perf_counter()
        with _progress(show_progress) as progress:
            meter = _Meter(progress, f"collect {env_id}", episodes, steps, start)
            while not assembler.finished:
                start_episodes(~stepper.step(policy(stepper.obs)).valid)  # those envs just reset (NEXT_STEP autoreset)
                meter.show(stepper.env_steps, assembler.episodes_done, assembler.steps_done, assembler.recent_returns)
            assembler.close()
            meter.done(assembler.episodes_done, assembler.recent_returns)
    finally:
        if owned:
            envs.close()
    return CollectStats(
        episodes=assembler.episodes_done,
        steps=assembler.steps_done,
        env_steps=stepper.env_steps,
        seconds=time.perf_counter() - start,
        mean_return=assembler.return_sum / assembler.episodes_done if assembler.episodes_done else float("nan"),
    )


class OneEnvRollout:
    """Collection from one ``gym.make`` env in a plain Python loop: per step one policy call,
    one env step and a few list appends; rows are built in bulk every `flush_rows` steps.

    Keeps the first `episodes` episodes, or whole episodes until at least `steps` steps (the
    crossing one included), with the same rows, ids and order as `EpisodeAssembler` gives
    for one env.
    """

    def __init__(
        self,
        env_id: str,
        make_policy: Callable[[gym.Space, int], Policy],
        sink: RowSink,
        episodes: int | None,
        steps: int | None,
        info_space: gym.spaces.Dict | None,
        flush_rows: int = 1 << 16,
    ) -> None:
        self.env_id, self.make_policy, self.sink, self.info_space = env_id, make_policy, sink, info_space
        self.episodes, self.steps, self.flush_rows = episodes, steps, flush_rows
        self.returns: list[float] = []
        self.kept_steps = 0
        self._clear()

    def _clear(self) -> None:
        # the observation stream: each episode's observations, its final one included
        self._observations: list = []
        self._infos: list = []
        self._actions: list = []
        self._rewards: list = []
        self._lengths: list[int] = []
        self._ends: list[tuple[bool, bool]] = []

    def run(self, env: gym.Env, seed: int, show_progress: bool) -> CollectStats:
        """Collect the budget from `env`, reset with `seed` first (the caller closes it)."""
        policy = self.make_policy(env.action_space, 1)
        obs, info = env.reset(seed=seed)
        start = time.perf_counter()
        with _progress(show_progress) as progress:
            meter = _Meter(progress, f"collect {self.env_id}", self.episodes, self.steps, start)
            while not self._budget_used():
                obs, info = self._episode(env, policy, obs, info)
                meter.show(self.kept_steps, len(self.returns), self.kept_steps, self.returns[-100:])
            self._flush()
            meter.done(len(self.returns), self.returns[-100:])
        return CollectStats(len(self.returns), self.kept_steps, self.kept_steps, time.perf_counter() - start, float(np.mean(self.returns)))

    def _budget_used(self) -> bool:
        # the callers checked that one of episodes and steps is given (check_budget)
        return len(self.returns) >= self.episodes if self.episodes is not None else self.kept_steps >= cast(int, self.steps)

    def _episode(self, env: gym.Env, policy: Policy, obs: Any, info: dict) -> tuple[Any, dict]:
        """Run one episode from `obs`; return the first observation (and info) of the next."""
        observations, actions, rewards, infos = self._observations, self._actions, self._rewards, self._infos
        step, keys = env.step, None if self.info_space is None else tuple(self.info_space.spaces)
        batched = isinstance(obs, np.ndarray)
        length, total = 0, 0.0
        _episode_starts(policy)(np.ones(1, bool))
        while True:
            observations.append(obs if batched else _copy(obs))
            if keys is not None:
                infos.append(tuple(info.get(key, 0) for key in keys))
            action = policy(obs[None] if batched else map_columnar(obs, lambda a: np.asarray(a)[None]))[0]
            next_obs, reward, terminated, truncated, info = step(action)
            if next_obs is obs:  # an env that updates its observation array in place
                observations[-1] = obs.copy()
            actions.append(action)
            rewards.append(reward)
            total += reward  # type: ignore[operator]  # a number (SupportsFloat): summed as the env returns it
            length += 1
            obs = next_obs
            if terminated or truncated:
                break
        observations.append(obs if batched else _copy(obs))
        if keys is not None:
            infos.append(tuple(info.get(key, 0) for key in keys))
        self._lengths.append(length)
        self._ends.append((bool(terminated), bool(truncated)))
        self.returns.append(float(total))
        self.kept_steps += length
        if len(actions) >= self.flush_rows:
            self._flush()
        # A vector env's reset step asks the policy for an action it ignores; asking here too
        # keeps a stochastic policy's draws, and so the rows, those of a 1-env vector env.
        policy(obs[None] if batched else map_columnar(obs, lambda a: np.asarray(a)[None]))
        return env.reset()

    def _flush(self) -> None:
        """Emit the stored episodes as rows (obs and next_obs are slices of the stream)."""
        if not self._lengths:
            return
        lengths = np.asarray(self._lengths, np.int64)
        ends = np.cumsum(lengths)
        first_row = ends - lengths
        row = np.arange(ends[-1])
        episode = np.repeat(np.arange(len(lengths)), lengths)
        at = row + episode  # the row's observation in the stream (each episode adds one final observation)
        flags = np.asarray(self._ends, bool).reshape(-1, 2)
        terminated, truncated = np.zeros(len(row), bool), np.zeros(len(row), bool)
        terminated[ends - 1], truncated[ends - 1] = flags[:, 0], flags[:, 1]
        stream = _stack(self._observations)
        rows = {
            "step": row - first_row[episode],
            "obs": map_columnar(stream, lambda a: a[at]),
            "action": np.asarray(self._actions),
            "reward": np.asarray(self._rewards),
            "next_obs": map_columnar(stream, lambda a: a[at + 1]),
            "terminated": terminated,
            "truncated": truncated,
            "episode_id": len(self.returns) - len(lengths) + episode,
        }
        if self.info_space is not None:
            infos = _info_stream(self._infos, self.info_space)
            rows.update(info=map_columnar(infos, lambda a: a[at]), next_info=map_columnar(infos, lambda a: a[at + 1]))
        self._clear()
        self.sink(rows)


def _episode_starts(policy: Policy) -> Callable[[np.ndarray], None]:
    """The policy's ``start_episodes(rows)`` (a policy keeping state per env: frame stacks, a
    planner's warm start; see `rlpipe.training.evaluation.EpisodicPolicy`), else a no-op."""
    return getattr(policy, "start_episodes", lambda rows: None)


def _copy(obs: Columnar) -> Columnar:
    return map_columnar(obs, np.array)


def _stack(rows: list) -> Columnar:
    """Stack per-step observations (arrays, or dicts of arrays) into one column."""
    if isinstance(rows[0], dict):
        return {key: _stack([row[key] for row in rows]) for key in rows[0]}
    return np.stack(rows)


def _info_stream(values: list[tuple], space: gym.spaces.Dict) -> dict[str, Columnar]:
    """Per-step info tuples (in `space`'s key order) as one array per key."""
    columns = zip(*values)
    return {
        key: np.asarray(list(column), sub.dtype).reshape((-1,) + cast("tuple[int, ...]", sub.shape))  # info spaces hold Boxes
        for (key, sub), column in zip(space.spaces.items(), columns)
    }


class _Meter:
    """The collection progress bar, refreshed at most every 0.25 s."""

    def __init__(self, progress: Progress, description: str, episodes: int | None, steps: int | None, start: float) -> None:
        self.progress, self.start, self.next_update = progress, start, start
        self.by_episodes = episodes is not None
        self.total = cast(int, episodes if episodes is not None else steps)  # one is given (check_budget)
        self.task = progress.add_task(description, total=self.total, rate="", ret="")

    def show(self, env_steps: int, episodes: int, steps: int, recent_returns: Any) -> None:
        now = time.perf_counter()
        if now < self.next_update:
            return
        self.next_update = now + 0.25
        done = episodes if self.by_episodes else steps
        self.progress.update(
            self.task,
            completed=min(done, self.total),
            rate=f"{env_steps / max(now - self.start, 1e-9):,.0f} steps/s",
            ret=_mean_return_text(episodes, recent_returns),
        )

    def done(self, episodes: int, recent_returns: Any) -> None:
        self.progress.update(self.task, completed=self.total, ret=_mean_return_text(episodes, recent_returns))


def _mean_return_text(episodes: int, recent_returns: Any) -> str:
    if not len(recent_returns):
        return ""
    return f"{episodes} episodes, return {np.mean(recent_returns):.1f}"


def _progress(enabled: bool) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[rate]}"),
        TextColumn("{task.fields[ret]}"),
        TimeElapsedColumn(),
        disable=not enabled,
        transient=False,
    )
