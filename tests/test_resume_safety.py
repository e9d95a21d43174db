"""Reading a run's resume state never runs code and refuses bad files with one line.

A saved SAC state (``.resume-run``: resume.safetensors + resume.json) is altered the way an
attacker or a broken disk would alter it. `rlpipe train sac --resume RUN` and a fresh run of
the same config in the same directory (which reads the state to resume it) must either
resume validly, or print one line, exit 2 and write nothing; a pickle planted anywhere a
state is read must never be unpickled. The fuzz test is derandomized (failures reproduce).
"""

from __future__ import annotations

import itertools
import json
import pickle
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import save_file

from rlpipe.cli.main import main
from rlpipe.training import resume
from rlpipe.training.resume import INFO_FILE, LEGACY_STATE_FILE, STATE_FILE, resume_dir

ARGS = [
    "sac",
    "--env",
    "Pendulum-v1",
    "--env-steps",
    "300",
    "--num-envs",
    "1",
    "--set",
    "learning_starts=100",
    "--set",
    "batch_size=32",
    "--set",
    "hidden=[32, 32]",
    "--set",
    "eval_every=300",
    "--set",
    "eval_episodes=1",
    "--device",
    "cpu",
    "--no-progress",
    "--checkpoint-every",
    "100",
]


class _Stop(Exception):
    """Ends the run that writes the saved state, as a kill would, once 200 steps are saved."""


class Payload:
    """Unpickling this creates ``marker``: the proof that a file was unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[str, str]]:
        return open, (str(self.marker), "w")


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SAC run on Pendulum stopped after saving its state at 200 of 300 steps (sub-env, replay
    buffer, optimisers, RNGs); the returned directory holds ``.resume-run``."""
    root = tmp_path_factory.mktemp("saved")
    save = resume.Checkpointer.maybe_save

    def save_then_stop(self: resume.Checkpointer, done: int, loop: Any) -> None:
        save(self, done, loop)
        if done >= 200:
            raise _Stop

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(resume.Checkpointer, "maybe_save", save_then_stop)
        mp.setattr(sys, "argv", ["rlpipe", "train", *ARGS, "--out", str(root / "run")])
        with pytest.raises(_Stop):
            main()
    assert (resume_dir(root / "run") / STATE_FILE).is_file() and not (root / "run").exists()
    return root


@pytest.fixture
def run_dir(saved: Path, tmp_path: Path) -> Path:
    """A fresh copy of the saved state; returns the run directory it belongs to (not yet there)."""
    shutil.copytree(resume_dir(saved / "run"), resume_dir(tmp_path / "run"))
    return tmp_path / "run"


def _bookkeeping(name: str) -> bool:
    """A lock or root marker that a run directory's parent may hold (rlpipe.storage.atomic)."""
    return name in (".locks", ".rlpipe-root") or name.startswith(".rlpipe-lock-")


def _snapshot(parent: Path) -> dict[str, bytes]:
    """Every file under ``parent`` but the locks and markers every run directory's parent has."""
    files = (p for p in sorted(parent.rglob("*")) if p.is_file() and not _bookkeeping(p.relative_to(parent).parts[0]))
    return {str(p.relative_to(parent)): p.read_bytes() for p in files}


def _refused(cli, args: list[str], parent: Path) -> str:
    """Run ``rlpipe train ARGS``; assert one line on stderr, exit 2 and no file written or changed."""
    before = _snapshot(parent)
    res = cli("train", *args)
    assert res.code == 2, res.err[-2000:]
    assert len(res.err.strip().splitlines()) == 1 and res.err.startswith("error: "), res.err
    assert _snapshot(parent) == before
    assert {p.name for p in parent.iterdir() if not _bookkeeping(p.name)} == {name.split("/")[0] for name in before}, "a stray entry"
    return res.err


def _resumed(cli, args: list[str], run: Path) -> None:
    res = cli("train", *args)
    assert res.code == 0, res.err[-3000:]
    assert (run / "metrics.json").is_file() and not resume_dir(run).exists()


def _rewrite(path: Path, edit: Callable[[Any, dict[str, torch.Tensor]], Any]) -> None:
    """Rewrite the state file with ``edit(state_json, tensors)`` applied and its sha256 recomputed
    (what a deliberate forgery does: only the content's own checks are left)."""
    with safe_open(path, framework="pt") as f:
        header = f.metadata()
        tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118  (safe_open is not iterable)
    header["state"] = json.dumps(edit(json.loads(header["state"]), tensors))
    header["sha256"] = resume._digest(header, tensors)
    save_file(tensors, str(path), metadata=header)


def _items(node: dict) -> dict:
    return dict(node["items"])


def _set_item(node: dict, key: str, value: Any) -> None:
    node["items"] = [[k, value if k == key else v] for k, v in node["items"]]


def _payload_bytes(marker: Path) -> bytes:
    return pickle.dumps(Payload(marker))


def test_the_payload_runs_when_unpickled(tmp_path: Path) -> None:
    """Control: the planted bytes do run code when unpickled (as torch.load(weights_only=False) did)."""
    marker = tmp_path / "ran"
    pickle.loads(_payload_bytes(marker))
    assert marker.exists()


def test_an_untouched_state_resumes_without_unpickling(run_dir: Path, cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """Control: the copy the other tests alter is a valid state; resuming it calls no unpickler."""

    def no_unpickling(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("resuming must not unpickle")

    for module, name in [(pickle, "load"), (pickle, "loads"), (pickle, "Unpickler"), (torch, "load")]:
        monkeypatch.setattr(module, name, no_unpickling)
    _resumed(cli, ["sac", "--resume", str(run_dir), "--no-progress"], run_dir)


@pytest.mark.parametrize("how", ["resume", "fresh"])
def test_a_pickled_state_file_is_never_unpickled(how: str, run_dir: Path, cli) -> None:
    marker = run_dir.parent / "ran"
    (resume_dir(run_dir) / STATE_FILE).write_bytes(_payload_bytes(marker))
    args = ["sac", "--resume", str(run_dir), "--no-progress"] if how == "resume" else [*ARGS, "--out", str(run_dir)]
    err = _refused(cli, args, run_dir.parent)
    assert "is not a readable resume state" in err and not marker.exists()


@pytest.mark.parametrize("how", ["resume", "fresh"])
def test_a_legacy_pickle_is_never_loaded(how: str, run_dir: Path, cli) -> None:
    """A ``resume.pt`` (the old pickle format) beside a valid state is ignored."""
    marker = run_dir.parent / "ran"
    (resume_dir(run_dir) / LEGACY_STATE_FILE).write_bytes(_payload_bytes(marker))
    args = ["sac", "--resume", str(run_dir), "--no-progress"] if how == "resume" else [*ARGS, "--out", str(run_dir)]
    _resumed(cli, args, run_dir)
    assert not marker.exists()


def test_resume_with_only_a_legacy_pickle_is_refused(run_dir: Path, cli) -> None:
    marker = run_dir.parent / "ran"
    (resume_dir(run_dir) / STATE_FILE).unlink()
    (resume_dir(run_dir) / LEGACY_STATE_FILE).write_bytes(_payload_bytes(marker))
    err = _refused(cli, ["sac", "--resume", str(run_dir), "--no-progress"], run_dir.parent)
    assert "never loaded" in err and not marker.exists()


@pytest.mark.parametrize("how", ["resume", "fresh"])
def test_a_pickled_resume_json_is_never_unpickled(how: str, run_dir: Path, cli) -> None:
    """``--resume`` refuses it; a fresh run does not read it (the state holds its config) and resumes."""
    marker = run_dir.parent / "ran"
    (resume_dir(run_dir) / INFO_FILE).write_bytes(_payload_bytes(marker))
    if how == "resume":
        assert "is not valid JSON" in _refused(cli, ["sac", "--resume", str(run_dir), "--no-progress"], run_dir.parent)
    else:
        _resumed(cli, [*ARGS, "--out", str(run_dir)], run_dir)
    assert not marker.exists()


def test_a_fresh_offline_run_never_unpickles_the_state(tmp_path: Path, cli) -> None:
    """The reported case: `train bc ... --checkpoint-every 25 --out RUN` beside a planted state."""
    from rlpipe.commands.collect import collect_dataset

    store, run = tmp_path / "store", tmp_path / "runs" / "run"
    collect_dataset("CartPole-v1", episodes=2, num_envs=1, name="cp", store=store, fmt="arrow", progress=False)
    marker = tmp_path / "ran"
    resume_dir(run).mkdir(parents=True)
    for name in (STATE_FILE, LEGACY_STATE_FILE, INFO_FILE):
        (resume_dir(run) / name).write_bytes(_payload_bytes(marker))
    args = [
        "bc",
        "--dataset",
        "cp",
        "--store",
        str(store),
        "--updates",
        "50",
        "--checkpoint-every",
        "25",
        "--no-progress",
        "--device",
        "cpu",
        "--out",
        str(run),
    ]
    assert "is not a readable resume state" in _refused(cli, args, run.parent)
    (resume_dir(run) / STATE_FILE).unlink()  # the old pickle alone: never read, the run starts afresh
    _resumed(cli, args, run)
    assert not marker.exists()


def _plant_in_stepper(marker: Path, where: str) -> Callable[[Any, dict[str, torch.Tensor]], Any]:
    """An edit that puts the pickle in the saved env stepper: as the env state (a tensor of its
    bytes), as a string, or as the stepper's observation array."""

    def edit(state: Any, tensors: dict[str, torch.Tensor]) -> Any:
        tensors["payload"] = torch.frombuffer(bytearray(_payload_bytes(marker)), dtype=torch.uint8)
        objects = _items(state)["objects"]
        stepper = _items(objects)["stepper"]
        if where == "envs":
            _set_item(stepper, "envs", {"tensor": "payload"})
        elif where == "obs":
            _set_item(stepper, "obs", {"array": "payload"})
        else:
            _set_item(objects, "stepper", _payload_bytes(marker).decode("latin-1"))
        return state

    return edit


@pytest.mark.parametrize("where", ["envs", "obs", "string"])
@pytest.mark.parametrize("how", ["resume", "fresh"])
def test_a_pickle_in_the_stepper_state_is_never_unpickled(how: str, where: str, run_dir: Path, cli) -> None:
    marker = run_dir.parent / "ran"
    _rewrite(resume_dir(run_dir) / STATE_FILE, _plant_in_stepper(marker, where))
    args = ["sac", "--resume", str(run_dir), "--no-progress"] if how == "resume" else [*ARGS, "--out", str(run_dir)]
    err = _refused(cli, args, run_dir.parent)
    assert "does not fit" in err and not marker.exists()


def test_a_forged_env_state_builds_no_objects(run_dir: Path, cli) -> None:
    """A record claiming an attribute holds an object (a sub-env, a generator) where the live env
    holds plain data is refused: values go only where the same kind of content is."""

    def edit(state: Any, tensors: dict[str, torch.Tensor]) -> Any:
        stepper = _items(_items(state)["objects"])["stepper"]
        envs = _items(stepper)["envs"]  # ("object", {attribute: record}) of the vector env
        attributes = envs["tuple"][1]
        _set_item(attributes, "num_envs", {"tuple": ["object", {"items": [["__class__", {"tuple": ["value", "os"]}]]}]})
        return state

    _rewrite(resume_dir(run_dir) / STATE_FILE, edit)
    err = _refused(cli, ["sac", "--resume", str(run_dir), "--no-progress"], run_dir.parent)
    assert "does not fit this env" in err and "num_envs" in err


@pytest.mark.parametrize("damage", ["truncated", "garbage", "flipped"])
@pytest.mark.parametrize("how", ["resume", "fresh"])
def test_a_damaged_state_file_is_refused(damage: str, how: str, run_dir: Path, cli) -> None:
    path = resume_dir(run_dir) / STATE_FILE
    data = bytearray(path.read_bytes())
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "garbage":
        data = bytearray(b"\x00garbage" * 10)
    else:
        data[-5] ^= 0x01  # a tensor's byte: caught by the sha256 only
    path.write_bytes(bytes(data))
    args = ["sac", "--resume", str(run_dir), "--no-progress"] if how == "resume" else [*ARGS, "--out", str(run_dir)]
    err = _refused(cli, args, run_dir.parent)
    assert str(path) in err


def _info_edit(edit: Callable[[dict], Any]) -> Callable[[Path], str]:
    """Text for resume.json: ``edit`` applied to the saved record."""

    def text(path: Path) -> str:
        info = json.loads(path.read_text())
        return json.dumps(edit(info))

    return text


@pytest.mark.parametrize(
    "info, message",
    [
        (lambda path: "{not json", "is not valid JSON"),
        (_info_edit(lambda info: {"config": info["config"]}), "is not a resume record"),
        (_info_edit(lambda info: {**info, "config": []}), "is not a resume record"),
        (_info_edit(lambda info: {"algo": info["algo"]}), "is not a resume record"),
        (lambda path: "[]", "is not a resume record"),
        (_info_edit(lambda info: {**info, "algo": "nosuch"}), "is a nosuch run, not sac"),
        (_info_edit(lambda info: {**info, "config": {**info["config"], "seed": 1}}), "name different configs"),
    ],
    ids=["invalid-json", "no-algo", "config-list", "no-config", "not-an-object", "unknown-algo", "other-config"],
)
def test_a_bad_resume_json_is_refused(info: Callable[[Path], str], message: str, run_dir: Path, cli) -> None:
    path = resume_dir(run_dir) / INFO_FILE
    path.write_text(info(path))
    assert message in _refused(cli, ["sac", "--resume", str(run_dir), "--no-progress"], run_dir.parent)


def test_an_unknown_algorithm_is_refused(run_dir: Path, cli) -> None:
    assert "nosuch" in _refused(cli, ["nosuch", "--resume", str(run_dir), "--no-progress"], run_dir.parent)


def test_resume_without_a_state_is_refused(tmp_path: Path, cli) -> None:
    assert "holds no resumable state" in _refused(cli, ["sac", "--resume", str(tmp_path / "run")], tmp_path)


_EXAMPLES = itertools.count()
FUZZ = settings(
    max_examples=25,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _mutate(data: st.DataObject, raw: bytes) -> bytes:
    """Truncate, or overwrite / insert / delete a few bytes at random places (often the header)."""
    out = bytearray(raw)
    if data.draw(st.booleans(), label="truncate"):
        return bytes(out[: data.draw(st.integers(0, len(out) - 1), label="length")])
    header_end = 8 + int.from_bytes(raw[:8], "little") if len(raw) >= 8 else len(raw)
    for _ in range(data.draw(st.integers(1, 4), label="edits")):
        at = data.draw(st.integers(0, max(0, min(len(out), header_end) - 1)) | st.integers(0, max(0, len(out) - 1)), label="at")
        kind = data.draw(st.sampled_from(["set", "insert", "delete"]), label="kind")
        byte = data.draw(st.integers(0, 255), label="byte")
        if kind == "set" and at < len(out):
            out[at] = byte
        elif kind == "insert":
            out.insert(at, byte)
        elif at < len(out):
            del out[at]
    return bytes(out)


@FUZZ
@given(data=st.data(), target=st.sampled_from([STATE_FILE, INFO_FILE]), how=st.sampled_from(["resume", "fresh"]))
def test_fuzzed_resume_state_resumes_or_is_refused(saved: Path, tmp_path: Path, cli, data: st.DataObject, target: str, how: str) -> None:
    """Random byte mutations of either file, read by ``--resume`` or by a fresh run of the saved
    config: a valid resume (a fresh run also starts afresh when the state's config no longer
    matches its own) or one line, exit 2 and nothing written."""
    parent = tmp_path / f"fuzz-{next(_EXAMPLES)}"  # tmp_path is shared by the examples
    parent.mkdir()
    run = parent / "run"
    shutil.copytree(resume_dir(saved / "run"), resume_dir(run))
    path = resume_dir(run) / target
    mutated = _mutate(data, path.read_bytes())
    path.write_bytes(mutated)
    before = _snapshot(parent)
    res = cli("train", *(["sac", "--resume", str(run), "--no-progress"] if how == "resume" else [*ARGS, "--out", str(run)]))
    if res.code == 0:
        assert (run / "metrics.json").is_file()
    else:
        assert res.code == 2 and len(res.err.strip().splitlines()) == 1, res.err[-2000:]
        assert _snapshot(parent) == before and not run.exists()
