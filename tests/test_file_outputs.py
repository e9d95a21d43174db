"""Every file output a user names (`ope fqe --out`, `collect --metrics`, `export --onnx`,
`report --markdown`, `eval --video`) goes through one helper pair, `rlpipe.storage.files.check_output_file`
and `rlpipe.storage.files.atomic_output`: a regular file is replaced atomically, a character device or a
FIFO is written through and stays what it was (as root, `--out /dev/null` used to replace
/dev/null with a regular file), and a directory, a socket, a missing parent or a /proc path is
one line on stderr and exit 2, before any work, leaving nothing behind.

FIFOs are made in tmp_path with a reader thread; /dev/null is only named where the code writes
through, and is checked to be a character device afterwards."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from rlpipe.errors import OutputError, RlpipeError
from rlpipe.storage.files import atomic_output, atomic_write_text, check_output_dir, check_output_file
from tests.test_collector import collect_dataset, train_tiny_ppo

LONG = "a" * 300  # past the file system's 255 bytes
NEAR = "b" * 240  # within them, but not with a temporary file's `.tmp-<pid>-<id>-` before it


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with a small CartPole dataset and a trained PPO run beside it."""
    root = tmp_path_factory.mktemp("outputs")
    collect_dataset(root / "store", "CartPole-v1", "cartpole", fmt="arrow", episodes=4, num_envs=2)
    train_tiny_ppo(root / "run")
    return root


@contextmanager
def fifo_reader(path: Path) -> Iterator[list[bytes]]:
    """Make a FIFO at ``path`` and read it to its end in a thread; yields the list that holds
    what was read once the block ends. A writer that never came is released on exit."""
    os.mkfifo(path)
    got: list[bytes] = []

    def read() -> None:
        with open(path, "rb") as handle:
            got.append(handle.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield got
    finally:
        if reader.is_alive() and not got:
            with contextlib.suppress(OSError):  # the reader still waits for a writer: open and close one so that it sees the end
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(30)
        assert not reader.is_alive()


def assert_dev_null_intact() -> None:
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def tree(path: Path) -> list[tuple[str, int]]:
    """Every file under ``path`` with its size, but locks and the verification cache."""
    files = [p.relative_to(path) for p in path.rglob("*") if p.is_file()]
    return sorted((str(p), (path / p).stat().st_size) for p in files if not {".locks", ".verified"} & set(p.parts))


def one_line_exit_2(result, message: str) -> None:
    assert result.code == 2, result.err
    assert result.err.startswith("error: ") and result.err.count("\n") == 1 and message in result.err, result.err
    assert "Traceback" not in result.err


# The helpers themselves.


def test_atomic_output_writes_through_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "out.json"
    with fifo_reader(fifo) as got:
        assert check_output_file(fifo, "--out") is True  # written through, never opened by the check
        atomic_write_text(fifo, '{"a": 1}\n')
    assert got == [b'{"a": 1}\n']
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and entries(tmp_path) == ["out.json"]  # no temporary file beside it


def test_atomic_output_writes_through_dev_null() -> None:
    assert check_output_file("/dev/null", "--out") is True
    with atomic_output("/dev/null") as tmp:
        assert tmp.name == "null" and tmp.parent != Path("/dev")  # the temporary file lies elsewhere
        tmp.write_text("discarded\n")
    assert not tmp.parent.exists()
    assert_dev_null_intact()


def test_atomic_output_still_replaces_a_regular_file(tmp_path: Path) -> None:
    """Control: a regular file is replaced by a rename (a new inode), nothing left beside it."""
    path = tmp_path / "out.json"
    path.write_text("old")
    inode = path.stat().st_ino
    assert check_output_file(path, "--out") is False
    atomic_write_text(path, "new")
    assert path.read_text() == "new" and path.stat().st_ino != inode and entries(tmp_path) == ["out.json"]


@pytest.fixture
def unix_socket(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    yield path
    server.close()


def test_atomic_output_refuses_a_directory_and_a_socket(tmp_path: Path, unix_socket: Path) -> None:
    (tmp_path / "folder").mkdir()
    for path, message in ((tmp_path / "folder", "it is a directory"), (unix_socket, "it is a socket")):
        with pytest.raises(OutputError, match=message) as refused, atomic_output(path):
            raise AssertionError("nothing is written")
        assert isinstance(refused.value, RlpipeError) and isinstance(refused.value, OSError)  # one CLI line; still an OSError
    assert entries(tmp_path) == ["folder", "sock"] and stat.S_ISSOCK(os.lstat(unix_socket).st_mode)


def test_check_output_file_refuses_in_one_line_and_makes_nothing(tmp_path: Path, unix_socket: Path) -> None:
    (tmp_path / "folder").mkdir()
    (tmp_path / "blocker").write_text("a file where a folder should be")
    before = entries(tmp_path)
    for path, make_parents, message in (
        (tmp_path / "folder", True, "it is a directory"),
        (unix_socket, True, "it is a socket (outputs are regular files, character devices or FIFOs)"),
        (tmp_path / "missing" / "x.json", False, f"directory {tmp_path / 'missing'} does not exist"),
        (tmp_path / "blocker" / "x.json", True, "Not a directory"),
        (tmp_path / "blocker" / "deeper" / "x.json", True, "Not a directory"),
        (Path("/proc/rlpipe-output.json"), True, "cannot create a file in /proc"),
        (Path("/proc/self/status"), False, "cannot create a file in /proc/self"),  # a regular file no rename can replace
        (tmp_path / LONG, False, "File name too long"),
        (tmp_path / NEAR, False, f"its name is {len(NEAR)} bytes long: at most 223 here"),  # no room for `.tmp-<pid>-<id>-NAME`
        (tmp_path / "new" / LONG / "x.json", True, f"a folder name of {len(LONG)} bytes is longer than the file system allows"),
    ):
        with pytest.raises(OutputError) as refused:
            check_output_file(path, "--out", make_parents=make_parents)
        text = str(refused.value)
        assert text.startswith(f"cannot write {path} (--out): ") and message in text and "\n" not in text, text
    assert entries(tmp_path) == before
    # Control: with make_parents, missing folders under a writable one pass, and are not made yet.
    assert check_output_file(tmp_path / "new" / "deeper" / "x.json", "--out", make_parents=True) is False
    assert entries(tmp_path) == before


def test_check_output_dir_refuses_in_one_line_and_makes_nothing(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("kept")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(tmp_path / "file")
    before = entries(tmp_path)
    for path, message in (
        (tmp_path / "file", f"--out {tmp_path / 'file'} is not a directory"),
        (tmp_path / "fifo", "is not a directory"),
        (tmp_path / "link", "is not a directory"),  # followed: a link to a file
        (Path("/dev/null"), "--out /dev/null is not a directory"),
        (tmp_path / "file" / "run", f"--out {tmp_path / 'file' / 'run'}: {tmp_path / 'file'} is not a directory"),
        (tmp_path / "fifo" / "a" / "b", f": {tmp_path / 'fifo'} is not a directory"),
        (tmp_path / LONG, f"--out {tmp_path / LONG}: File name too long"),
        (tmp_path / NEAR, f"its name is {len(NEAR)} bytes long: at most 223 here (the file system's 255 less 32 for temporary names)"),
        (tmp_path / "new" / LONG / "run", f"a folder name of {len(LONG)} bytes is longer than the file system allows (255)"),
    ):
        with pytest.raises(OutputError) as refused:
            check_output_dir(path, "--out")
        assert message in str(refused.value) and "\n" not in str(refused.value), str(refused.value)
    assert entries(tmp_path) == before and (tmp_path / "file").read_text() == "kept"
    # Control: an existing directory, and missing ones under it, pass; nothing is made yet.
    check_output_dir(tmp_path, "--out")
    check_output_dir(tmp_path / "new" / "deeper" / "run", "--out")
    assert entries(tmp_path) == before


# Through the CLI: write-through targets.

# kind -> its command line, given the world, a scratch folder for its other outputs and the path.
OUTPUT_COMMANDS = {
    "ope --out": lambda w, s, path: [
        "ope",
        "fqe",
        w / "run",
        "--dataset",
        "cartpole",
        "--store",
        w / "store",
        "--updates",
        "2",
        "--out",
        path,
    ],
    "collect --metrics": lambda w, s, path: [
        "collect",
        "--env",
        "CartPole-v1",
        "--episodes",
        "1",
        "--store",
        s / "store",
        "--quiet",
        "--metrics",
        path,
    ],
    "export --onnx": lambda w, s, path: ["export", w / "run", "--onnx", path],
    "report --markdown": lambda w, s, path: ["report", w / "run", "--out", s / "report", "--markdown", path],
}


@pytest.fixture
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty folder for a command's other outputs (a store, a report), apart from tmp_path."""
    return tmp_path_factory.mktemp("scratch")


def check_written(kind: str, data: bytes) -> None:
    if kind == "ope --out":
        (record,) = json.loads(data)
        assert record["dataset"] == "cartpole" and record["config"]["updates"] == 2
    elif kind == "collect --metrics":
        assert json.loads(data)["episodes"] == 1
    elif kind == "export --onnx":
        import onnx

        assert {p.key for p in onnx.load_from_string(data).metadata_props} >= {"checkpoint_sha256", "env_id"}
    else:
        assert data.startswith(b"#") or b"|" in data


@pytest.mark.parametrize("kind", list(OUTPUT_COMMANDS))
def test_outputs_write_through_a_fifo(cli, world: Path, tmp_path: Path, scratch: Path, kind: str) -> None:
    fifo = tmp_path / ("out.onnx" if kind == "export --onnx" else "out.txt")
    with fifo_reader(fifo) as got:
        result = cli(*OUTPUT_COMMANDS[kind](world, scratch, fifo))
    assert result.code == 0, result.err
    assert len(got) == 1 and got[0], "nothing came through the FIFO"
    check_written(kind, got[0])
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and entries(tmp_path) == [fifo.name]


@pytest.mark.parametrize("kind", list(OUTPUT_COMMANDS))
def test_outputs_write_through_dev_null(cli, world: Path, scratch: Path, kind: str) -> None:
    result = cli(*OUTPUT_COMMANDS[kind](world, scratch, Path("/dev/null")))
    assert result.code == 0, result.err  # no --force needed: nothing is replaced
    assert_dev_null_intact()
    assert not any(name.startswith((".tmp-", ".rlpipe-lock-")) for name in os.listdir("/dev"))


def test_video_writes_through_a_fifo(cli, world: Path, tmp_path: Path) -> None:
    pytest.importorskip("pygame")
    fifo = tmp_path / "episode.gif"
    with fifo_reader(fifo) as got:
        result = cli("eval", world / "run", "--episodes", "1", "--video", fifo)
    assert result.code == 0, result.err
    assert got and got[0].startswith(b"GIF8") and stat.S_ISFIFO(os.lstat(fifo).st_mode) and entries(tmp_path) == ["episode.gif"]


# Through the CLI: refusals, before any work, leaving nothing behind.


@pytest.mark.parametrize(
    "kind, target, message",
    [
        ("ope --out", "FOLDER", "(--out): it is a directory"),
        ("ope --out", "BLOCKER/x.json", "(--out): Not a directory"),
        ("ope --out", "/proc/rlpipe-fqe.json", "(--out): cannot create a file in /proc"),
        ("ope --out", "SOCKET", "(--out): it is a socket"),
        ("collect --metrics", "FOLDER", "(--metrics): it is a directory"),
        ("collect --metrics", "/proc/self/rlpipe-metrics.json", "(--metrics): cannot create a file in /proc/self"),
        ("export --onnx", "FOLDER", "(--onnx): it is a directory"),
        ("export --onnx", "MISSING/x.onnx", "(--onnx): directory"),
        ("export --onnx", "/proc/rlpipe.onnx", "(--onnx): cannot create a file in /proc"),
        ("report --markdown", "FOLDER", "(--markdown): it is a directory"),
        ("report --markdown", "/proc/rlpipe.md", "(--markdown): cannot create a file in /proc"),
        ("report --markdown", "SOCKET", "(--markdown): it is a socket"),
        ("ope --out", "LONG", "(--out): File name too long"),
        ("ope --out", "MISSING/LONG/x.json", "(--out): a folder name of 300 bytes"),
        ("collect --metrics", "LONG", "(--metrics): File name too long"),
        ("export --onnx", "LONG", "(--onnx): File name too long"),
        ("export --onnx", "NEAR", "(--onnx): its name is 240 bytes long"),
        ("report --markdown", "LONG", "(--markdown): File name too long"),
    ],
)
def test_a_refused_output_is_one_line_and_leaves_nothing(
    cli, world: Path, tmp_path: Path, scratch: Path, unix_socket: Path, kind: str, target: str, message: str
) -> None:
    (tmp_path / "folder").mkdir()
    (tmp_path / "blocker").write_text("a file where a folder should be")
    names = {"FOLDER": tmp_path / "folder", "BLOCKER": tmp_path / "blocker", "MISSING": tmp_path / "missing", "SOCKET": unix_socket}
    names.update({"LONG": tmp_path / LONG, "NEAR": tmp_path / NEAR})
    head, _, rest = target.partition("/")
    path = (names[head] / rest.replace("LONG", LONG) if rest else names[head]) if head in names else Path(target)
    before, world_before = entries(tmp_path), tree(world)
    one_line_exit_2(cli(*OUTPUT_COMMANDS[kind](world, scratch, path)), f"cannot write {path} {message}")
    assert entries(tmp_path) == before and entries(tmp_path / "folder") == [] and tree(world) == world_before
    assert entries(scratch) == []  # refused before the dataset was collected or the report made


def test_video_refusals_are_one_line(cli, world: Path, tmp_path: Path) -> None:
    (tmp_path / "folder.gif").mkdir()
    one_line_exit_2(cli("eval", world / "run", "--episodes", "1", "--video", tmp_path / "folder.gif"), "(--video): it is a directory")
    one_line_exit_2(cli("eval", world / "run", "--episodes", "1", "--video", "/proc/rlpipe.gif"), "cannot create a file in /proc")
    # A missing folder is refused, not made (it was made, like `mkdir -p`; issue 63, group 8).
    missing = tmp_path / "missing" / "deeper" / "v.gif"
    one_line_exit_2(
        cli("eval", world / "run", "--episodes", "1", "--video", missing), f"(--video): directory {missing.parent} does not exist"
    )
    assert entries(tmp_path) == ["folder.gif"] and entries(tmp_path / "folder.gif") == []


@pytest.mark.parametrize("target", ["busy", "fifo"])
def test_a_refused_run_directory_leaves_no_lock_or_marker(cli, tmp_path: Path, target: str) -> None:
    """`train --out /tmp` left `/.rlpipe-lock-tmp` behind (and `--out /dev/null` a lock in /dev):
    the check of the name now runs before its parent, root marker or lock file is made."""
    parent = tmp_path / "parent"
    parent.mkdir()
    (parent / "other-file").write_text("not ours")
    out = parent / target
    if target == "busy":
        out.mkdir()
        (out / "notes.txt").write_text("a folder that is not a run")
        message = "is a non-empty directory that is not a run directory"
    else:
        os.mkfifo(out)
        message = "must name a directory"
    before = entries(parent)
    result = cli("train", "ppo", "--env", "CartPole-v1", "--env-steps", "64", "--out", out, "--no-progress", "--device", "cpu")
    one_line_exit_2(result, message)
    assert entries(parent) == before  # no .rlpipe-lock-<name>, no .rlpipe-root
    assert target == "busy" or stat.S_ISFIFO(os.lstat(out).st_mode)
    # Control: a fresh name in the same folder trains and publishes there.
    trained = cli(
        "train", "ppo", "--env", "CartPole-v1", "--env-steps", "64", "--set", "eval_every=64", "--set", "eval_episodes=1",
        "--set", "heldout_eval_episodes=0", "--out", parent / "run", "--no-progress", "--device", "cpu",
    )  # fmt: skip
    assert trained.code == 0 and (parent / "run" / "metrics.json").is_file(), trained.err


QUICK_PPO = ["--env", "CartPole-v1", "--env-steps", "64", "--no-progress", "--device", "cpu"]


# (id, command line, message): TMP is tmp_path, WORLD the world, LONG a name of 300 bytes, NEAR one of 240.
NAMES_TOO_LONG = [
    ("train --out", ["train", "ppo", *QUICK_PPO, "--out", "TMP/LONG"], "--out TMP/LONG: File name too long"),
    ("train --out near", ["train", "ppo", *QUICK_PPO, "--out", "TMP/NEAR"], "--out TMP/NEAR: its name is 240 bytes long"),
    ("train --out folder", ["train", "ppo", *QUICK_PPO, "--out", "TMP/new/LONG/run"], "--out TMP/new/LONG/run: a folder name of 300 bytes"),
    ("train --resume", ["train", "ppo", "--resume", "TMP/LONG"], "--resume TMP/LONG: File name too long"),
    ("report --out", ["report", "WORLD/run", "--out", "TMP/LONG"], "--out TMP/LONG: File name too long"),
    ("sweep --root", ["sweep", "ppo", "--env", "CartPole-v1", "--root", "TMP/LONG"], "sweep directory TMP/LONG/ppo-CartPole-v1: File name"),
    (
        "collect --store",
        ["collect", "--env", "CartPole-v1", "--episodes", "1", "--store", "TMP/LONG"],
        "dataset store TMP/LONG: File name too long",
    ),
    (
        "collect --expert-run",
        ["collect", "--env", "CartPole-v1", "--episodes", "1", "--expert", "ppo", "--expert-run", "TMP/LONG"],
        "--expert-run TMP/LONG: File name",
    ),
    ("eval", ["eval", "TMP/LONG"], "TMP/LONG/checkpoint.json: File name too long"),  # an input: one line too
    ("export", ["export", "TMP/LONG", "--onnx", "TMP/p.onnx"], "TMP/LONG/checkpoint.json: File name too long"),
]


@pytest.mark.parametrize(("command", "message"), [case[1:] for case in NAMES_TOO_LONG], ids=[case[0] for case in NAMES_TOO_LONG])
def test_a_name_past_the_file_systems_limit_is_one_line_and_leaves_nothing(
    cli, world: Path, tmp_path: Path, command: list[str], message: str
) -> None:
    """A 300-byte name (past the file system's 255 bytes) where a command writes a directory,
    or reads a run, was a traceback (an OSError from Path.exists or a mkdir); one of 240 bytes
    would have failed only when the temporaries beside it were made, after the work."""

    def filled(text: str) -> str:
        return text.replace("TMP", str(tmp_path)).replace("WORLD", str(world)).replace("LONG", LONG).replace("NEAR", NEAR)

    world_before = tree(world)
    one_line_exit_2(cli(*map(filled, command)), filled(message))
    assert entries(tmp_path) == [] and tree(world) == world_before  # no folder, lock, store or run made


@pytest.mark.parametrize("kind", ["fifo", "/dev/null", "file", "link to a file", "below a file"])
def test_a_sweep_root_that_is_not_a_directory_is_one_line(cli, tmp_path: Path, kind: str) -> None:
    """`sweep --root` a FIFO, a device, a file or a link to one was a NotADirectoryError when
    the sweep directory was made; now one line naming it, before any trial, nothing changed."""
    (tmp_path / "file").write_text("kept")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(tmp_path / "file")
    root, blocker = {
        "fifo": (tmp_path / "fifo", tmp_path / "fifo"),
        "/dev/null": (Path("/dev/null"), Path("/dev/null")),
        "file": (tmp_path / "file", tmp_path / "file"),
        "link to a file": (tmp_path / "link", tmp_path / "link"),
        "below a file": (tmp_path / "file" / "sweeps", tmp_path / "file"),
    }[kind]
    before = entries(tmp_path)
    result = cli("sweep", "ppo", "--env", "CartPole-v1", "--seeds", "0", "--set", "env_steps=64", "--root", root, "--name", "s")
    one_line_exit_2(result, f"sweep directory {root / 's'}: {blocker} is not a directory")
    assert entries(tmp_path) == before and (tmp_path / "file").read_text() == "kept" and stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode)
    assert_dev_null_intact()
