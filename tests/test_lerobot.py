"""LeRobotDataset v3 both ways: `rlpipe datasets export NAME --to lerobot --out DIR` writes
LeRobot's layout, `rlpipe datasets import DIR --from lerobot` reads it back (and a directory
made by hand in that layout), and every damaged input is one line, exit 2, nothing written.

What the format cannot carry: next observations (a LeRobot frame has none, so an import
derives them as for any table without them: the last transition of a truncated episode is
dropped, a terminated one keeps its own observation) and the original episode ids (episodes
are numbered 0..E-1). Everything else comes back equal, spaces and env id included.

With $RLPIPE_LEROBOT_PYTHON naming a Python that has `lerobot` installed (not rlpipe's
virtualenv: lerobot pins its own torch), the export is also loaded with
`lerobot.datasets.lerobot_dataset.LeRobotDataset` and compared frame by frame.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import math
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

import rlpipe.envs  # noqa: F401  (registers GoalWorld-v0)
import tests.image_env  # noqa: F401  (registers TinyFrames-v0)
from rlpipe.datasets import exports, imports
from rlpipe.datasets.imports import ZERO_REWARD
from rlpipe.datasets.loader import TransitionArrays, load_dataset
from rlpipe.datasets.store import open_dataset
from rlpipe.storage.files import sha256_file
from tests.test_exports import export_ok, fails, sources  # noqa: F401  (sources: the exports' random-policy store, a fixture)
from tests.test_imports import FIELDS, import_fails, import_ok, without_next_obs

INDEX_COLUMNS = ["timestamp", "frame_index", "episode_index", "index", "task_index"]


@pytest.mark.parametrize("name", ["pendulum", "cartpole", "frames"])
def test_an_export_imports_back_without_what_lerobot_cannot_carry(cli, sources: Path, store: Path, tmp_path: Path, name: str) -> None:
    out = export_ok(cli, sources, name, "lerobot", tmp_path / "out" / name)
    leftovers = [p.name for p in out.parent.iterdir() if p.name.startswith((".tmp-", ".trash-", ".rm-"))]
    assert leftovers == [], "the directory was built beside --out and renamed into place"
    back = import_ok(cli, store, out, "lerobot", name=name)
    data = load_dataset(name, sources)
    expected = without_next_obs(data)
    for field in FIELDS:
        theirs = np.asarray(getattr(back, field))
        assert np.array_equal(theirs, expected[field]), field
        assert theirs.dtype == np.asarray(getattr(data, field)).dtype, field
    ours, imported = open_dataset(name, sources), open_dataset(name, store)
    assert (imported.observation_space, imported.action_space, imported.env_id) == (ours.observation_space, ours.action_space, ours.env_id)
    episodes = len(data.episode_starts())
    assert len(back) == len(data) - (episodes if name == "pendulum" else 0)  # Pendulum's episodes are truncated: each lost its last row
    source = imported.metadata["producer"]["source"]
    assert source["format"] == "lerobot" and source["rows"] == len(data) and source["file"] == name
    assert source["columns"]["obs"] == ["observation.image" if name == "frames" else "observation.state"]
    assert cli("datasets", "validate", name, "--store", store).code == 0


def test_the_export_follows_lerobots_v3_layout(cli, sources: Path, store: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(exports, "LEROBOT_FILE_BYTES", 4096)  # an episode per data file ...
    monkeypatch.setattr(exports, "LEROBOT_CHUNK_FILES", 2)  # ... two files per chunk folder
    out = export_ok(cli, sources, "pendulum", "lerobot", tmp_path / "pendulum")
    data = load_dataset("pendulum", sources)
    obs, action = np.asarray(data.obs), np.asarray(data.action)
    info = json.loads((out / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == exports.LEROBOT_FPS
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"], info["splits"]) == (3, 600, 1, {"train": "0:3"})
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet" and info["video_path"] is None
    assert info["features"]["observation.state"] == {"dtype": "float32", "shape": [3], "names": None}
    assert info["features"]["action"] == {"dtype": "float32", "shape": [1], "names": None}
    assert list(info["features"]) == ["observation.state", "action", "next.reward", "next.done", "next.truncated", *INDEX_COLUMNS]
    files = sorted(str(p.relative_to(out)) for p in (out / "data").rglob("*.parquet"))
    assert files == ["data/chunk-000/file-000.parquet", "data/chunk-000/file-001.parquet", "data/chunk-001/file-000.parquet"]
    table = pa.concat_tables(pq.read_table(out / f) for f in files)
    assert table.schema.field("observation.state").type == pa.list_(pa.float32(), 3)
    assert table.schema.field("action").type == pa.float32() and table.schema.field("next.done").type == pa.bool_()
    assert np.array_equal(table.column("observation.state").combine_chunks().flatten().to_numpy().reshape(-1, 3), obs)
    assert np.array_equal(table.column("index").to_numpy(), np.arange(600))
    frame_index = table.column("frame_index").to_numpy()
    assert np.array_equal(frame_index, data.step) and np.array_equal(
        table.column("timestamp").to_numpy(), (frame_index / 30).astype(np.float32)
    )
    assert np.array_equal(table.column("next.truncated").to_numpy(), data.truncated)
    episodes = pq.read_table(out / "meta" / "episodes" / "chunk-000" / "file-000.parquet").to_pylist()
    assert [(e["episode_index"], e["length"], e["dataset_from_index"], e["dataset_to_index"]) for e in episodes] == [
        (0, 200, 0, 200),
        (1, 200, 200, 400),
        (2, 200, 400, 600),
    ]
    assert [(e["data/chunk_index"], e["data/file_index"], e["tasks"]) for e in episodes] == [
        (0, 0, ["Pendulum-v1"]),
        (0, 1, ["Pendulum-v1"]),
        (1, 0, ["Pendulum-v1"]),
    ]
    assert np.allclose(episodes[0]["stats/observation.state/mean"], obs[:200].mean(axis=0))
    tasks = pq.read_table(out / "meta" / "tasks.parquet")
    assert tasks.to_pylist() == [{"task_index": 0, "task": "Pendulum-v1"}]
    assert json.loads(tasks.schema.metadata[b"pandas"])["index_columns"] == ["task"]  # pandas reads `task` back as the index
    stats = json.loads((out / "meta" / "stats.json").read_text())
    state = stats["observation.state"]
    assert np.array_equal(state["min"], obs.min(axis=0)) and np.array_equal(state["max"], obs.max(axis=0)) and state["count"] == [600]
    assert np.allclose(state["mean"], obs.mean(axis=0)) and np.allclose(state["std"], obs.std(axis=0))
    assert np.allclose(stats["action"]["mean"], [action.mean()]) and set(stats) == set(info["features"])
    back, expected = import_ok(cli, store, out, "lerobot", "--format", "arrow"), without_next_obs(data)
    assert all(np.array_equal(np.asarray(getattr(back, field)), expected[field]) for field in FIELDS), "three files read as one table"


def test_the_export_of_images_and_discrete_actions(cli, sources: Path, tmp_path: Path) -> None:
    out = export_ok(cli, sources, "frames", "lerobot", tmp_path / "frames")
    data = load_dataset("frames", sources)
    features = json.loads((out / "meta" / "info.json").read_text())["features"]
    assert features["observation.image"] == {"dtype": "image", "shape": [8, 8, 3], "names": ["height", "width", "channels"]}
    assert features["action"] == {"dtype": "int64", "shape": [1], "names": None}
    table = pq.read_table(out / "data" / "chunk-000" / "file-000.parquet")
    assert table.schema.field("observation.image").type == pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    frames = [np.asarray(Image.open(io.BytesIO(row["bytes"]))) for row in table.column("observation.image").to_pylist()]
    assert np.array_equal(np.stack(frames), np.asarray(data.obs)), "PNG keeps the pixels"
    assert table.schema.field("action").type == pa.int64() and np.array_equal(table.column("action").to_numpy(), data.action)
    image = json.loads((out / "meta" / "stats.json").read_text())["observation.image"]
    assert np.asarray(image["mean"]).shape == (3, 1, 1)  # per channel in [0, 1], as LeRobot's
    assert np.allclose(np.asarray(image["mean"]).reshape(3), np.asarray(data.obs).reshape(-1, 3).mean(axis=0) / 255)


def test_export_refusals_are_one_line_and_leave_nothing(cli, sources: Path, tmp_path: Path) -> None:
    export = lambda *args: cli("datasets", "export", *args, "--store", sources)  # noqa: E731
    fails(export("goals", "--to", "lerobot", "--out", tmp_path / "g"), "has observations Dict(")
    fails(export("cartpole", "--to", "lerobot"), "--to lerobot writes a directory: give --out DIR")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    fails(export("cartpole", "--to", "lerobot", "--out", tmp_path / "mine"), "is not a LeRobot dataset; refusing to replace it")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "mine"
    out = export_ok(cli, sources, "cartpole", "lerobot", tmp_path / "c")
    fails(export("cartpole", "--to", "lerobot", "--out", out), "exists (use --force to replace it)")
    export_ok(cli, sources, "pendulum", "lerobot", out, "--force")
    assert json.loads((out / "meta" / "info.json").read_text())["total_frames"] == 600
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".tmp-", ".trash-", ".rm-"))]


# ---- a LeRobot dataset made by hand, as LeRobot 0.6.1 writes one ------------------------------------


def png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def frames_of(lengths: tuple[int, ...] = (3, 4)) -> dict[str, np.ndarray]:
    """Frames of episodes of `lengths`: 2-D states and actions, rewards, next.done on the first
    episode's last frame (it terminated; the second was cut short), 4 x 4 RGB images."""
    rng = np.random.default_rng(0)
    count = sum(lengths)
    frame_index = np.concatenate([np.arange(n) for n in lengths])
    done = np.zeros(count, bool)
    done[lengths[0] - 1] = True
    return {
        "observation.state": rng.normal(size=(count, 2)).astype(np.float32),
        "observation.image": rng.integers(0, 256, (count, 4, 4, 3), dtype=np.uint8),
        "action": rng.uniform(-1, 1, (count, 2)).astype(np.float32),
        "next.reward": rng.normal(size=count).astype(np.float32),
        "next.done": done,
        "timestamp": (frame_index / 10).astype(np.float32),
        "frame_index": frame_index,
        "episode_index": np.repeat(np.arange(len(lengths)), lengths),
        "index": np.arange(count),
        "task_index": np.zeros(count, np.int64),
    }


def write_v3(root: Path, frames: dict[str, np.ndarray], **info_changes) -> Path:
    """A LeRobotDataset v3 directory: meta/info.json (a camera stored as video among the
    features), stats.json, tasks.parquet, episodes, and one data file per episode."""
    vector = lambda dtype, size: {"dtype": dtype, "shape": [size], "names": [f"{i}" for i in range(size)]}  # noqa: E731
    scalar = lambda dtype: {"dtype": dtype, "shape": [1], "names": None}  # noqa: E731
    features = {
        "observation.state": vector("float32", 2),
        "observation.image": {"dtype": "image", "shape": [4, 4, 3], "names": ["height", "width", "channels"]},
        "observation.images.top": {"dtype": "video", "shape": [4, 4, 3], "names": ["height", "width", "channels"], "info": {}},
        "action": vector("float32", 2),
        "next.reward": scalar("float32"),
        "next.done": scalar("bool"),
        "timestamp": scalar("float32"),
        **{key: scalar("int64") for key in ("frame_index", "episode_index", "index", "task_index")},
    }
    features = {key: feature for key, feature in features.items() if key in frames or feature["dtype"] == "video"}
    episodes = np.unique(frames["episode_index"])
    info = {
        "codebase_version": "v3.0",
        "fps": 10,
        "features": features,
        "total_episodes": len(episodes),
        "total_frames": len(frames["index"]),
        "total_tasks": 1,
        "chunks_size": 1000,
        "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 200,
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
        "robot_type": None,
        "splits": {"train": f"0:{len(episodes)}"},
        **info_changes,
    }
    (root / "meta" / "episodes" / "chunk-000").mkdir(parents=True)
    (root / "data" / "chunk-000").mkdir(parents=True)
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=4))
    rows = []
    for number in episodes:
        part = {key: values[frames["episode_index"] == number] for key, values in frames.items()}
        columns: dict[str, pa.Array] = {}
        for key, values in part.items():
            if key == "observation.image":
                columns[key] = pa.array([{"bytes": png(p), "path": f"frame-{i:06d}.png"} for i, p in enumerate(values)])
            elif values.ndim == 2:
                columns[key] = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])
            else:
                columns[key] = pa.array(values)
        pq.write_table(pa.table(columns), root / "data" / "chunk-000" / f"file-{number:03d}.parquet")
        start = int(part["index"][0])
        rows.append(
            {
                "episode_index": int(number),
                "tasks": ["reach"],
                "length": len(part["index"]),
                "data/chunk_index": 0,
                "data/file_index": int(number),
                "dataset_from_index": start,
                "dataset_to_index": start + len(part["index"]),
                "meta/episodes/chunk_index": 0,
                "meta/episodes/file_index": 0,
            }
        )
    pq.write_table(pa.Table.from_pylist(rows), root / "meta" / "episodes" / "chunk-000" / "file-000.parquet")
    pq.write_table(pa.table({"task_index": [0], "task": ["reach"]}), root / "meta" / "tasks.parquet")
    stats = {key: {"min": [float(np.min(v))], "max": [float(np.max(v))]} for key, v in frames.items() if key != "observation.image"}
    (root / "meta" / "stats.json").write_text(json.dumps(stats))
    return root


STATE_ONLY = ("--ignore-columns", "observation.image,observation.images.top")  # the hand-made dataset's states only


def test_a_hand_made_v3_directory_imports(cli, store: Path, tmp_path: Path) -> None:
    frames = frames_of()
    root = write_v3(tmp_path / "reach", frames)
    back = import_ok(cli, store, root, "lerobot", *STATE_ONLY, "--format", "arrow")
    obs, action, reward = frames["observation.state"], frames["action"], frames["next.reward"]
    kept = np.array([0, 1, 2, 3, 4, 5])  # the second episode was cut short: its last frame has no next observation
    assert np.array_equal(back.obs, obs[kept]) and np.array_equal(back.action, action[kept]) and np.array_equal(back.reward, reward[kept])
    assert np.array_equal(back.next_obs, obs[[1, 2, 2, 4, 5, 6]])  # a terminated last frame keeps its own observation
    assert back.terminated.tolist() == [False, False, True, False, False, False]
    assert back.truncated.tolist() == [False, False, False, False, False, True]
    assert back.episode_id.tolist() == [0, 0, 0, 1, 1, 1] and back.step.tolist() == [0, 1, 2, 0, 1, 2]
    meta = open_dataset("imported", store).metadata
    assert json.loads(meta["action_space"])["type"] == "Box" and meta["env_id"] is None
    assert meta["producer"]["source"]["columns"]["reward"] == ["next.reward"]
    images = import_ok(
        cli,
        store,
        root,
        "lerobot",
        "--obs-column",
        "observation.image",
        "--ignore-columns",
        "observation.state,observation.images.top",
        name="images",
    )
    assert np.asarray(images.obs).dtype == np.uint8 and np.array_equal(images.obs, frames["observation.image"][kept])
    assert json.loads(open_dataset("images", store).metadata["observation_space"])["shape"] == [4, 4, 3]


def test_a_dataset_without_rewards_imports_them_as_zero(cli, store: Path, tmp_path: Path) -> None:
    frames = {key: values for key, values in frames_of().items() if key not in ("next.reward", "observation.image")}
    back = import_ok(cli, store, write_v3(tmp_path / "quiet", frames), "lerobot", "--ignore-columns", "observation.images.top")
    assert len(back) == 6 and not back.reward.any()
    assert open_dataset("imported", store).metadata["producer"]["source"]["columns"]["reward"] == [ZERO_REWARD]


def damage(root: Path, case: str) -> None:
    """Damage a hand-made dataset's files the way `case` says."""
    info_path = root / "meta" / "info.json"
    if case == "no_info":
        info_path.unlink()
        return
    info = json.loads(info_path.read_text())
    info["features"]["observation.state"]["shape"] = [3] if case == "shape" else [2]
    info["codebase_version"] = "v2.1" if case == "version" else "v3.0"
    info["total_frames"] = 8 if case == "total" else 7
    info_path.write_text(json.dumps(info))
    second = root / "data" / "chunk-000" / "file-001.parquet"  # the second episode's frames: rows 3 to 6
    table = pq.read_table(second)
    if case == "order":
        table = table.set_column(table.schema.get_field_index("frame_index"), "frame_index", pa.array([0, 2, 1, 3]))
    elif case == "early_done":
        table = table.set_column(table.schema.get_field_index("next.done"), "next.done", pa.array([False, True, False, False]))
    elif case == "columns":
        table = table.drop_columns(["next.reward"])
    elif case == "image":
        images = table.column("observation.image").to_pylist()
        images[2] = {"bytes": b"not a png", "path": "frame-000002.png"}
        table = table.set_column(table.schema.get_field_index("observation.image"), "observation.image", pa.array(images))
    pq.write_table(table, second)


@pytest.mark.parametrize(
    ("case", "args", "expected"),
    [
        ("no_info", STATE_ONLY, "reach: no meta/info.json (not a LeRobot dataset)"),
        ("version", STATE_ONLY, "reach: meta/info.json says codebase_version 'v2.1': rlpipe reads LeRobot's v3 layout"),
        ("video", ("--ignore-columns", "observation.image"), "reach: column 'observation.images.top' is not mapped to a role"),
        ("unmapped", ("--ignore-columns", "observation.images.top"), "reach: column 'observation.image' is not mapped to a role"),
        ("shape", STATE_ONLY, "reach: row 0, column 'observation.state': holds 2 values, but its recorded shape (3,) holds 3"),
        ("order", STATE_ONLY, "reach: row 4, column 'frame_index': step 2 follows step 0"),
        ("early_done", STATE_ONLY, "reach: row 4, column 'next.done': is set before the last row of its episode"),
        ("columns", STATE_ONLY, "reach/data/chunk-000/file-001.parquet: column 'next.reward' holds nothing"),
        ("total", STATE_ONLY, "reach: its data files hold 7 frames, meta/info.json says total_frames 8"),
        (
            "image",
            ("--obs-column", "observation.image", "--ignore-columns", "observation.state,observation.images.top"),
            "reach: row 5, column 'observation.image': holds an image that cannot be decoded",
        ),
    ],
)
def test_damaged_inputs_are_one_line(cli, store: Path, tmp_path: Path, case: str, args: tuple[str, ...], expected: str) -> None:
    root = write_v3(tmp_path / "reach", frames_of())
    damage(root, case)
    err = import_fails(cli, store, root, "lerobot", *args)  # one line, exit 2, nothing in the store
    assert f"error: {expected}" in err, err


def test_a_path_that_is_not_a_directory_is_one_line(cli, store: Path, tmp_path: Path) -> None:
    (tmp_path / "file.parquet").write_bytes(b"")
    assert "no such directory" in import_fails(cli, store, tmp_path / "file.parquet", "lerobot")
    (tmp_path / "empty" / "meta").mkdir(parents=True)
    (tmp_path / "empty" / "meta" / "info.json").write_text(json.dumps({"codebase_version": "v3.0", "features": {}, "total_frames": 0}))
    assert "empty: no data files" in import_fails(cli, store, tmp_path / "empty", "lerobot")


# ---- LeRobot's own reader (optional: $RLPIPE_LEROBOT_PYTHON) ----------------------------------------

READER = """
import sys
import numpy as np
import torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset

root, arrays = sys.argv[1], np.load(sys.argv[2])
dataset = LeRobotDataset("rlpipe/export", root=root)
frames = [dataset[i] for i in range(len(dataset))]
key = "observation.image" if "observation.image" in dataset.meta.features else "observation.state"
obs = torch.stack([frame[key] for frame in frames]).numpy()
if key == "observation.image":  # LeRobot gives images as float (C, H, W) in [0, 1]
    obs = np.rint(obs.transpose(0, 2, 3, 1) * 255).astype(np.uint8)
action = torch.stack([frame["action"] for frame in frames]).numpy().reshape(arrays["action"].shape)
assert dataset.num_episodes == len(np.unique(arrays["episode_id"])) and len(dataset) == len(arrays["action"])
assert obs.dtype == arrays["obs"].dtype and np.array_equal(obs, arrays["obs"]), "observations differ"
assert action.dtype == arrays["action"].dtype and np.array_equal(action, arrays["action"]), "actions differ"
for column, ours in (("next.reward", "reward"), ("next.done", "terminated"), ("next.truncated", "truncated")):
    assert np.array_equal(torch.stack([frame[column] for frame in frames]).numpy(), arrays[ours]), column
print("lerobot read", len(dataset), "frames equal")
"""


@pytest.mark.skipif(not os.environ.get("RLPIPE_LEROBOT_PYTHON"), reason="set RLPIPE_LEROBOT_PYTHON to a Python with lerobot installed")
@pytest.mark.parametrize("name", ["pendulum", "cartpole", "frames"])
def test_lerobots_reader_loads_the_export(cli, sources: Path, tmp_path: Path, name: str) -> None:
    out = export_ok(cli, sources, name, "lerobot", tmp_path / name)
    data: TransitionArrays = load_dataset(name, sources)
    arrays = {field: np.asarray(getattr(data, field)) for field in ("obs", "action", "reward", "terminated", "truncated", "episode_id")}
    np.savez(tmp_path / "ours.npz", **arrays)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_LEROBOT_HOME": str(tmp_path / "home")}  # nothing downloaded
    result = subprocess.run(
        [os.environ["RLPIPE_LEROBOT_PYTHON"], "-c", READER, out, tmp_path / "ours.npz"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"lerobot read {len(data)} frames equal" in result.stdout


# ---- video features, decoded with PyAV (the rlpipe[lerobot] extra) ----------------------------------

needs_pyav = pytest.mark.skipif(
    importlib.util.find_spec("av") is None, reason="PyAV is not installed (pip install 'rlpipe[lerobot]'; make install does)"
)
VIDEO = "observation.images.top"
VIDEO_OBS = ("--obs-column", VIDEO, "--ignore-columns", "observation.state")
# LeRobot 0.6's encoding defaults (encode_video_frames): AV1 by SVT-AV1, 4:2:0, a keyframe every 2 frames, CRF 30.
LEROBOT_DEFAULT = ("libsvtav1", "yuv420p", {"g": "2", "crf": "30"})
LOSSLESS = ("libx264rgb", "rgb24", {"qp": "0"})  # H.264 on RGB planes at QP 0: lossless, still an .mp4
LOSSY_PSNR_BOUND = 33.0  # dB; LEROBOT_DEFAULT measured 36.8 dB on moving_pattern()'s frames (docs/datasets.md)


def moving_pattern(count: int, size: int = 16) -> np.ndarray:
    """`count` RGB frames of smooth gradients drifting from frame to frame (a camera's content
    more than noise, which no lossy codec keeps)."""
    y, x = np.mgrid[0:size, 0:size]
    return np.stack(
        [np.stack([(x * 8 + t * 5) % 256, (y * 12 + t * 3) % 256, ((x + y) * 6 + t) % 256], axis=-1) for t in range(count)]
    ).astype(np.uint8)


def encode(path: Path, pixels: np.ndarray, pts: list[int], codec: tuple[str, str, dict[str, str]], fps: int = 10) -> None:
    """An .mp4 of `pixels` (frames of rgb24) at presentation times pts / fps, as LeRobot encodes them (PyAV)."""
    import av

    name, pix_fmt, options = codec
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as out:
        stream = out.add_stream(name, rate=fps, options=options)
        stream.pix_fmt, stream.width, stream.height = pix_fmt, pixels.shape[2], pixels.shape[1]
        for time, image in zip(pts, pixels):
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts, frame.time_base = time, Fraction(1, fps)
            out.mux(stream.encode(frame))
        out.mux(stream.encode())


def write_video_v3(root: Path, codec=LEROBOT_DEFAULT, layout: str = "shared", drop: tuple[int, int] | None = None) -> tuple[Path, dict]:
    """The hand-made dataset (two episodes of 10 frames at 10 fps) with its camera as video:
    16 x 16 frames in videos/observation.images.top/chunk-000/file-NNN.mp4, one file for both
    episodes (`shared`, as LeRobot concatenates them), one per episode (`per_episode`) or both in
    one file in the other order (`reversed`); `drop` (episode, frame) leaves one frame out of the
    video. Returns the root and the frames, the camera's under VIDEO."""
    lengths, fps = (10, 10), 10
    frames = {key: values for key, values in frames_of(lengths).items() if key != "observation.image"}
    write_v3(root, frames)
    info = json.loads((root / "meta" / "info.json").read_text())
    info["features"][VIDEO]["shape"] = [16, 16, 3]
    info["features"][VIDEO]["info"] = {"video.fps": fps, "video.codec": codec[0], "video.pix_fmt": codec[1], "has_audio": False}
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=4))
    pixels = moving_pattern(sum(lengths))
    starts = [0, lengths[0]]
    order = {"shared": [0, 1], "per_episode": [0, 1], "reversed": [1, 0]}[layout]
    placed: dict[int, list[int]] = {}  # file index -> its episodes in order
    for episode in order:
        placed.setdefault(episode if layout == "per_episode" else 0, []).append(episode)
    spans = {}
    for file, episodes in placed.items():
        images, pts, clock = [], [], 0
        for episode in episodes:
            spans[episode] = (file, clock / fps, (clock + lengths[episode]) / fps)
            for frame in range(lengths[episode]):
                if (episode, frame) != drop:
                    images.append(pixels[starts[episode] + frame])
                    pts.append(clock + frame)
            clock += lengths[episode]
        encode(root / "videos" / VIDEO / "chunk-000" / f"file-{file:03d}.mp4", np.stack(images), pts, codec, fps)
    meta = root / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
    rows = pq.read_table(meta).to_pylist()
    for row in rows:
        file, start, stop = spans[row["episode_index"]]
        row.update({f"videos/{VIDEO}/chunk_index": 0, f"videos/{VIDEO}/file_index": file})
        row.update({f"videos/{VIDEO}/from_timestamp": start, f"videos/{VIDEO}/to_timestamp": stop})
    pq.write_table(pa.Table.from_pylist(rows), meta)
    return root, {**frames, VIDEO: pixels}


def psnr(decoded: np.ndarray, original: np.ndarray) -> float:
    mse = float(np.mean((decoded.astype(np.float64) - original.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255**2 / mse)


VIDEO_KEPT = np.r_[0:10, 10:19]  # the first episode terminated (all its frames), the second was cut short (its last frame has no next)


def assert_all_but_frames_equal(back: TransitionArrays, frames: dict) -> None:
    """Everything but the decoded frames equals the source exactly."""
    assert np.array_equal(back.action, frames["action"][VIDEO_KEPT]) and np.array_equal(back.reward, frames["next.reward"][VIDEO_KEPT])
    assert back.episode_id.tolist() == [0] * 10 + [1] * 9 and back.step.tolist() == [*range(10), *range(9)]
    assert np.flatnonzero(back.terminated).tolist() == [9] and np.flatnonzero(back.truncated).tolist() == [18]


@needs_pyav
def test_a_video_feature_is_decoded_within_a_stated_psnr(cli, store: Path, tmp_path: Path) -> None:
    codec = LEROBOT_DEFAULT
    if codec[0] not in importlib.import_module("av").codecs_available:
        pytest.skip(f"this PyAV build cannot encode {codec[0]}")
    root, frames = write_video_v3(tmp_path / "camera", codec)
    back = import_ok(cli, store, root, "lerobot", *VIDEO_OBS)
    obs = np.asarray(back.obs)
    assert obs.dtype == np.uint8 and obs.shape == (19, 16, 16, 3)
    measured = psnr(obs, frames[VIDEO][VIDEO_KEPT])
    assert LOSSY_PSNR_BOUND < measured < math.inf, measured  # lossy: close to the camera's frames, not equal
    assert np.array_equal(back.next_obs[:-1][~back.terminated[:-1]], obs[1:][~back.terminated[:-1]]), "next frames are the next rows'"
    assert_all_but_frames_equal(back, frames)
    meta = open_dataset("imported", store).metadata
    assert json.loads(meta["observation_space"])["shape"] == [16, 16, 3]
    assert meta["producer"]["source"]["columns"]["obs"] == [VIDEO]


@needs_pyav
@pytest.mark.parametrize("layout", ["shared", "per_episode", "reversed"])
def test_a_lossless_video_imports_every_frame_exactly(cli, store: Path, tmp_path: Path, monkeypatch, layout: str) -> None:
    monkeypatch.setattr(imports, "FRAME_BATCH_BYTES", 3 * 16 * 16 * 3)  # batches of 3 rows: episodes and the decoding span batches
    root, frames = write_video_v3(tmp_path / "camera", LOSSLESS, layout)
    back = import_ok(cli, store, root, "lerobot", *VIDEO_OBS)
    assert np.array_equal(back.obs, frames[VIDEO][VIDEO_KEPT]), "QP 0 on RGB planes loses nothing"
    assert_all_but_frames_equal(back, frames)
    source = open_dataset("imported", store).metadata["producer"]["source"]
    lines = "".join(
        f"{sha256_file(root / name)}  {name}\n"
        for name in [
            "meta/info.json",
            "data/chunk-000/file-000.parquet",
            "data/chunk-000/file-001.parquet",
            "meta/episodes/chunk-000/file-000.parquet",
        ]
        + sorted(str(p.relative_to(root)) for p in (root / "videos").rglob("*.mp4"))
    )
    assert source["sha256"] == hashlib.sha256(lines.encode()).hexdigest(), "the video files are part of the source's digest"


def test_a_video_left_out_needs_no_pyav(cli, store: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "av", None)  # import av fails
    root = write_v3(tmp_path / "reach", frames_of())
    err = import_fails(
        cli, store, root, "lerobot", "--obs-column", "observation.images.top", "--ignore-columns", "observation.state,observation.image"
    )
    assert "error: reach: feature 'observation.images.top' is a video: decoding it needs PyAV (pip install 'rlpipe[lerobot]')" in err
    assert len(import_ok(cli, store, root, "lerobot", *STATE_ONLY)) == 6


def damage_video(root: Path, case: str) -> None:
    if case == "no_file":
        (root / "videos" / VIDEO / "chunk-000" / "file-001.mp4").unlink()
    elif case == "shape":
        info = json.loads((root / "meta" / "info.json").read_text())
        info["features"][VIDEO]["shape"] = [16, 8, 3]
        (root / "meta" / "info.json").write_text(json.dumps(info))
    elif case == "past_end":
        meta = root / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
        table = pq.read_table(meta)
        table = table.set_column(
            table.schema.get_field_index(f"videos/{VIDEO}/to_timestamp"), f"videos/{VIDEO}/to_timestamp", pa.array([1.0, 0.5])
        )
        pq.write_table(table, meta)
    elif case == "no_column":
        meta = root / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
        pq.write_table(pq.read_table(meta).drop_columns([f"videos/{VIDEO}/from_timestamp"]), meta)
    elif case == "not_video":
        (root / "videos" / VIDEO / "chunk-000" / "file-000.mp4").write_bytes(b"not an mp4")


@needs_pyav
@pytest.mark.parametrize(
    ("case", "expected"),
    [
        (
            "no_file",
            "camera/videos/observation.images.top/chunk-000/file-001.mp4: no such file (episode 1's video of feature 'observation.images.top')",
        ),
        (
            "missing_frame",
            "camera/videos/observation.images.top/chunk-000/file-001.mp4: episode 1, frame 4 (row 14): no video frame at 0.400000 s "
            "(the nearest is at 0.500000 s; LeRobot's tolerance is 0.0001 s)",
        ),
        (
            "shape",
            "camera/videos/observation.images.top/chunk-000/file-000.mp4: episode 0, frame 0 (row 0): a decoded frame of shape (16, 16, 3), "
            "but meta/info.json says (16, 8, 3)",
        ),
        ("past_end", "camera/videos/observation.images.top/chunk-000/file-001.mp4: episode 1, frame 6 (row 16): timestamp 0.6 s is past"),
        ("no_column", "camera/meta/episodes/chunk-000/file-000.parquet: no column 'videos/observation.images.top/from_timestamp'"),
        ("not_video", "camera/videos/observation.images.top/chunk-000/file-000.mp4: cannot read it as a video"),
    ],
)
def test_damaged_videos_are_one_line(cli, store: Path, tmp_path: Path, case: str, expected: str) -> None:
    root, _ = write_video_v3(tmp_path / "camera", LOSSLESS, "per_episode", drop=(1, 4) if case == "missing_frame" else None)
    damage_video(root, case)
    err = import_fails(cli, store, root, "lerobot", *VIDEO_OBS)  # one line, exit 2, nothing in the store
    assert f"error: {expected}" in err, err
