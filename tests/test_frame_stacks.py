"""Frame stacks at sampling time: the samplers' stacks are what gymnasium's
FrameStackObservation(padding_type="reset") shows a policy, and policies trained on stacks
see stacks wherever they act."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.wrappers import FrameStackObservation

import tests.image_env  # noqa: F401  (registers TinyFrames-v0)
from rlpipe.algos import load_policy
from rlpipe.commands.ope import FQEConfig, fitted_q_evaluation
from rlpipe.datasets.collector import collect as rollout
from rlpipe.datasets.frames import chain_starts, stack_depths, stack_rows
from rlpipe.datasets.loader import load_shards
from rlpipe.datasets.mapped import MappedTransitions
from rlpipe.datasets.store import open_dataset
from rlpipe.datasets.writer import write_rows
from rlpipe.envs.spaces import ActionScaler, space_to_json
from rlpipe.errors import RlpipeError
from rlpipe.nets.checkpoint import save_checkpoint
from rlpipe.nets.networks import GreedyQPolicy
from rlpipe.training.env import encoder_spec
from rlpipe.training.evaluation import FrameStacks, evaluate, policy_fn
from rlpipe.training.sampler import MappedSampler, SeedSampler, TransitionSampler

PRODUCER = {"algorithm": "random", "seed": 0, "params": {}, "num_envs": 1, "checkpoint_sha256": None}


def wrapped_rollout(env_id: str, k: int, episodes: int, seed: int) -> tuple[list[dict[str, np.ndarray]], np.ndarray, np.ndarray]:
    """Episodes of random actions in ``FrameStackObservation(env, k, padding_type="reset")``:
    the rows a dataset stores (each step's last frame) and, per row, the stacks the wrapper
    showed before and after the step."""
    env = FrameStackObservation(gym.make(env_id), k, padding_type="reset")
    env.action_space.seed(seed)
    blocks, before, after = [], [], []
    for episode in range(episodes):
        stack, _ = env.reset(seed=seed + episode)
        rows: dict[str, list] = {name: [] for name in ("obs", "action", "reward", "next_obs", "terminated", "truncated", "step")}
        done = False
        while not done:
            action = env.action_space.sample()
            following, reward, terminated, truncated, _ = env.step(action)
            for name, value in zip(rows, (stack[-1], action, reward, following[-1], terminated, truncated, len(rows["step"]))):
                rows[name].append(value)
            before.append(stack)
            after.append(following)
            stack, done = following, terminated or truncated
        block = {name: np.asarray(values) for name, values in rows.items()}
        block["episode_id"] = np.full(len(block["step"]), episode)
        blocks.append(block)
    env.close()
    return blocks, np.stack(before), np.stack(after)


def stored_rollout(store: Path, env_id: str, k: int, episodes: int, shard_bytes: int | None = None) -> tuple[str, np.ndarray, np.ndarray]:
    blocks, before, after = wrapped_rollout(env_id, k, episodes, seed=3)
    env = gym.make(env_id)
    options = {} if shard_bytes is None else {"shard_bytes": shard_bytes}
    write_rows(
        "frames", blocks, env.observation_space, env.action_space, env_id=env_id, producer=PRODUCER, store=store, fmt="arrow", **options
    )
    return "frames", before, after


@pytest.mark.parametrize("k", [2, 4])
def test_sampler_stacks_equal_the_gymnasium_wrappers(store: Path, k: int) -> None:
    """Every row's obs/next_obs stacks, in RAM and from the memory maps over several shards
    (episodes shorter than k included), are exactly the wrapper's stacks on the same rollout."""
    name, before, after = stored_rollout(store, "TinyFrames-v0", k, episodes=30, shard_bytes=4_000)
    info = open_dataset(name, store)
    assert len(info.shard_paths) >= 3
    data = load_shards(info)
    assert (np.diff(np.r_[data.episode_starts(), len(data)]) < k).any()  # some episodes are shorter than a stack
    every_row = torch.arange(len(data))
    for sampler in (
        TransitionSampler(data, frame_stack=k),
        MappedSampler(MappedTransitions(info, resident_bytes=0), frame_stack=k),
        MappedSampler(MappedTransitions(info), frame_stack=k),
    ):
        batch = sampler.take(every_row)
        assert batch.obs.shape == (len(data), k, 8, 8, 3) and batch.obs.dtype == torch.uint8
        np.testing.assert_array_equal(batch.obs.numpy(), before)
        np.testing.assert_array_equal(batch.next_obs.numpy(), after)


def test_minatar_stacks_equal_the_wrappers_and_mapped_equals_in_ram(store: Path) -> None:
    """MinAtar's bool frames (bit-packed in the shards): the same stacks in RAM, from the maps
    and from the wrapper; seeded batches agree between the two samplers."""
    minatar_gym = pytest.importorskip("minatar.gym")
    if "MinAtar/Breakout-v1" not in gym.registry:
        minatar_gym.register_envs()
    name, before, after = stored_rollout(store, "MinAtar/Breakout-v1", 4, episodes=6, shard_bytes=20_000)
    info = open_dataset(name, store)
    in_ram = TransitionSampler(load_shards(info), seed=5, frame_stack=4)
    mapped = MappedSampler(MappedTransitions(info, resident_bytes=0), seed=5, frame_stack=4)
    every_row = torch.arange(in_ram.size)
    np.testing.assert_array_equal(mapped.take(every_row).obs.numpy(), before)
    np.testing.assert_array_equal(in_ram.take(every_row).next_obs.numpy(), after)
    for _ in range(5):
        ours, theirs = mapped.sample(32), in_ram.sample(32)
        for column in ("obs", "actions", "rewards", "next_obs", "terminated"):
            assert torch.equal(getattr(ours, column), getattr(theirs, column)), column


def test_frame_stack_one_is_unchanged_and_seed_batches_stack(store: Path) -> None:
    """k = 1 gives unstacked rows as before; a seed stack's [K, B] indices give [K, B, k, *frame]."""
    name, before, _ = stored_rollout(store, "TinyFrames-v0", 3, episodes=10)
    data = load_shards(open_dataset(name, store))
    plain = TransitionSampler(data).take(torch.arange(len(data)))
    np.testing.assert_array_equal(plain.obs.numpy(), data.obs)
    index = torch.tensor([[0, 5, 9], [1, 2, 3]])
    stacked = SeedSampler(TransitionSampler(data, frame_stack=3), [0, 1]).take(index)
    assert stacked.obs.shape == (2, 3, 3, 8, 8, 3) and stacked.next_obs.shape == (2, 3, 3, 8, 8, 3)
    np.testing.assert_array_equal(stacked.obs.numpy(), before[index.numpy()])


def test_stacks_never_reach_across_a_gap() -> None:
    """A row whose predecessor is another episode, or not its previous step (a subset), starts a chain."""
    episode_id = np.array([0, 0, 0, 1, 1, 1, 1, 1])
    step = np.array([0, 1, 2, 0, 1, 3, 4, 5])
    starts = chain_starts(episode_id, step)
    np.testing.assert_array_equal(starts, [1, 0, 0, 1, 0, 1, 0, 0])
    depths = stack_depths(starts, 3)
    np.testing.assert_array_equal(depths, [0, 1, 2, 0, 1, 0, 1, 2])
    np.testing.assert_array_equal(stack_rows(np.array([3, 4, 6, 7]), depths, 3), [[3, 3, 3], [3, 3, 4], [5, 5, 6], [5, 6, 7]])
    assert not chain_starts(np.array([1, 1]), np.array([3, 4]), previous=(1, 2))[0]


def test_bad_frame_stack_is_refused(store: Path) -> None:
    name, _, _ = stored_rollout(store, "TinyFrames-v0", 2, episodes=3)
    with pytest.raises(RlpipeError, match="frame_stack must be from 1"):
        TransitionSampler(load_shards(open_dataset(name, store)), frame_stack=0)


def test_frame_stacks_of_several_envs_equal_the_wrappers() -> None:
    """`FrameStacks` fed one frame per env, told which envs start an episode, shows each env
    what its own FrameStackObservation(padding_type="reset") shows (episodes of different lengths)."""
    envs = [FrameStackObservation(gym.make("TinyFrames-v0"), 4, padding_type="reset") for _ in range(3)]
    wrapped = [env.reset(seed=i)[0] for i, env in enumerate(envs)]
    frames = FrameStacks(4)
    frames.start(np.ones(3, bool))
    for _ in range(60):
        np.testing.assert_array_equal(frames.push(np.stack([stack[-1] for stack in wrapped])), np.stack(wrapped))
        starts = np.zeros(3, bool)
        for i, env in enumerate(envs):
            wrapped[i], _, terminated, truncated, _ = env.step(0)
            if terminated or truncated:
                wrapped[i], _ = env.reset()
                starts[i] = True
        frames.start(starts)


def greedy_stacked_policy(k: int = 4) -> GreedyQPolicy:
    torch.manual_seed(0)
    space = gym.make("TinyFrames-v0").observation_space
    return GreedyQPolicy(int(np.prod(space.shape)), 2, hidden=(16,), encoder=encoder_spec(space, frame_stack=k)).eval()


def save_run(run_dir: Path, actor: GreedyQPolicy) -> None:
    """`actor` saved as a run's policy in TinyFrames-v0 (its Q-network is discrete CQL's policy)."""
    space = gym.make("TinyFrames-v0").action_space
    policy = {"kind": actor.kind, "spec": actor.spec}
    save_checkpoint(
        run_dir,
        {"policy": actor},
        {"algo": "cql", "env_id": "TinyFrames-v0", "action_space": space_to_json(space), "policy": policy, "config": {}},
    )


def recorded_inputs(actor: GreedyQPolicy) -> list[np.ndarray]:
    seen: list[np.ndarray] = []
    actor.encoder.register_forward_pre_hook(lambda module, args: seen.append(args[0].numpy().copy()))
    return seen


def test_a_stacked_policy_acts_on_the_wrappers_stacks_in_evaluation_and_after_loading(tmp_path: Path) -> None:
    """A GreedyQPolicy reading 4 frames, evaluated in the plain env, sees exactly the stacks
    FrameStackObservation would give it (episode starts padded), as trained and as loaded."""
    actor = greedy_stacked_policy()
    seen = recorded_inputs(actor)
    result = evaluate(policy_fn(actor, ActionScaler(gym.spaces.Discrete(2))), "TinyFrames-v0", episodes=3, seed=4, max_envs=1)
    evaluated = list(seen)
    expected, returns = [], []
    env = FrameStackObservation(gym.make("TinyFrames-v0"), 4, padding_type="reset")
    for episode in range(3):
        stack, _ = env.reset(seed=4 if episode == 0 else None)
        total, done = 0.0, False
        while not done:
            expected.append(stack[None].astype(np.float32))
            stack, reward, terminated, truncated, _ = env.step(int(actor.act(torch.as_tensor(expected[-1]))[0]))
            total, done = total + reward, terminated or truncated
        returns.append(total)
        if episode < 2:
            expected.append(stack[None].astype(np.float32))  # the vector env's reset step asks for an ignored action
    assert len(evaluated) == len(expected)
    for ours, theirs in zip(evaluated, expected):
        np.testing.assert_array_equal(ours, theirs)
    assert result.returns == returns

    save_run(tmp_path, actor)
    loaded = load_policy(tmp_path)
    assert loaded.frame_stack == 4
    assert evaluate(loaded, "TinyFrames-v0", episodes=3, seed=4, max_envs=1).returns == returns
    frame = np.zeros((2, 8, 8, 3), np.uint8)
    np.testing.assert_array_equal(loaded(frame[:, None].repeat(4, 1)), loaded(frame))  # stacks pass through; a first frame is padded


def collect(run_dir: Path, env_id: str, store: Path, name: str, num_envs: int) -> None:
    """Roll out the policy of `run_dir` in `num_envs` envs (the collector's loop) into dataset `name`."""
    blocks: list[dict] = []
    rollout(env_id, lambda space, n: load_policy(run_dir), blocks.append, episodes=12, num_envs=num_envs, seed=1, show_progress=False)
    env = gym.make(env_id)
    write_rows(name, blocks, env.observation_space, env.action_space, env_id=env_id, producer=PRODUCER, store=store, fmt="arrow")


def test_collection_with_a_stacked_expert_stores_single_frames(store: Path, tmp_path: Path) -> None:
    """An expert reading 4 frames collects a dataset of one frame per step; each decision saw
    the stack of the dataset's rows that the sampler gives back for that row."""
    actor = greedy_stacked_policy()
    save_run(tmp_path / "expert", actor)
    for num_envs in (1, 3):
        name = f"expert{num_envs}"
        collect(tmp_path / "expert", "TinyFrames-v0", store, name, num_envs)
        data = load_shards(open_dataset(name, store))
        assert data.obs.shape[1:] == (8, 8, 3)
        stacks = TransitionSampler(data, frame_stack=4).take(torch.arange(len(data))).obs
        greedy = actor.act(stacks.float()).numpy()
        np.testing.assert_array_equal(data.action, greedy)  # the expert's actions are its greedy actions on the stored stacks


def test_fqe_gives_a_stacked_policy_the_datasets_stacks(store: Path, tmp_path: Path) -> None:
    """FQE runs the policy on the stacks of the rows' next observations and of the initial states."""
    actor = greedy_stacked_policy()
    save_run(tmp_path / "expert", actor)
    collect(tmp_path / "expert", "TinyFrames-v0", store, "expert", 2)
    data = load_shards(open_dataset("expert", store))
    policy = load_policy(tmp_path / "expert")
    seen = recorded_inputs(policy.actor)
    (result,) = fitted_q_evaluation([policy], data, FQEConfig(updates=20, batch_size=16))
    assert result.initial_states == 12
    stacks = TransitionSampler(data, frame_stack=4).take(torch.arange(len(data)))
    np.testing.assert_array_equal(seen[0], stacks.next_obs.float().numpy())
    np.testing.assert_array_equal(seen[1], stacks.obs[torch.from_numpy(data.step == 0)].float().numpy())


@pytest.fixture(scope="module")
def velocity_hidden_replay(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DQN run's whole CartPole replay (tuned settings, stopped at 475), then the same
    transitions with the velocities dropped: data of `rlpipe/CartPoleNoVel-v1`."""
    from rlpipe.commands.collect import collect_dataset
    from rlpipe.training.env import env_spaces

    root = tmp_path_factory.mktemp("novel")
    store = root / "datasets"
    collect_dataset(
        "CartPole-v1",
        expert="dqn",
        from_training=True,
        expert_run=root / "dqn",
        seed=0,
        name="cartpole-replay",
        store=store,
        progress=False,
    )
    full = load_shards(open_dataset("cartpole-replay", store))
    positions = [0, 2]  # x and theta; 1 and 3 are their velocities
    rows = dict(
        obs=full.obs[:, positions],
        action=full.action,
        reward=full.reward,
        next_obs=full.next_obs[:, positions],
        terminated=full.terminated,
        truncated=full.truncated,
        episode_id=full.episode_id,
        step=full.step,
    )
    obs_space, act_space = env_spaces("rlpipe/CartPoleNoVel-v1")
    write_rows(
        "cartpolenovel-replay", [rows], obs_space, act_space, env_id="rlpipe/CartPoleNoVel-v1", producer={"test": "masked"}, store=store
    )
    return store


@pytest.mark.heavy
def test_frame_stacking_recovers_the_hidden_velocities(velocity_hidden_replay: Path, learning_seed: int, record_property) -> None:
    """CartPole observed without its velocities: CQL on the last 4 frames can tell where the
    pole is going and balances it; the control on single frames (the same data, updates and
    seed) cannot. Seeds 0-4: stacked 310.5, 162.5, 134.7, 310.5, 358.2; single frames 50.9,
    45.0, 47.0, 46.3, 46.1."""
    from rlpipe.algos import get_algo

    cql = get_algo("cql")
    settings = dict(dataset="cartpolenovel-replay", store=str(velocity_hidden_replay), seed=learning_seed, updates=3000)
    stacked, single = (
        cql.train(cql.make_config("rlpipe/CartPoleNoVel-v1", frame_stack=k, **settings), progress=False).metrics["eval_return_mean"]
        for k in (4, 1)
    )
    record_property("returns", (stacked, single))
    assert stacked >= 120 and single <= 70, (stacked, single)
