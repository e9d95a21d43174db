"""Image observations through the data layer: collection, inspection, validation, Minari
round trips, polars and the memory-mapped sampler, for uint8 frames (TinyFrames-v0, and
Atari-like frames that compress; stored compressed, next_obs only at episode ends) and
MinAtar's bool frames (bit-packed in the Arrow shards); datasets of the uncompressed layout
still load."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import polars as pl
import pyarrow as pa
import pytest
import torch
from minari.serialization import serialize_space

import tests.image_env  # noqa: F401  (registers TinyFrames-v0)
from rlpipe.datasets.codec import FRAME_CODEC
from rlpipe.datasets.loader import load_dataset
from rlpipe.datasets.mapped import MappedTransitions
from rlpipe.datasets.ops import merge_datasets
from rlpipe.datasets.store import DatasetInfo, open_dataset
from rlpipe.datasets.validate import validate_dataset
from rlpipe.datasets.writer import write_rows
from rlpipe.errors import RlpipeError
from rlpipe.storage.files import sha256_file
from rlpipe.training.sampler import MappedSampler, TransitionSampler

COLUMNS = ("obs", "action", "reward", "next_obs", "terminated", "truncated", "episode_id", "step")
ATARI_FRAME = gym.spaces.Box(0, 255, (84, 84, 1), np.uint8)
PRODUCER = {"algorithm": "random", "seed": 0, "params": {}, "num_envs": 1, "checkpoint_sha256": None}


def decoded(values: pl.Series | pa.Array, shape: tuple[int, ...]) -> np.ndarray:
    """Compressed frames as a reader without rlpipe decodes them: pyarrow alone."""
    size = int(np.prod(shape))
    blocks = values.to_list() if isinstance(values, pl.Series) else values.to_pylist()
    return np.stack([np.frombuffer(pa.decompress(b, decompressed_size=size, codec=FRAME_CODEC), np.uint8).reshape(shape) for b in blocks])


def image_env(env_id: str) -> str:
    """`env_id`, registered: MinAtar's ids need the minatar package (skipped without it)."""
    if env_id.startswith("MinAtar/") and env_id not in gym.registry:
        pytest.importorskip("minatar.gym").register_envs()
    return env_id


@pytest.mark.parametrize("env_id,arrow_type", [("TinyFrames-v0", "Binary"), ("MinAtar/Breakout-v1", "Array(Boolean, shape=(400,))")])
def test_an_image_dataset_goes_through_every_command(
    store: Path, tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch, env_id: str, arrow_type: str
) -> None:
    """A random collection stores the frames as the env gives them; inspect, validate, the
    Minari export and import (the same space and bytes back), polars and both samplers read them."""
    space = gym.make(image_env(env_id)).observation_space
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    args = ("--store", store)
    assert (
        cli(
            "collect", "--env", env_id, "--episodes", "12", "--num-envs", "3", "--name", "frames", "--format", "both", "--quiet", *args
        ).code
        == 0
    )
    info = open_dataset("frames", store)
    assert info.observation_space == space
    data = load_dataset("frames", store)
    assert data.obs.shape == (len(data), *space.shape) and data.obs.dtype == space.dtype
    assert str(space.shape) in cli("datasets", "inspect", "frames", *args).out
    assert cli("datasets", "validate", "frames", *args).code == 0
    assert cli("datasets", "export", "frames", "--id", "test/frames-v0", *args).code == 0
    minari = pytest.importorskip("minari")
    assert minari.load_dataset("test/frames-v0").observation_space == space
    assert cli("datasets", "import", "test/frames-v0", "--name", "back", *args).code == 0
    back = load_dataset("back", store)
    assert open_dataset("back", store).observation_space == space
    for column in COLUMNS:
        np.testing.assert_array_equal(getattr(back, column), getattr(data, column), err_msg=column)
    steps = pl.scan_ipc(info.shard_paths).collect()
    assert str(steps.schema["obs"]) == arrow_type and len(steps) == len(data)
    frames = decoded(steps["obs"], space.shape) if arrow_type == "Binary" else steps["obs"].to_numpy().reshape(data.obs.shape)
    np.testing.assert_array_equal(frames, data.obs)
    every_row = torch.arange(len(data))
    for k in (1, 4):
        in_ram = TransitionSampler(data, frame_stack=k).take(every_row)
        for resident_bytes in (0, 1 << 30):
            mapped = MappedSampler(MappedTransitions(info, resident_bytes=resident_bytes), frame_stack=k).take(every_row)
            assert torch.equal(mapped.obs, in_ram.obs) and torch.equal(mapped.next_obs, in_ram.next_obs)


def test_validate_finds_a_frame_that_breaks_the_chain(store: Path) -> None:
    """An image dataset whose next_obs is not the next row's obs is reported like any other."""
    env = gym.make("TinyFrames-v0")
    frames = np.random.default_rng(0).integers(0, 256, (6, 8, 8, 3), dtype=np.uint8)
    next_obs = frames[1:].copy()
    next_obs[2, 4, 4, 1] ^= 1  # one bit of one frame
    rows = {
        "obs": frames[:5],
        "action": np.zeros(5, np.int64),
        "reward": np.zeros(5, np.float32),
        "next_obs": next_obs,
        "terminated": np.r_[np.zeros(4, bool), True],
        "truncated": np.zeros(5, bool),
        "episode_id": np.zeros(5, np.int64),
        "step": np.arange(5),
    }
    producer = {"algorithm": "random", "seed": 0, "params": {}, "num_envs": 1, "checkpoint_sha256": None}
    write_rows(
        "broken", [rows], env.observation_space, env.action_space, env_id="TinyFrames-v0", producer=producer, store=store, fmt="arrow"
    )
    problems = validate_dataset(open_dataset("broken", store))
    assert any("next_obs at row 2 differs from obs at row 3" in problem for problem in problems), problems


def atari_like_rows(episodes: int, length: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Episodes of 84 x 84 frames drawn like Atari's: a fixed background with a few moving
    2 x 2 blocks; terminated and truncated episodes alternate."""
    rng = np.random.default_rng(seed)
    background = np.zeros(ATARI_FRAME.shape, np.uint8)
    background[:8], background[-4:] = 142, 200
    parts: dict[str, list[np.ndarray]] = {name: [] for name in COLUMNS}
    for episode in range(episodes):
        frames = np.repeat(background[None], length + 1, axis=0)
        for frame, corners in zip(frames, rng.integers(10, 78, (length + 1, 3, 2))):
            for row, column in corners:
                frame[row : row + 2, column : column + 2] = 236
        done = np.zeros(length, bool)
        done[-1] = True
        parts["obs"].append(frames[:-1])
        parts["next_obs"].append(frames[1:])
        parts["action"].append(rng.integers(0, 4, length))
        parts["reward"].append(rng.random(length).astype(np.float32))
        parts["terminated"].append(done & (episode % 2 == 0))
        parts["truncated"].append(done & (episode % 2 == 1))
        parts["episode_id"].append(np.full(length, episode))
        parts["step"].append(np.arange(length))
    return {name: np.concatenate(values) for name, values in parts.items()}


def write_frames(store: Path, name: str, rows: dict[str, np.ndarray], **options) -> DatasetInfo:
    write_rows(name, [rows], ATARI_FRAME, gym.spaces.Discrete(4), env_id=None, producer=PRODUCER, store=store, **options)
    return open_dataset(name, store)


def shard_bytes(info: DatasetInfo) -> int:
    return sum(path.stat().st_size for path in info.shard_paths)


def test_uint8_frames_are_stored_compressed_and_read_back_identical(store: Path, cli) -> None:
    """Atari-like frames take a fraction of their raw bytes (one compressed block per frame,
    next_obs stored only at episode ends) and every reader gets the frames back bit for bit:
    loading, the memory maps (held in RAM or read per row, frame stacks included), the HDF5
    copy, polars with pyarrow's decompress, and the dataset verbs."""
    rows = atari_like_rows(episodes=6, length=40)
    info = write_frames(store, "atari", rows, fmt="both")
    assert info.metadata["frame_codec"] == FRAME_CODEC and info.metadata["format_version"] == 2
    raw = 2 * rows["obs"].nbytes
    assert shard_bytes(info) < raw / 20, (shard_bytes(info), raw)
    table = pa.ipc.open_file(str(info.shard_paths[0])).read_all()
    assert table.schema.field("obs").type == pa.large_binary() and table.schema.field("obs").metadata == {
        b"rlpipe.frame_codec": b"lz4_raw",
        b"rlpipe.frame_shape": b"[84, 84, 1]",
    }
    assert table.column("next_obs").null_count == len(table) - 6  # stored at the 6 episode ends only
    data = load_dataset("atari", store)
    for column in COLUMNS:
        np.testing.assert_array_equal(getattr(data, column), rows[column], err_msg=column)
    assert validate_dataset(info) == []  # the HDF5 copy equals the decoded Arrow data
    np.testing.assert_array_equal(decoded(pl.scan_ipc(info.shard_paths).collect()["obs"], ATARI_FRAME.shape), rows["obs"])
    shuffled = np.random.default_rng(1).permutation(len(data))
    every_row = torch.arange(len(data))
    for resident_bytes in (0, 100_000, 1 << 30):  # frames read per row, their blocks held in RAM, held decoded
        mapped = MappedTransitions(info, resident_bytes=resident_bytes)
        assert ("obs" in mapped.resident) == (resident_bytes > 2 * raw) and "next_obs" not in mapped.resident + mapped.read_columns
        assert (mapped._shards[0]["obs"].blocks is not None) == (resident_bytes == 100_000)
        taken = mapped.take(shuffled)
        for column in ("obs", "next_obs", "action", "reward", "terminated"):
            np.testing.assert_array_equal(taken[column], rows[column][shuffled], err_msg=column)
        np.testing.assert_array_equal(mapped.column("next_obs"), rows["next_obs"])
        for k in (1, 4):
            ours, theirs = MappedSampler(mapped, frame_stack=k).take(every_row), TransitionSampler(data, frame_stack=k).take(every_row)
            assert torch.equal(ours.obs, theirs.obs) and torch.equal(ours.next_obs, theirs.next_obs)
        mapped.close()
    with pytest.raises(RlpipeError, match="read obs with them"):
        MappedTransitions(info, columns=("next_obs",))
    assert cli("datasets", "filter", "atari", "--name", "some", "--episodes", "1,4", "--store", store).code == 0
    some = load_dataset("some", store)
    kept = np.isin(rows["episode_id"], [1, 4])
    assert open_dataset("some", store).metadata["frame_codec"] == FRAME_CODEC
    np.testing.assert_array_equal(some.obs, rows["obs"][kept])
    np.testing.assert_array_equal(some.next_obs, rows["next_obs"][kept])


def test_datasets_of_the_uncompressed_layout_still_load_and_merge(store: Path) -> None:
    """A dataset written before compression (fixed-size lists, next_obs in full, format
    version 1) loads, maps and validates unchanged; merged with a compressed one, the result
    is compressed and holds both's frames."""
    rows = atari_like_rows(episodes=3, length=20)
    old = write_frames(store, "old", rows, fmt="arrow", compress_frames=False)
    assert old.metadata["format_version"] == 1 and "frame_codec" not in old.metadata
    assert pa.ipc.open_file(str(old.shard_paths[0])).schema.field("obs").type == pa.list_(pa.uint8(), 84 * 84)
    assert shard_bytes(old) > 2 * rows["obs"].nbytes
    assert validate_dataset(old) == []
    np.testing.assert_array_equal(load_dataset("old", store).next_obs, rows["next_obs"])
    mapped = MappedTransitions(old, resident_bytes=0)
    np.testing.assert_array_equal(mapped.take(np.arange(len(rows["obs"])))["next_obs"], rows["next_obs"])
    write_frames(store, "new", atari_like_rows(episodes=2, length=20, seed=1), fmt="arrow")
    merge_datasets(["old", "new"], "both", store=store, weights=None)
    both = load_dataset("both", store)
    assert open_dataset("both", store).metadata["frame_codec"] == FRAME_CODEC
    expected = np.concatenate([rows["obs"], atari_like_rows(episodes=2, length=20, seed=1)["obs"]])
    np.testing.assert_array_equal(np.sort(both.obs.reshape(len(both), -1), axis=0), np.sort(expected.reshape(len(expected), -1), axis=0))


def test_a_corrupt_frame_is_reported_in_one_line(store: Path, cli) -> None:
    """A damaged compressed block is reported by validate with its column and row (beside the
    shard's sha256), and `datasets validate` prints one line; a null next_obs at an episode's
    end (it would stand for the next episode's first frame) is reported too."""
    info = write_frames(store, "atari", atari_like_rows(episodes=2, length=10), fmt="arrow")
    shard = info.shard_paths[0]
    block = pa.ipc.open_file(str(shard)).read_all().column("obs")[5].as_py()
    content = bytearray(shard.read_bytes())
    at = content.find(block)
    content[at] = 0xFF  # the block's first token now claims literals it does not hold
    shard.write_bytes(bytes(content))
    problems = validate_dataset(info)
    assert any("does not match its recorded size/sha256" in problem for problem in problems)
    assert any(problem.startswith("steps/shard-00000.arrow obs frame at row 5 does not decode") for problem in problems), problems
    result = cli("datasets", "validate", "atari", "--store", store)
    assert result.code == 2 and len(result.err.strip().splitlines()) == 1
    with pytest.raises(RlpipeError, match="corrupted"):
        load_dataset("atari", store)

    info = write_frames(store, "ends", atari_like_rows(episodes=2, length=10), fmt="arrow")
    table = pa.ipc.open_file(str(info.shard_paths[0])).read_all()
    next_obs = table.column("next_obs").combine_chunks()
    nulled = pa.array([None if row == 9 else value for row, value in enumerate(next_obs.to_pylist())], pa.large_binary())
    table = table.set_column(table.schema.get_field_index("next_obs"), table.schema.field("next_obs"), nulled)
    with pa.OSFile(str(info.shard_paths[0]), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    assert any("null next_obs at row 9, the last row of its episode" in problem for problem in validate_dataset(info))


def test_an_unknown_frame_codec_makes_the_dataset_broken(store: Path) -> None:
    info = write_frames(store, "atari", atari_like_rows(episodes=1, length=5), fmt="arrow")
    metadata = dict(info.metadata, frame_codec="zstd")
    (info.path / "metadata.json").write_text(json.dumps(metadata))
    with pytest.raises(RlpipeError, match="'frame_codec' is 'zstd'"):
        open_dataset("atari", store)


def rehashed(info: DatasetInfo, table: pa.Table | None = None, **metadata_changes) -> DatasetInfo:
    """`info`'s dataset with its first shard replaced by `table` and/or metadata fields
    changed, sizes and hashes re-recorded: consistent to every hash, as a forger makes it."""
    meta = json.loads((info.path / "metadata.json").read_text())
    if table is not None:
        shard = info.shard_paths[0]
        with pa.OSFile(str(shard), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        meta["files"][info.shard_rels[0]] = {"sha256": sha256_file(shard), "bytes": shard.stat().st_size}
    meta.update(metadata_changes)
    (info.path / "metadata.json").write_text(json.dumps(meta))
    return open_dataset(info.name, info.path.parent)


def refused_everywhere(info: DatasetInfo, message: str) -> None:
    """validate names `message`; loading and both samplers refuse the dataset in one error."""
    problems = validate_dataset(info)
    assert any(message in problem for problem in problems), problems
    with pytest.raises(RlpipeError):
        load_dataset(info.name, info.path.parent)
    with pytest.raises(RlpipeError):
        MappedSampler(MappedTransitions(info, resident_bytes=0)).sample(4)


@pytest.mark.parametrize("kept_bytes", [1, 80, 84 * 84 // 2])
def test_a_short_but_valid_block_is_refused_not_padded_with_stray_memory(store: Path, kept_bytes: int) -> None:
    """A row's block replaced by a valid LZ4 block of fewer bytes than a frame, the shard
    re-hashed: the decoder's reported length refuses it (pyarrow's would return the frame's
    size with uninitialised memory after the block's bytes)."""
    info = write_frames(store, "short", atari_like_rows(episodes=2, length=10), fmt="arrow")
    table = pa.ipc.open_file(str(info.shard_paths[0])).read_all()
    blocks = table.column("obs").combine_chunks().to_pylist()
    blocks[3] = pa.Codec(FRAME_CODEC).compress(b"\x07" * kept_bytes, asbytes=True)
    table = table.set_column(table.schema.get_field_index("obs"), table.schema.field("obs"), pa.array(blocks, pa.large_binary()))
    refused_everywhere(rehashed(info, table), f"obs frame at row 3 does not decode (it holds {kept_bytes} bytes, not {84 * 84})")


@pytest.mark.parametrize("shape", [(84, 84, 2), (84, 84, 8), (42, 168, 1)])
def test_an_observation_space_edited_away_from_the_frames_is_refused(store: Path, shape: tuple[int, ...]) -> None:
    """metadata.json's observation space edited to another shape (larger: frames would be
    padded; the same size reshaped: every length check passes): the shards' recorded frame
    shape refuses it before a frame is decoded."""
    info = write_frames(store, "edited", atari_like_rows(episodes=2, length=10), fmt="arrow")
    assert json.loads(pa.ipc.open_file(str(info.shard_paths[0])).schema.field("obs").metadata[b"rlpipe.frame_shape"]) == [84, 84, 1]
    space = serialize_space(gym.spaces.Box(0, 255, shape, np.uint8))
    refused_everywhere(
        rehashed(info, observation_space=space), f"holds frames of shape [84, 84, 1], the dataset's observation space has {list(shape)}"
    )


@pytest.mark.parametrize(
    "field_metadata,message",
    [
        ({b"rlpipe.frame_codec": b"zstd", b"rlpipe.frame_shape": b"[84, 84, 1]"}, "column 'obs' names frame codec 'zstd', not 'lz4_raw'"),
        ({b"rlpipe.frame_shape": b"[84, 84, 1]"}, "column 'obs' names no frame codec"),
        ({b"rlpipe.frame_codec": b"lz4_raw", b"rlpipe.frame_shape": b"[" * 100_000 + b"]" * 100_000}, "records an unreadable frame shape"),
    ],
)
def test_a_shards_frame_field_naming_another_codec_or_an_unreadable_shape_is_refused(
    store: Path, field_metadata: dict[bytes, bytes], message: str
) -> None:
    """A re-hashed shard whose obs field names another codec (or none) is refused rather than
    decoded as LZ4; a recorded shape nested past Python's stack is unreadable, not a RecursionError."""
    info = write_frames(store, "relabelled", atari_like_rows(episodes=1, length=4), fmt="arrow")
    table = pa.ipc.open_file(str(info.shard_paths[0])).read_all()
    index = table.schema.get_field_index("obs")
    table = table.set_column(index, table.schema.field("obs").with_metadata(field_metadata), table.column("obs"))
    refused_everywhere(rehashed(info, table), message)
