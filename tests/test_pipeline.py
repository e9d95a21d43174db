"""The DVC pipeline end to end: `dvc repro` with the smoke profile in a copy of the repo."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlpipe.datasets.store import list_datasets
from rlpipe.datasets.validate import validate_dataset

REPO = Path(__file__).resolve().parents[1]


def key_paths(tree: object, prefix: str = "") -> set[str]:
    """Every key path of a nested mapping, e.g. {'collect_random.cartpole-random.env', ...}."""
    if not isinstance(tree, dict):
        return {prefix}
    return set().union(*(key_paths(value, f"{prefix}.{key}" if prefix else str(key)) for key, value in tree.items()))


def test_smoke_profile_mirrors_params() -> None:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    smoke = yaml.safe_load((REPO / "tests" / "smoke_params.yaml").read_text())
    assert key_paths(smoke) == key_paths(params)


def dvc_repro_in_copy(work: Path, pipeline: str, params: Path) -> tuple[list[str], dict[str, str]]:
    """Copy the pipeline `pipeline` (a dvc.yaml's folder in the repo, "." for the root one) with
    `params` as its params.yaml, and the rlpipe package its stages depend on, into a new DVC
    project `work`; run `dvc repro` there. Returns the dvc command and the environment it ran in."""
    (work / pipeline).mkdir(parents=True)
    shutil.copy(REPO / pipeline / "dvc.yaml", work / pipeline / "dvc.yaml")
    shutil.copy(params, work / pipeline / "params.yaml")
    # Stages depend on the code that produces their outputs.
    shutil.copytree(REPO / "rlpipe", work / "rlpipe", ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("RLPIPE_DATASETS", None)
    dvc = [sys.executable, "-m", "dvc"]
    subprocess.run([*dvc, "init", "--no-scm", "-q"], cwd=work, env=env, check=True)
    shutil.copy(REPO / ".dvc" / "config", work / ".dvc" / "config")
    subprocess.run([*dvc, "config", "core.no_scm", "true"], cwd=work, env=env, check=True)
    run = subprocess.run([*dvc, "repro"], cwd=work / pipeline, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return dvc, env


@pytest.mark.slow
def test_dvc_repro_runs_every_stage(tmp_path: Path) -> None:
    work = tmp_path / "repo"
    dvc, env = dvc_repro_in_copy(work, ".", REPO / "tests" / "smoke_params.yaml")

    def changed_stages() -> set[str]:
        status = subprocess.run([*dvc, "status", "--json"], cwd=work, env=env, capture_output=True, text=True, check=True)
        return set(json.loads(status.stdout))

    assert changed_stages() == set()  # every stage ran and is up to date
    listed = subprocess.run([*dvc, "stage", "list", "--name-only"], cwd=work, env=env, capture_output=True, text=True, check=True)
    stages = set(listed.stdout.split())
    assert {s.split("@")[0] for s in stages} >= {"collect_random", "merge_datasets", "filter_datasets", "train_offline-cql", "report"}

    smoke = yaml.safe_load((REPO / "tests" / "smoke_params.yaml").read_text())
    datasets = {info.name: info for info in list_datasets(work / "datasets")}
    for name, settings in {**smoke["collect_random"], **smoke["collect_expert"]}.items():
        assert datasets[name].metadata["total_episodes"] == settings["episodes"]
    for name, settings in smoke["collect_mixed"].items():
        assert datasets[name].metadata["total_steps"] == settings["expert_steps"]
    for name, settings in smoke["relabel_her"].items():
        assert datasets[name].metadata["provenance"]["source_dataset"] == settings["dataset"]
    for name, settings in smoke["merge_datasets"].items():
        assert [p["name"] for p in datasets[name].metadata["lineage"]["parents"]] == [settings["first"], settings["second"]]
    for info in datasets.values():
        assert validate_dataset(info) == []
    page = (work / "report" / "index.html").read_text()  # FQE's estimates beside the held-out returns
    assert "<th>FQE on pendulum-mixed</th>" in page and "Spearman rank correlation" in page

    # `dvc status` follows the code each stage imports (rlpipe/pipeline/stage_deps.py): every
    # stage runs the data layer, so an edit there marks them all; an edit to one algorithm
    # marks only the stages that run it.
    writer = work / "rlpipe" / "datasets" / "writer.py"
    original = writer.read_text()
    writer.write_text(original + "\n# edited\n")
    assert changed_stages() == stages
    writer.write_text(original)
    algo = work / "rlpipe" / "algos" / "cql.py"
    algo.write_text(algo.read_text() + "\n# edited\n")
    assert changed_stages() == {s for s in stages if s.split("@")[0].endswith("-cql")}
