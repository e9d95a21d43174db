"""Run directories are written like datasets: locked, staged, published by renames (issue 9)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

RLPIPE = str(Path(sys.executable).with_name("rlpipe"))
QUICK = ["train", "ppo", "--env", "CartPole-v1", "--env-steps", "1024", "--no-progress"]


def snapshot(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def start_long_run(out: Path) -> subprocess.Popen:
    """A second process training into `out`, stopped by the caller once it has started."""
    proc = subprocess.Popen([RLPIPE, "train", "ppo", "--env", "CartPole-v1", "--env-steps", "10000000", "--seed", "1",
                             "--out", str(out), "--no-progress"], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list(out.parent.glob(f".tmp-*-{out.name}/dvclive")) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    assert proc.poll() is None
    return proc


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killed_rerun_keeps_the_old_run_whole(tmp_path: Path, cli, sig: int) -> None:
    out = tmp_path / "models" / "ppo"
    assert cli(*QUICK, "--out", out).code == 0
    before = snapshot(out)
    proc = start_long_run(out)
    try:
        busy = cli(*QUICK, "--out", out)  # a second writer of the same run directory
        assert busy.code == 2 and "is being written by another process" in busy.err
    finally:
        proc.send_signal(sig)
        code = proc.wait(timeout=30)
    assert snapshot(out) == before  # the old checkpoint, metrics and curve, nothing of the new run
    evaluated = cli("eval", out, "--episodes", "1")
    assert evaluated.code == 0, evaluated.err
    leftovers = [p.name for p in out.parent.iterdir() if p.name != ".locks" and p != out]
    if sig == signal.SIGTERM:
        assert code == 128 + signal.SIGTERM and leftovers == []
    else:
        assert leftovers and all(name.startswith(".tmp-") for name in leftovers)
        assert cli(*QUICK, "--seed", "2", "--out", out).code == 0  # the next run cleans up and replaces
        assert [p.name for p in out.parent.iterdir() if p.name != ".locks"] == ["ppo"]
        assert snapshot(out) != before


def test_out_that_is_not_a_run_directory_is_refused(tmp_path: Path, cli) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    result = cli(*QUICK, "--out", tmp_path / "mine")
    assert result.code == 2 and "not a run directory; refusing to replace it" in result.err
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    (tmp_path / "file").write_text("x")
    result = cli(*QUICK, "--out", tmp_path / "file")
    assert result.code == 2 and "must name a directory" in result.err
