"""DVC stages depend on the rlpipe code they run: dvc.yaml is written from dvc.template.yaml
with each stage's import closure, so an edit reruns only the stages whose code it touches."""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from rlpipe.algos.registry import SPECS
from rlpipe.commands.stage_deps import (
    ALGO_FIELDS,
    REPO,
    TEMPLATE,
    WRITE_COMMAND,
    CodeGraph,
    module_paths,
    render,
    scan_imports,
    stale_stages,
)
from tests.smoke import smoke_params

PARAMS = yaml.safe_load((REPO / "params.yaml").read_text())


@cache
def stage_items() -> dict[str, tuple[dict[str, Any], list[str], list[str]]]:
    """``group@key`` -> (its params.yaml entry, deps, outs) for every stage of dvc.yaml."""
    stages = {}
    for name, stage in yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"].items():
        body = stage.get("do", stage)
        if "foreach" not in stage:
            stages[name] = ({}, body["deps"], body["outs"])
            continue
        foreach = stage["foreach"]  # `${group}` or {key: `${group.key}`}
        keys = foreach if isinstance(foreach, dict) else PARAMS[foreach.strip("${}")]
        group = foreach.strip("${}") if isinstance(foreach, str) else next(iter(foreach.values())).strip("${}").split(".")[0]
        for key in keys:
            stages[f"{name}@{key}"] = (PARAMS[group][key], body["deps"], body["outs"])
    return stages


def test_dvc_yaml_is_written_from_the_template_and_the_code() -> None:
    graph, template = CodeGraph(), (REPO / TEMPLATE).read_text()
    expected = render(template, PARAMS, graph)
    assert (REPO / "dvc.yaml").read_text() == expected, f"dvc.yaml is stale: run `{WRITE_COMMAND}` (make deps)"
    # the end-to-end test runs dvc.yaml with the smoke profile: it makes the same stages
    assert render(template, smoke_params(PARAMS), graph) == expected
    # control: a new params.yaml entry is a new stage, so the check fails until dvc.yaml is rewritten
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["train_offline"]["cql-extra"] = {**params["train_offline"]["cql-cartpole"]}
    grown = render(template, params, graph)
    assert grown != expected and "cql-extra: ${train_offline.cql-extra}" in grown


def test_every_stage_item_is_in_params_and_runs_rlpipe() -> None:
    stages = stage_items()
    for entries in PARAMS.values():
        for key in entries:
            assert sum(name.endswith(f"@{key}") for name in stages) == 1, key
    for stage in yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"].values():
        cmd = stage.get("do", stage)["cmd"]
        assert cmd.startswith("rlpipe ") and "args" not in cmd  # per-stage settings are `set:` mappings in params.yaml


def test_an_algorithm_module_is_a_dependency_of_its_stages_only() -> None:
    stages = stage_items()
    # Cal-QL's module builds on CQL's, so its stages run CQL's code too
    runs_cql = {name for name, (item, _, _) in stages.items() if {"cql", "calql"} & {item.get(f) for f in ALGO_FIELDS}}
    assert {name for name, (_, deps, _) in stages.items() if "rlpipe/algos/cql.py" in deps} == runs_cql
    assert {name.split("@")[0] for name in runs_cql} == {"train_offline-cql", "train_offline-calql", "sweep_offline-cql"}
    # what CQL builds on is its dependency too; BC (same template stage) reaches neither
    assert "rlpipe/algos/sac.py" in stages["train_offline-cql@cql-pendulum"][1]
    assert not {"rlpipe/algos/sac.py", "rlpipe/algos/cql.py"} & set(stages["train_offline-bc@bc-pendulum"][1])


def test_every_stage_that_writes_a_dataset_or_checkpoint_depends_on_the_file_writer() -> None:
    stages = stage_items()
    writers = {
        name
        for name, (_, _, outs) in stages.items()
        for out in (next(iter(out)) if isinstance(out, dict) else out for out in outs)
        if out.startswith(("datasets/", "sweeps/", "ope/")) or out.endswith("model.safetensors")
    }
    assert len(writers) == len(stages) - 1  # all but the report
    assert all("rlpipe/storage/files.py" in stages[name][1] for name in writers)


def test_a_stage_that_runs_no_algorithm_depends_on_no_algorithm_module() -> None:
    modules = {f"{spec.module.replace('.', '/')}.py" for spec in SPECS}
    plain = {name: deps for name, (item, deps, _) in stage_items().items() if not any(f in item for f in ALGO_FIELDS)}
    assert {name.split("@")[0] for name in plain} == {
        "collect_random",
        "relabel_her",
        "merge_datasets",
        "filter_datasets",
        "export_d4rl",
        "import_logs",
        "ope_fqe",
        "report",
    }
    assert all(not modules & set(deps) for deps in plain.values())
    # the console script imports every command module but runs only the stage's command
    collect = set(plain["collect_random@cartpole-random"])
    assert "rlpipe/cli/train.py" in collect and "rlpipe/commands/runs.py" not in collect


def test_scan_sorts_imports_by_when_they_run(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    for name in ("__init__", "a", "b", "c", "d", "sub/__init__"):
        (package / f"{name}.py").write_text("")
    (package / "sub" / "e.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from .. import a\n"  # relative, at import
        "if TYPE_CHECKING:\n    from pkg import b\n"  # never at run time
        "def f():\n    from pkg.c import Thing\n    return 'pkg.d:make'\n"  # deferred; a name resolved later
    )
    known = module_paths(package)
    scan = scan_imports(package / "sub" / "e.py", known)
    assert (scan.at_import, scan.typing, scan.deferred, scan.named) == ({"pkg.a"}, {"pkg.b"}, {"pkg.c"}, {"pkg.d"})


def test_stale_stages_names_what_changed_since_the_recorded_run(tmp_path: Path) -> None:
    """dvc.lock against the tree: a code file's content, a parameter's value and a stage gone
    from dvc.yaml each make a stage stale; data dependencies and files outside rlpipe/ do not."""
    (tmp_path / "rlpipe").mkdir()
    code = tmp_path / "rlpipe" / "train.py"
    code.write_text("x = 1\n")
    (tmp_path / "params.yaml").write_text("train:\n  lr: 0.1\n")
    (tmp_path / "dvc.yaml").write_text("stages:\n  train:\n    cmd: rlpipe train\n")
    recorded = {"path": "rlpipe/train.py", "hash": "md5", "md5": hashlib.md5(b"x = 1\n").hexdigest()}
    data = {"path": "datasets/d", "hash": "md5", "md5": "0" * 32 + ".dir"}  # another stage's output, not in the tree
    lock = {
        "schema": "2.0",
        "stages": {"train": {"cmd": "rlpipe train", "deps": [recorded, data], "params": {"params.yaml": {"train.lr": 0.1}}}},
    }
    (tmp_path / "dvc.lock").write_text(yaml.safe_dump(lock))
    assert stale_stages(tmp_path) == {}
    code.write_text("x = 2\n")
    (tmp_path / "params.yaml").write_text("train:\n  lr: 0.2\n")
    assert stale_stages(tmp_path) == {"train": ["rlpipe/train.py", "train.lr in params.yaml"]}
    (tmp_path / "dvc.yaml").write_text("stages:\n  fit:\n    cmd: rlpipe train\n")
    assert stale_stages(tmp_path) == {"train": ["stage train is no longer in dvc.yaml"]}


def test_the_root_pipelines_recorded_results_come_from_the_code_in_the_tree() -> None:
    """Every stage of the root pipeline's dvc.lock (whose metrics docs/results.md shows) ran on
    the rlpipe code and params.yaml of this tree: an edit that changes a stage's code or
    parameters fails here until `make repro` records fresh results (or, for an edit proven not
    to change any output, `dvc commit`). The D4RL profiles' reruns take hours: their scoreboard
    marks stale rows instead (`python -m rlpipe.commands.stage_deps --stale-results`)."""
    stale = stale_stages(REPO)
    named = "; ".join(f"{stage}: {', '.join(changes[:3])}" for stage, changes in sorted(stale.items())[:10])
    assert not stale, f"{len(stale)} stages of dvc.lock are stale (make repro): {named}"
