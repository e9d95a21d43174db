"""The peers' own readers on rlpipe's exports: every column equal, byte for byte.

Four random-policy datasets (seed 0) are collected (`rlpipe.commands.collect.collect_dataset`,
as tests/test_exports.py does), exported with `rlpipe datasets export`, and read back by each
peer's own reader, in a virtualenv of its own (never rlpipe's .venv; each checks that it
cannot import rlpipe):

- parquet: Hugging Face `datasets`, `Dataset.from_parquet(...).flatten()` in numpy format
  (.bench-venvs/hf);
- d4rl: d3rlpy's `MDPDataset` built from the HDF5's arrays as d3rlpy's `get_d4rl` builds it
  (observations, actions, rewards, terminals, timeouts), its episodes concatenated
  (.bench-venvs/d3rlpy, bench/offline.py's);
- minari: `minari.load_dataset` on the export in `$MINARI_DATASETS_PATH`, its episodes
  concatenated (observations minus the last as obs, minus the first as next_obs; infos the
  same way) (.bench-venvs/minari);
- ogbench: OGBench's `ogbench.load_dataset` (its regular layout: next_observations, terminals
  ending trajectories) on the `--to ogbench` export, with the dtypes OGBench's own
  `make_env_and_datasets` passes (uint8 images, int32 discrete actions, else float32)
  (.bench-venvs/ogbench). The npz export (D4RL's arrays) has no reader of its own here: d3rlpy
  reads the same arrays from the HDF5.

The datasets: Pendulum-v1 (Box actions, truncations), CartPole-v1 (Discrete actions,
terminations), TinyFrames-v0 (8x8x3 uint8 frames, tests/image_env.py; a step can be both
terminated and truncated) and GoalWorld-v0 (Dict observations and an is_success info: Parquet
and Minari only, the D4RL arrays refuse Dicts). Each reader's columns are hashed in its
virtualenv (sha256 of each array's bytes, with dtype and shape); rlpipe's side hashes the same
columns from `rlpipe.datasets.loader.load_dataset` in the form the format documents
(rlpipe/datasets/exports.py): a column is equal when dtype, rows and bytes agree. LeRobot: rlpipe
has no LeRobot export, so only whether `lerobot` resolves for this Python is recorded
(`pip install --dry-run` in a scratch virtualenv).

    .venv/bin/python bench/format_readers.py                      # builds missing venvs, writes bench/results/format_readers.json
    .venv/bin/python bench/format_readers.py --skip-availability  # without LeRobot's dry run (~2 min of resolving)
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import _common  # noqa: F401  (sets thread limits before numpy/torch are imported)
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
VENVS = ROOT / ".bench-venvs"
RESULTS = ROOT / "bench" / "results" / "format_readers.json"

# reader -> its virtualenv, the distribution reporting its version, the pins it is built with
# (as the Makefile's format-readers target), what it reads and how.
READERS: dict[str, dict[str, Any]] = {
    "hf": {
        "venv": "hf",
        "dist": "datasets",
        "pins": ["datasets==5.2.0"],
        "format": "parquet",
        "call": "datasets.Dataset.from_parquet",
    },
    "d3rlpy": {"venv": "d3rlpy", "dist": "d3rlpy", "pins": None, "format": "d4rl", "call": "d3rlpy.dataset.MDPDataset"},
    "minari": {
        "venv": "minari",
        # minari's HDF5 storage imports PIL, which none of its extras declares
        "pins": ["minari[hdf5]==0.5.4", "pillow==13.0.0"],
        "dist": "minari",
        "format": "minari",
        "call": "minari.load_dataset",
    },
    "ogbench": {"venv": "ogbench", "dist": "ogbench", "pins": ["ogbench==1.2.2"], "format": "ogbench", "call": "ogbench.load_dataset"},
}
# the reader made for the format (a mismatch fails the bench); each reads its own layout now
OWN_LAYOUT = {"hf": True, "d3rlpy": True, "minari": True, "ogbench": True}
SUFFIX = {"parquet": "parquet", "d4rl": "hdf5", "ogbench": "npz"}

# name, env id, episodes; Dict observations go to the formats that carry them only
DATASETS = [
    ("pendulum", "Pendulum-v1", 10),
    ("cartpole", "CartPole-v1", 50),
    ("frames", "TinyFrames-v0", 50),
    ("goals", "GoalWorld-v0", 20),
]
DICT_FORMATS = ("parquet", "minari")

# What each format does not carry (rlpipe/datasets/exports.py's docstring; Minari's: minari_io/hdf5).
NOT_CARRIED = {
    "parquet": "the info/next_info columns",
    "d4rl": "episode ids, steps, spaces, env id, float64 precision, the truncation of a step that also terminated, "
    "the info columns; Dict observations refused",
    "ogbench": "for OGBench's loader, rewards and which trajectories terminated (the file's rewards and terminations are for "
    "rlpipe's import); episode ids, steps, spaces, env id, float64 precision, the info columns; Box observations only",
    "minari": "rlpipe's metadata.json beyond the spaces, env spec and producer's algorithm name "
    "(episode ids and steps come back as the episodes' ids and positions)",
}
LEROBOT_NOTE = "rlpipe has no LeRobot export"


# ---- both sides: columns and their digests ----------------------------------------------------


def leaves(name: str, value: Any) -> dict[str, np.ndarray]:
    """A column as named arrays: a Dict's keys as `name.key`, nested to any depth."""
    if isinstance(value, dict):
        out: dict[str, np.ndarray] = {}
        for key in value:
            out.update(leaves(f"{name}.{key}", value[key]))
        return out
    return {name: np.asarray(value)}


def digest(values: np.ndarray) -> dict[str, Any]:
    """sha256 of an array's bytes (C order), its dtype and shape."""
    return {
        "sha256": hashlib.sha256(np.ascontiguousarray(values).tobytes()).hexdigest(),
        "dtype": str(values.dtype),
        "shape": list(values.shape),
    }


# ---- the peer side: run inside the reader's own virtualenv, numpy and the reader only ---------


def read_hf(path: str) -> tuple[dict[str, np.ndarray], list[str]]:
    """Hugging Face `datasets` on the Parquet export: struct columns flattened (`obs.key`), numpy
    format. That format widens integer columns to int64, so each column is taken back to the
    dtype the dataset's features declare (checked lossless)."""
    import datasets

    dataset = datasets.Dataset.from_parquet(path, cache_dir=os.environ["HF_DATASETS_CACHE"]).flatten()
    table = dataset.with_format("numpy")[:]
    columns, notes = {}, []
    for name, values in table.items():
        feature = dataset.features[name]
        declared = np.dtype(feature.dtype if isinstance(feature, datasets.Value) else feature.feature.dtype)
        if values.dtype != declared:
            cast = values.astype(declared)
            if not np.array_equal(cast, values):
                raise SystemExit(f"{name}: values do not fit the declared {declared}")
            notes.append(f"{name}: numpy format {values.dtype}, features {declared}")
            values = cast
        columns[name] = values
    return columns, notes


def read_d3rlpy(path: str) -> tuple[dict[str, np.ndarray], list[str]]:
    """d3rlpy's MDPDataset from the D4RL-layout HDF5, as d3rlpy's `get_d4rl` builds one from
    D4RL's `get_dataset()` dict; its episodes concatenated, terminals and timeouts per row from
    each episode's `terminated`."""
    import d3rlpy
    import h5py

    with h5py.File(path, "r") as file:
        raw = {key: file[key][()] for key in file}  # D4RL's get_dataset reads every key whole
    discrete = raw["actions"].dtype.kind in "iu"
    space = d3rlpy.constants.ActionSpace.DISCRETE if discrete else d3rlpy.constants.ActionSpace.CONTINUOUS
    dataset = d3rlpy.dataset.MDPDataset(
        observations=raw["observations"],
        actions=raw["actions"],
        rewards=raw["rewards"],
        terminals=raw["terminals"],
        timeouts=raw["timeouts"],
        action_space=space,
    )
    ends = []
    for episode in dataset.episodes:
        last = np.zeros(len(episode.rewards), bool)
        last[-1] = True
        ends.append((last, bool(episode.terminated)))
    columns = {
        "observations": np.concatenate([episode.observations for episode in dataset.episodes]),
        "actions": np.concatenate([episode.actions for episode in dataset.episodes]),
        "rewards": np.concatenate([episode.rewards for episode in dataset.episodes]),
        "terminals": np.concatenate([last & terminated for last, terminated in ends]),
        "timeouts": np.concatenate([last & (not terminated) for last, terminated in ends]),
    }
    notes = [f"{len(dataset.episodes)} episodes, {dataset.transition_count} transitions (no next state past a timeout)"]
    return columns, notes


def read_minari(dataset_id: str) -> tuple[dict[str, np.ndarray], list[str]]:
    """minari.load_dataset's episodes concatenated: observations (steps + 1 each) give obs and
    next_obs, infos give info and next_info; episode ids and positions as int64."""
    import minari

    dataset = minari.load_dataset(dataset_id)
    parts: dict[str, list[np.ndarray]] = defaultdict(list)
    for episode in dataset.iterate_episodes():
        steps = len(episode.rewards)
        for prefix, value in (("obs", episode.observations), ("info", episode.infos or {})):
            if isinstance(value, dict) and not value:
                continue
            for name, values in leaves(prefix, value).items():
                parts[name].append(values[:-1])
                parts[f"next_{name}"].append(values[1:])
        parts["action"].append(episode.actions)
        parts["reward"].append(episode.rewards)
        parts["terminated"].append(episode.terminations)
        parts["truncated"].append(episode.truncations)
        parts["episode_id"].append(np.full(steps, episode.id, np.int64))
        parts["step"].append(np.arange(steps, dtype=np.int64))
    columns = {name: np.concatenate(values) for name, values in parts.items()}
    return columns, [f"{dataset.total_episodes} episodes, {dataset.total_steps} steps"]


def read_ogbench(path: str, ob_dtype: str, action_dtype: str) -> tuple[dict[str, np.ndarray], list[str]]:
    """OGBench's loader (regular layout: next_observations, terminals ending trajectories)."""
    import ogbench

    data = ogbench.load_dataset(path, ob_dtype=np.dtype(ob_dtype), action_dtype=np.dtype(action_dtype))
    return {name: np.asarray(values) for name, values in data.items()}, []


def peer_main(args: argparse.Namespace) -> None:
    """Read one export with one reader and print its columns' digests as one JSON line."""
    from importlib.metadata import version

    if importlib.util.find_spec("rlpipe") is not None:
        raise SystemExit(f"{sys.executable} can import rlpipe: the peer must read without it")
    reader = READERS[args.peer]
    start = time.perf_counter()
    if args.peer == "hf":
        columns, notes = read_hf(args.path)
    elif args.peer == "d3rlpy":
        columns, notes = read_d3rlpy(args.path)
    elif args.peer == "minari":
        columns, notes = read_minari(args.path)
    else:
        columns, notes = read_ogbench(args.path, args.ob_dtype, args.action_dtype)
    seconds = time.perf_counter() - start
    out = {
        "version": f"{reader['dist']} {version(reader['dist'])}",
        "python": sys.executable,
        "seconds": seconds,
        "notes": notes,
        "columns": {name: digest(values) for name, values in columns.items()},
    }
    print(json.dumps(out))


# ---- rlpipe's side ---------------------------------------------------------------------------


def venv_python(reader: str) -> Path:
    return VENVS / READERS[reader]["venv"] / "bin" / "python"


def ensure_venv(reader: str) -> str | None:
    """Build the reader's virtualenv if its package does not import there; None when ready,
    else why it could not be installed (pip's last line)."""
    python = venv_python(reader)
    module = READERS[reader]["call"].split(".")[0]
    if python.exists() and subprocess.run([str(python), "-c", f"import {module}"], capture_output=True).returncode == 0:
        return None
    try:
        if reader == "d3rlpy":
            from offline import ensure_peer_venv  # the d3rlpy virtualenv the other peer benches use

            ensure_peer_venv()
        else:
            print(f"creating {python.parent.parent} ({' '.join(READERS[reader]['pins'])}) ...", flush=True)
            subprocess.run(["python3", "-m", "venv", str(python.parent.parent)], check=True)
            pip = [str(python.parent / "pip"), "install", "-q", *READERS[reader]["pins"]]
            proc = subprocess.run(pip, capture_output=True, text=True, cwd=ROOT)
            if proc.returncode != 0:
                lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("WARNING")]
                return lines[-1] if lines else f"pip exited {proc.returncode}"
    except subprocess.CalledProcessError as exc:
        return str(exc)
    return None


def collect(store: Path, scale: float) -> dict[str, dict[str, Any]]:
    """The four random-policy datasets in `store`; what each holds."""
    sys.path.insert(0, str(ROOT))
    import tests.image_env  # noqa: F401  (registers TinyFrames-v0)
    from rlpipe.commands.collect import collect_dataset
    from rlpipe.datasets.loader import load_dataset

    described = {}
    for name, env_id, episodes in DATASETS:
        count = max(1, round(episodes * scale))
        collect_dataset(env_id, name=name, episodes=count, seed=0, fmt="arrow", store=store, progress=False)
        data = load_dataset(name, store)
        described[name] = {
            "env_id": env_id,
            "episodes": count,
            "transitions": len(data),
            "terminated": int(data.terminated.sum()),
            "truncated": int(data.truncated.sum()),
            "terminated_and_truncated": int((data.terminated & data.truncated).sum()),
        }
    return described


def expected_columns(reader: str, name: str, store: Path) -> tuple[dict[str, np.ndarray], list[str]]:
    """The columns `reader` should give, from rlpipe's own loader, in the format's documented form;
    and the peer's extra arguments."""
    from rlpipe.datasets.loader import load_dataset

    data = load_dataset(name, store)
    ends = np.r_[data.episode_id[1:] != data.episode_id[:-1], True]
    terminated, truncated = np.asarray(data.terminated, bool), np.asarray(data.truncated, bool)

    def f32(values: Any) -> np.ndarray:  # D4RL's arrays keep floats as float32
        values = np.asarray(values)
        return values.astype(np.float32) if values.dtype.kind == "f" else values

    if reader == "hf":
        columns = {}
        for field in ("episode_id", "step", "obs", "action", "reward", "next_obs", "terminated", "truncated"):
            columns.update(leaves(field, getattr(data, field)))
        return columns, []
    if reader == "d3rlpy":
        return {
            "observations": f32(data.obs),
            "actions": f32(data.action),
            "rewards": f32(data.reward),
            "terminals": terminated,
            "timeouts": truncated & ~terminated,
        }, []
    if reader == "minari":
        columns = {**leaves("obs", data.obs), **leaves("next_obs", data.next_obs)}
        columns.update(action=np.asarray(data.action), reward=np.asarray(data.reward), terminated=terminated, truncated=truncated)
        columns.update(episode_id=data.episode_id.astype(np.int64), step=data.step.astype(np.int64))
        for field in ("info", "next_info"):
            if getattr(data, field) is not None:
                columns.update(leaves(field, getattr(data, field)))
        return columns, []
    # OGBench: what its loader returns for a file in its own layout holding these transitions
    ob_dtype = np.uint8 if np.asarray(data.obs).dtype == np.uint8 else np.float32
    action_dtype = np.int32 if np.asarray(data.action).dtype.kind in "iu" else np.float32
    columns = {
        "observations": np.asarray(data.obs).astype(ob_dtype),
        "actions": np.asarray(data.action).astype(action_dtype),
        "next_observations": np.asarray(data.next_obs).astype(ob_dtype),
        "terminals": ends.astype(np.float32),
    }
    return columns, ["--ob-dtype", np.dtype(ob_dtype).name, "--action-dtype", np.dtype(action_dtype).name]


def export(name: str, fmt: str, tmp: Path, env: dict[str, str]) -> str:
    """`rlpipe datasets export` (rlpipe's CLI); returns what the reader opens."""
    store = tmp / "store"
    cmd = [str(ROOT / ".venv" / "bin" / "rlpipe"), "datasets", "export", name, "--to", fmt, "--store", str(store)]
    if fmt == "minari":
        target = f"rlpipe/{name}-v0"
    else:
        target = str(tmp / f"{name}.{SUFFIX[fmt]}")
        cmd += ["--out", target]
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    return target


def read(reader: str, target: str, extra: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run the reader in its virtualenv on `target`; its JSON line."""
    cmd = [str(venv_python(reader)), str(Path(__file__).resolve()), "--peer", reader, target, *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{reader} failed on {target} ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return json.loads(lines[-1])


def compare(ours: dict[str, np.ndarray], theirs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per column: equal when the reader has it with our dtype, row count and bytes."""
    result = {}
    for name, values in ours.items():
        mine, other = digest(values), theirs.get(name)
        equal = (
            other is not None and all(mine[key] == other[key] for key in ("sha256", "dtype")) and mine["shape"][:1] == other["shape"][:1]
        )
        result[name] = {"equal": equal, "rlpipe": mine, "reader": other}
    for name in theirs.keys() - ours.keys():
        result[name] = {"equal": False, "rlpipe": None, "reader": theirs[name]}
    return result


def grouped(names: list[str]) -> str:
    """Column names, a Dict's keys grouped: `obs (3 keys)`."""
    heads: dict[str, list[str]] = {}
    for name in names:
        heads.setdefault(name.split(".")[0], []).append(name)
    return ", ".join(group[0] if len(group) == 1 else f"{head} ({len(group)} keys)" for head, group in heads.items())


def lerobot_availability() -> dict[str, Any]:
    """Whether `lerobot` resolves for this Python: pip's dry run in a scratch virtualenv."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
        report = Path(tmp) / "report.json"
        cmd = [str(venv / "bin" / "pip"), "install", "--dry-run", "--quiet", "--report", str(report), "lerobot"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        python = subprocess.run([str(venv / "bin" / "python"), "--version"], capture_output=True, text=True).stdout.strip()
        out: dict[str, Any] = {"python": python, "seconds": round(time.perf_counter() - start, 1)}
        if proc.returncode != 0 or not report.exists():
            lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("WARNING")]
            return {**out, "installs": False, "why": lines[-1] if lines else f"pip exited {proc.returncode}"}
        installs = json.loads(report.read_text())["install"]
    by_name = {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in installs}
    return {
        **out,
        "installs": True,
        "version": by_name.get("lerobot"),
        "distributions": len(installs),
        "torch": by_name.get("torch"),
        "nvidia_packages": sum(name.startswith("nvidia") for name in by_name),
    }


def check_all(setup: dict[str, str | None], scale: float) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]], float]:
    """Collect, export and read every format x dataset whose reader is installed: what the
    datasets hold, one row per check, and the seconds collecting took."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
        env.update(MINARI_DATASETS_PATH=str(tmp / "minari"), HF_DATASETS_CACHE=str(tmp / "hf-cache"), HF_HUB_OFFLINE="1")
        start = time.perf_counter()
        described = collect(tmp / "store", scale)
        collect_seconds = time.perf_counter() - start
        for reader, spec in READERS.items():
            if setup[reader] is not None:
                continue
            for name, _env_id, _episodes in DATASETS:
                if name == "goals" and spec["format"] not in DICT_FORMATS:
                    continue
                start = time.perf_counter()
                target = export(name, spec["format"], tmp, env)
                export_seconds = time.perf_counter() - start
                ours, extra = expected_columns(reader, name, tmp / "store")
                start = time.perf_counter()
                theirs = read(reader, target, extra, env)
                read_seconds = time.perf_counter() - start
                columns = compare(ours, theirs["columns"])
                rows.append(
                    {
                        "format": spec["format"],
                        "dataset": name,
                        "reader": f"{theirs['version']} `{spec['call']}`",
                        "own_layout": OWN_LAYOUT[reader],
                        "columns": columns,
                        "all_equal": all(column["equal"] for column in columns.values()),
                        "not_carried": NOT_CARRIED[spec["format"]],
                        "reader_notes": theirs["notes"],
                        "export_seconds": round(export_seconds, 2),
                        "read_seconds": round(read_seconds, 2),
                        "reader_seconds": round(theirs["seconds"], 3),
                    }
                )
                print(f"{spec['format']:8} {name:9} {reader:7} equal={rows[-1]['all_equal']}", flush=True)
    return described, rows, collect_seconds


def render(rows: list[dict[str, Any]], setup: dict[str, str | None], lerobot: dict[str, Any] | None) -> str:
    """The Markdown table: a row per check, per reader that could not be installed, and LeRobot's."""
    from _common import table

    def equal_cell(row: dict[str, Any]) -> str:
        if row["all_equal"]:
            return "yes"
        differ = []
        for name, column in row["columns"].items():
            ours, theirs = column["rlpipe"], column["reader"]
            if column["equal"]:
                continue
            if ours is not None and theirs is not None and ours["shape"][:1] != theirs["shape"][:1]:
                name += f" ({theirs['shape'][0]} of {ours['shape'][0]} rows)"  # the reader's rows of ours
            differ.append(name)
        return "no: " + ", ".join(differ)

    cells = [
        [row["format"], row["dataset"], row["reader"], grouped(list(row["columns"])), equal_cell(row), row["not_carried"]] for row in rows
    ]
    for reader, why in setup.items():
        if why is not None:
            cells.append([READERS[reader]["format"], "all", f"`{READERS[reader]['call']}`", "-", "not installed", why])
    if lerobot is not None:
        if lerobot["installs"]:
            found = (
                f"lerobot {lerobot['version']} resolves for {lerobot['python']} ({lerobot['distributions']} distributions, "
                f"torch {lerobot['torch']}, {lerobot['nvidia_packages']} nvidia-* packages); not installed"
            )
        else:
            found = f"lerobot does not install for {lerobot['python']}: {lerobot['why']}"
        cells.append(["lerobot", "-", "`lerobot` (pip dry run)", "-", "n/a", f"{LEROBOT_NOTE}; {found}"])
    return table(["format", "dataset", "reader", "columns checked", "all equal", "does not carry"], cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", choices=sorted(READERS), help=argparse.SUPPRESS)  # internal: run as a reader
    parser.add_argument("path", nargs="?", help=argparse.SUPPRESS)
    parser.add_argument("--ob-dtype", default="float32", help=argparse.SUPPRESS)
    parser.add_argument("--action-dtype", default="float32", help=argparse.SUPPRESS)
    parser.add_argument("--scale", type=float, default=1.0, help="episodes per dataset, times this")
    parser.add_argument("--skip-availability", action="store_true", help="skip LeRobot's pip dry run")
    parser.add_argument("--json", type=Path, default=RESULTS, help="where the results go")
    args = parser.parse_args()
    if args.peer:
        peer_main(args)
        return
    from _common import machine_description, today

    started = time.perf_counter()
    setup = {reader: ensure_venv(reader) for reader in READERS}  # None: ready
    setup_seconds = time.perf_counter() - started
    described, rows, collect_seconds = check_all(setup, args.scale)
    lerobot = None if args.skip_availability else lerobot_availability()
    markdown = render(rows, setup, lerobot)
    results = {
        "date": today(),
        "machine": machine_description(),
        "command": "python bench/format_readers.py" + (f" --scale {args.scale}" if args.scale != 1.0 else ""),
        "datasets": described,
        "setup": {reader: why or "ready" for reader, why in setup.items()},
        "rows": rows,
        "lerobot": lerobot,
        "seconds": {
            "venvs": round(setup_seconds, 1),
            "collect": round(collect_seconds, 1),
            "total": round(time.perf_counter() - started, 1),
        },
        "table": markdown,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print()
    print(markdown)
    print(f"\nseconds: {results['seconds']}; results: {args.json}")
    failed = [f"{row['format']}/{row['dataset']}" for row in rows if row["own_layout"] and not row["all_equal"]]
    if failed:
        raise SystemExit(f"columns differ: {', '.join(failed)}")


if __name__ == "__main__":
    main()
