"""A DVC remote round trip: a dataset pushed to a (local directory) remote and pulled into a
fresh clone is byte-identical."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlpipe.commands.collect import collect_dataset
from rlpipe.datasets.store import open_dataset
from rlpipe.datasets.validate import validate_dataset

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def _files(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_push_and_pull_into_a_fresh_clone_restore_the_dataset(tmp_path: Path) -> None:
    env = {**os.environ, **GIT_ENV}
    repo, clone, remote = tmp_path / "repo", tmp_path / "clone", tmp_path / "remote"

    def run(*args: str, cwd: Path = repo) -> None:
        done = subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    dvc = [sys.executable, "-m", "dvc"]
    repo.mkdir()
    run("git", "init", "-q")
    run(*dvc, "init", "-q")
    collect_dataset("CartPole-v1", episodes=5, num_envs=1, name="cp", store=repo / "datasets", progress=False)
    run(*dvc, "add", "-q", "datasets/cp")
    run(*dvc, "remote", "add", "-d", "local", str(remote))
    run("git", "add", "-A")
    run("git", "commit", "-qm", "dataset")
    run(*dvc, "push", "-q")
    run("git", "clone", "-q", str(repo), str(clone), cwd=tmp_path)
    assert not (clone / "datasets" / "cp").exists()  # git holds only the .dvc pointer
    run(*dvc, "pull", "-q", cwd=clone)
    assert _files(clone / "datasets" / "cp") == _files(repo / "datasets" / "cp")
    assert validate_dataset(open_dataset("cp", clone / "datasets")) == []
