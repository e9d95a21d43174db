"""The DVC pipeline end to end: `dvc repro` with the smoke profile in a copy of the repo."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlpipe.algos import get_algo
from rlpipe.datasets.store import list_datasets
from rlpipe.datasets.validate import validate_dataset
from rlpipe.training.config import typed_value
from tests.smoke import CAPS, smoke_params, write_smoke_params

REPO = Path(__file__).resolve().parents[1]


def key_paths(tree: object, prefix: str = "") -> set[str]:
    """Every key path of a nested mapping, e.g. {'collect_random.cartpole-random.env', ...}."""
    if not isinstance(tree, dict):
        return {prefix}
    return set().union(*(key_paths(value, f"{prefix}.{key}" if prefix else str(key)) for key, value in tree.items()))


def dataset_env(params: dict[str, Any], name: str) -> str:
    """The env of the pipeline's dataset ``name``: its collection's, or its source's ("" for
    imported logs, which name none)."""
    if name in params.get("import_logs", {}):
        return ""
    for group in ("collect_random", "collect_expert", "collect_expert_sampled", "collect_mixed"):
        if name in params[group]:
            return params[group][name]["env"]
    for group, source in (("relabel_her", "dataset"), ("merge_datasets", "first"), ("filter_datasets", "source")):
        if name in params[group]:
            return dataset_env(params, params[group][name][source])
    raise KeyError(name)


def repeated_defaults(params: dict[str, Any]) -> list[str]:
    """The `set:` values of training entries, budgets aside, equal to the algorithm's tuned
    default for the entry's env (which the stage would use without them)."""
    repeated = []
    for group, entries in params.items():
        for key, entry in entries.items():
            if "algo" not in entry:
                continue
            spec = get_algo(entry["algo"])
            default = spec.make_config(entry.get("env") or dataset_env(params, entry["dataset"]))
            for name, value in entry["set"].items():
                if name != spec.budget and typed_value(spec.config_class, name, value) == getattr(default, name):
                    repeated.append(f"{group}.{key}.set.{name}")
    return repeated


def test_params_set_budgets_and_values_that_differ_from_the_defaults_only() -> None:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    assert repeated_defaults(params) == []
    # control: the default held-out evaluation written into an entry is found
    params["train_offline"]["cql-cartpole"]["set"]["heldout_eval_episodes"] = 100
    assert repeated_defaults(params) == ["train_offline.cql-cartpole.set.heldout_eval_episodes"]


def test_the_smoke_profile_has_every_stage_at_capped_budgets() -> None:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    smoke = smoke_params(params)
    assert {group: set(entries) for group, entries in smoke.items()} == {group: set(entries) for group, entries in params.items()}
    for group, entries in smoke.items():
        for key, entry in entries.items():
            settings = {**entry, **entry.get("set", {})}
            assert all(settings[k] <= cap for k, cap in CAPS.items() if k in settings), (group, key)
            if "algo" in entry:  # the default held-out evaluation, 100 episodes, is cut
                assert settings["heldout_eval_episodes"] == 2, (group, key)
    # control: a budget params.yaml sets above its cap is cut, one below is kept
    assert (
        smoke["train_online"]["ppo-cartpole"]["set"]["env_steps"]
        == CAPS["env_steps"]
        < params["train_online"]["ppo-cartpole"]["set"]["env_steps"]
    )
    assert smoke["collect_expert"]["pendulum-expert"]["num_envs"] == min(4, params["collect_expert"]["pendulum-expert"]["num_envs"])


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


@pytest.mark.heavy  # every stage of dvc.yaml at smoke size: about 8 CPU-minutes
def test_dvc_repro_runs_every_stage(tmp_path: Path) -> None:
    work = tmp_path / "repo"
    smoke_file = write_smoke_params(tmp_path / "smoke_params.yaml")
    dvc, env = dvc_repro_in_copy(work, ".", smoke_file)

    def changed_stages() -> set[str]:
        status = subprocess.run([*dvc, "status", "--json"], cwd=work, env=env, capture_output=True, text=True, check=True)
        return set(json.loads(status.stdout))

    assert changed_stages() == set()  # every stage ran and is up to date
    listed = subprocess.run([*dvc, "stage", "list", "--name-only"], cwd=work, env=env, capture_output=True, text=True, check=True)
    stages = set(listed.stdout.split())
    assert {s.split("@")[0] for s in stages} >= {"collect_random", "merge_datasets", "filter_datasets", "train_offline-cql", "report"}

    smoke = yaml.safe_load(smoke_file.read_text())
    datasets = {info.name: info for info in list_datasets(work / "datasets")}
    for name, settings in {**smoke["collect_random"], **smoke["collect_expert"], **smoke["collect_expert_sampled"]}.items():
        assert datasets[name].metadata["total_episodes"] == settings["episodes"]
    for name, settings in smoke["collect_mixed"].items():  # the run's finished episodes (all of Pendulum's 200-step ones)
        assert 0 < datasets[name].metadata["total_steps"] <= settings["expert_steps"]
    for name, settings in smoke["relabel_her"].items():
        assert datasets[name].metadata["provenance"]["source_dataset"] == settings["dataset"]
    for name, settings in smoke["merge_datasets"].items():
        assert [p["name"] for p in datasets[name].metadata["lineage"]["parents"]] == [settings["first"], settings["second"]]
    for info in datasets.values():
        assert validate_dataset(info) == []
    page = (work / "report" / "index.html").read_text()  # FQE's estimates beside the held-out returns
    assert "<th>FQE on pendulum-mixed</th>" in page and "Spearman rank correlation" in page

    # `dvc status` follows the code each stage imports (rlpipe/commands/stage_deps.py): every
    # stage runs the data layer, so an edit there marks them all; an edit to one algorithm
    # marks only the stages that run it.
    writer = work / "rlpipe" / "datasets" / "writer.py"
    original = writer.read_text()
    writer.write_text(original + "\n# edited\n")
    assert changed_stages() == stages
    writer.write_text(original)
    algo = work / "rlpipe" / "algos" / "cql.py"
    algo.write_text(algo.read_text() + "\n# edited\n")
    # CQL's stages and Cal-QL's, whose module builds on cql.py
    assert changed_stages() == {s for s in stages if s.split("@")[0].endswith(("-cql", "-calql"))}
