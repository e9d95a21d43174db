"""The D4RL-style pipeline (suites/d4rl, and its CPU profile suites/d4rl-cpu): its
stages' wiring, `dvc repro` end to end with the smoke profile in a copy of the repo, a MuJoCo
dataset read back by Minari with D4RL's reference returns, and the CPU profile's committed
scoreboard."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import minari
import numpy as np
import pytest
import yaml

from rlpipe.commands.stage_deps import WRITE_COMMAND, expected_dvc_yaml
from rlpipe.datasets.loader import load_dataset
from rlpipe.datasets.store import list_datasets
from rlpipe.datasets.validate import validate_dataset
from tests.test_pipeline import dvc_repro_in_copy, key_paths

REPO = Path(__file__).resolve().parents[1]
PIPELINE = REPO / "suites" / "d4rl"
CPU_PROFILE = REPO / "suites" / "d4rl-cpu"
KINDS = ("random", "medium", "medium-replay", "expert", "medium-expert")
HOPPER_REFERENCE = (-20.272305, 3234.3)  # D4RL's random and expert returns for Hopper


def stages(pipeline: Path = PIPELINE) -> dict:
    return yaml.safe_load((pipeline / "dvc.yaml").read_text())["stages"]


@pytest.mark.parametrize("pipeline", [PIPELINE, CPU_PROFILE], ids=["paper", "cpu"])
def test_every_stage_depends_on_the_code_it_runs_only(pipeline: Path) -> None:
    where = pipeline.relative_to(REPO).as_posix()
    assert (pipeline / "dvc.yaml").read_text() == expected_dvc_yaml(REPO, where), f"{where}/dvc.yaml is stale: run `{WRITE_COMMAND}`"
    deps = {name: set(stage.get("do", stage)["deps"]) for name, stage in stages(pipeline).items()}
    assert all("../../rlpipe/storage/files.py" in files and "../../rlpipe/cli/main.py" in files for files in deps.values())
    # an edit to CQL reruns CQL's runs and Cal-QL's (which imports it) only; the SAC behind the
    # data is in the collections' code
    cql_users = {name for name, files in deps.items() if "../../rlpipe/algos/cql.py" in files}
    assert cql_users == {"train_offline-cql"} | ({"train_offline-calql"} & deps.keys())
    assert "../../rlpipe/algos/sac.py" in deps["medium_replay"] and "../../rlpipe/algos/sac.py" in deps["medium"]
    assert not any(file.startswith("../../rlpipe/algos/") and file.endswith(("/bc.py", "/iql.py")) for file in deps["medium"])


def test_the_medium_run_is_the_expert_run_stopped_early() -> None:
    # Every SAC setting reaches the medium run too, so it differs from the expert run only by its stop.
    params = yaml.safe_load((PIPELINE / "params.yaml").read_text())
    cmd = stages()["medium_replay"]["do"]["cmd"]
    assert "--expert-steps ${sac.env_steps}" in cmd and "--seed ${seed}" in cmd
    for key in set(params["sac"]) - {"env_steps"}:
        assert f"--expert-set {key}=${{sac.{key}}}" in cmd, key
    assert "--set-from params.yaml:sac" in stages()["expert_sac"]["do"]["cmd"]


def test_smoke_profile_mirrors_params() -> None:
    params = yaml.safe_load((PIPELINE / "params.yaml").read_text())
    smoke = yaml.safe_load((REPO / "tests" / "d4rl_smoke_params.yaml").read_text())
    assert set(smoke["envs"]) == {"hopper"} and smoke["envs"]["hopper"]["env"] == params["envs"]["hopper"]["env"]
    params["envs"] = {"hopper": params["envs"]["hopper"]}  # the smoke run builds Hopper's datasets only
    assert key_paths(smoke) == key_paths(params)


def test_root_pipeline_does_not_run_it() -> None:
    root = (REPO / "dvc.yaml").read_text() + (REPO / "Makefile").read_text().split("\nrepro:")[1].split("\n\n")[0]
    assert "suites/" not in root


@pytest.mark.slow
@pytest.mark.heavy
def test_dvc_repro_builds_every_dataset_and_run(tmp_path: Path) -> None:
    """Every stage with the smoke profile: about 170 CPU-s (16 rlpipe processes)."""
    pipeline = tmp_path / "repo" / "suites" / "d4rl"
    dvc, env = dvc_repro_in_copy(tmp_path / "repo", "suites/d4rl", REPO / "tests" / "d4rl_smoke_params.yaml")
    status = subprocess.run([*dvc, "status", "--json"], cwd=pipeline, env=env, capture_output=True, text=True, check=True)
    assert json.loads(status.stdout) == {}  # every stage ran and is up to date

    smoke = yaml.safe_load((REPO / "tests" / "d4rl_smoke_params.yaml").read_text())
    datasets = {info.name: info for info in list_datasets(pipeline / "datasets")}
    assert set(datasets) == {f"hopper-{kind}" for kind in KINDS}
    for info in datasets.values():
        assert (info.metadata["ref_min_score"], info.metadata["ref_max_score"]) == HOPPER_REFERENCE, info.name
        assert validate_dataset(info) == []
    for kind in ("random", "medium", "expert"):
        assert datasets[f"hopper-{kind}"].metadata["total_steps"] >= smoke["dataset_steps"]
    medium_expert = datasets["hopper-medium-expert"].metadata["total_steps"]
    assert medium_expert == datasets["hopper-medium"].metadata["total_steps"] + datasets["hopper-expert"].metadata["total_steps"]
    replay = datasets["hopper-medium-replay"].metadata
    assert replay["producer"]["params"]["expert_settings"]["stop_at_return"] == smoke["envs"]["hopper"]["medium_return"]
    assert replay["total_steps"] <= smoke["sac"]["env_steps"]
    # `medium` rolls out the policy the medium-replay run ended with.
    assert datasets["hopper-medium"].metadata["producer"]["checkpoint_sha256"] == replay["producer"]["checkpoint_sha256"]
    for run_name in [*smoke["train_offline"], "hopper-expert-sac"]:
        metrics = json.loads((pipeline / "models" / run_name / "metrics.json").read_text())
        assert np.isfinite(metrics["eval_return_mean"]), run_name
    assert (pipeline / "report" / "index.html").is_file()


def test_hopper_dataset_reads_in_minari_with_d4rl_reference_returns(store: Path, tmp_path: Path, monkeypatch, cli) -> None:
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    assert (
        cli("collect", "--env", "Hopper-v5", "--steps", "300", "--seed", "0", "--name", "hopper-random", "--store", store, "--quiet").code
        == 0
    )
    shown = cli("datasets", "show", "hopper-random", "--store", store)
    assert shown.code == 0 and "ref_min_score" in shown.out and "3234.3" in shown.out, shown.out
    result = cli("datasets", "export", "hopper-random", "--id", "rlpipe/hopper-random-v0", "--store", store)
    assert result.code == 0, result.err
    exported = minari.load_dataset("rlpipe/hopper-random-v0")
    ours = load_dataset("hopper-random", store)
    observations = np.concatenate([e.observations[:-1] for e in exported.iterate_episodes()])
    assert observations.dtype == np.float64 and exported.total_steps == len(ours)
    np.testing.assert_array_equal(observations, ours.obs)
    assert minari.get_normalized_score(exported, np.array([HOPPER_REFERENCE[1]])) == pytest.approx(1.0)
