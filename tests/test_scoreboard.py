"""`rlpipe scoreboard`: D4RL-normalised scores over seeds beside published figures, a sweep over
several datasets, IQL's reward scale, and the D4RL CPU profile's table generated from its
committed metrics."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from rlpipe.commands.collect import collect_dataset
from rlpipe.commands.report import BLOCK_END, BLOCK_START, replace_block
from rlpipe.commands.scoreboard import read_published, render_table, run_score
from rlpipe.errors import RlpipeError

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "suites" / "d4rl-cpu"
HOPPER = {"ref_min_score": -20.0, "ref_max_score": 980.0}  # round numbers: return r scores (r + 20) / 10


def _run(algo: str, dataset: str, seed: int, heldout: float, curve: list[float]) -> dict:
    updates = [1000.0 * (i + 1) for i in range(len(curve))]
    metrics = {"algo": algo, "dataset": dataset, "seed": seed, "heldout_return_mean": heldout, "eval_return_mean": curve[-1]}
    metrics.update(gradient_updates=int(updates[-1]), wall_seconds=10.0 + seed)
    return {
        "path": f"{algo}/{seed}",
        "algo": algo,
        "dataset": dataset,
        "seed": seed,
        "curve": {"updates": updates, "return_mean": curve},
        "metrics": metrics,
    }


def board() -> dict:
    runs = [_run("iql", "hopper-medium", seed, heldout, [80.0 + seed * 10, 180.0]) for seed, heldout in enumerate([80.0, 180.0, 280.0])]
    runs.append(_run("bc", "hopper-medium", 0, 480.0, [380.0]))
    facts = {"env_id": "Hopper-v5", "episodes": 10, "transitions": 1000, "return_mean": 580.0, "score": 60.0, "reference": HOPPER}
    return {"datasets": {"hopper-medium": facts}, "runs": runs, "published": {"label": "CORL", "scores": {"hopper-medium": {"iql": 67.5}}}}


def test_table_is_mean_and_standard_error_over_seeds_beside_published_figures() -> None:
    table = render_table(board())
    # IQL's held-out returns 80, 180, 280 score 10, 20, 30: mean 20, s.e. 10 / sqrt(3)
    assert "| hopper-medium | iql | 3 | 20.0 ± 5.8 | 10.0, 20.0, 30.0 | 2000 | 11 | 67.5 |" in table
    assert "| hopper-medium | bc | 1 | 50.0 ± 0.0 | 50.0 | 1000 | 10 |  |" in table  # no published figure: blank
    assert "| hopper-medium | ours | 1,000 | 10 | 580.0 |  | 60.0 | 100.0 |" in table  # the dataset's own episodes
    # the curve: mean over seeds of (10, 11, 12) at 1000 updates, 20 at 2000; BC evaluated at 1000 only
    assert "| algorithm | 1000 | 2000 |" in table and "| iql | 11.0 | 20.0 |" in table and "| bc | 40.0 |  |" in table


def test_the_datasets_statistics_stand_beside_the_published_datasets(tmp_path: Path) -> None:
    """published.yaml's `datasets:` (D4RL's own files' statistics) is read and shown as a row
    under ours; a dataset it does not list has our row alone."""
    published = tmp_path / "published.yaml"
    published.write_text(
        "label: CORL\nscores: {}\ndataset_label: D4RL -v2\ndatasets:\n"
        "  hopper-medium: {transitions: 999906, episodes: 2186, return_mean: 1422.1, return_std: 379.0, return_min: 315.9, "
        "return_max: 3222.4, score: 44.3, mean_length: 457.4}\n"
    )
    data = board()
    data["published"] = read_published(published)
    data["datasets"]["hopper-medium"].update(return_std=5.0, return_min=570.0, return_max=590.0)
    data["datasets"]["hopper-other"] = dict(data["datasets"]["hopper-medium"], episodes=4)
    table = render_table(data)
    assert "| hopper-medium | ours | 1,000 | 10 | 580.0 ± 5.0 | 570.0 / 590.0 | 60.0 | 100.0 |" in table
    assert "| hopper-medium | D4RL -v2 | 999,906 | 2,186 | 1,422.1 ± 379.0 | 315.9 / 3,222.4 | 44.3 | 457.4 |" in table
    assert "| hopper-other | ours | 1,000 | 4 |" in table and "| hopper-other | D4RL" not in table


def test_a_changed_metric_changes_the_table() -> None:
    data = board()
    changed = copy.deepcopy(data)
    changed["runs"][0]["metrics"]["heldout_return_mean"] += 100.0
    assert run_score(changed, changed["runs"][0]) == run_score(data, data["runs"][0]) + 10.0
    assert render_table(changed) != render_table(data)


def test_the_table_replaces_the_page_block_only() -> None:
    page = f"# D4RL\n\nintro\n{BLOCK_START}\nold table\n{BLOCK_END}\n\nafter\n"
    new = replace_block(page, "| new |\n", "page.md")
    assert new == f"# D4RL\n\nintro\n{BLOCK_START}\n| new |\n{BLOCK_END}\n\nafter\n"
    with pytest.raises(RlpipeError, match="page.md has no"):
        replace_block("# no block\n", "| new |\n", "page.md")


def test_cpu_profile_table_in_the_docs_is_generated_from_the_committed_metrics() -> None:
    scores = PROFILE / "results" / "scores.json"
    data = json.loads(scores.read_text())
    table = render_table(data)
    assert (PROFILE / "results" / "table.md").read_text() == table
    for page in ("d4rl.md", "results.md"):
        assert f"{BLOCK_START}\n{table}{BLOCK_END}" in (REPO / "docs" / page).read_text(), page
    page = (REPO / "docs" / "d4rl.md").read_text()
    # every run on the board is one of the profile's params' entries, each entry it shows with all
    # its seeds and held-out episodes (an entry not yet run on the current datasets is absent:
    # the scoreboard drops runs whose dataset changed; docs/d4rl.md names those entries)
    params = yaml.safe_load((PROFILE / "params.yaml").read_text())["train_offline"]
    seeds = {(entry["algo"], dataset): entry["seeds"] for entry in params.values() for dataset in entry["datasets"].split(",")}
    shown = {(run["algo"], run["dataset"]) for run in data["runs"]}
    assert shown and shown <= set(seeds)
    for algo, dataset in shown:
        first, last = (int(seed) for seed in seeds[algo, dataset].split("-"))
        assert sorted(run["seed"] for run in data["runs"] if (run["algo"], run["dataset"]) == (algo, dataset)) == list(
            range(first, last + 1)
        )
    assert all(run["metrics"]["heldout_episodes"] == 100 for run in data["runs"])
    # control: the same page does not hold the table of a changed metric
    data["runs"][0]["metrics"]["heldout_return_mean"] += 50.0
    assert render_table(data) not in page


@pytest.fixture(scope="module")
def hopper_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    store = tmp_path_factory.mktemp("hopper")
    for name, seed in (("hopper-a", 0), ("hopper-b", 1)):
        collect_dataset("Hopper-v5", steps=1500, num_envs=4, seed=seed, name=name, fmt="arrow", store=store, progress=False)
    collect_dataset("Pendulum-v1", steps=400, num_envs=2, seed=0, name="pendulum", fmt="arrow", store=store, progress=False)
    return store


def test_sweep_over_datasets_then_scoreboard(hopper_store: Path, tmp_path: Path, cli) -> None:
    fast = ["--set", "updates=40", "--set", "eval_every=20", "--set", "eval_episodes=2", "--set", "heldout_eval_episodes=3"]
    result = cli(
        "sweep",
        "bc",
        "--dataset",
        "hopper-a,hopper-b",
        "--store",
        hopper_store,
        "--seeds",
        "0,1",
        "--root",
        tmp_path / "sweeps",
        "--name",
        "bc",
        "--workers",
        "1",
        *fast,
    )
    assert result.code == 0, result.err
    runs = tmp_path / "sweeps" / "bc" / "runs"
    assert sorted(p.relative_to(runs).as_posix() for p in runs.glob("*/seed-*")) == [
        f"dataset=hopper-{d}/seed-{s}" for d in "ab" for s in (0, 1)
    ]
    summary = json.loads((tmp_path / "sweeps" / "bc" / "summary.json").read_text())
    assert summary["source"] == "hopper-a,hopper-b" and set(summary["settings"]) == {"dataset=hopper-a", "dataset=hopper-b"}
    for dataset in ("hopper-a", "hopper-b"):
        metrics = json.loads((runs / f"dataset={dataset}" / "seed-1" / "metrics.json").read_text())
        assert (metrics["dataset"], metrics["seed"]) == (dataset, 1)

    published = tmp_path / "published.yaml"
    published.write_text("label: paper\nscores:\n  hopper-a: {bc: 12.5}\n")
    page = tmp_path / "page.md"
    page.write_text(f"# page\n{BLOCK_START}\n{BLOCK_END}\n")
    out = tmp_path / "results"
    result = cli("scoreboard", f"{runs}/*/*", "--datasets", hopper_store, "--out", out, "--published", published, "--markdown", page)
    # the results page, rewritten by `rlpipe report --markdown`, keeps the scoreboard's block
    results_page = tmp_path / "results.md"
    results_page.write_text(f"# Results\n{BLOCK_START}\n{BLOCK_END}\n")
    assert cli("scoreboard", f"{runs}/*/*", "--datasets", hopper_store, "--out", out, "--markdown", results_page).code == 0
    assert cli("report", f"{runs}/*/*", "--out", tmp_path / "report", "--markdown", results_page).code == 0
    table = render_table(json.loads((out / "scores.json").read_text()))
    assert f"{BLOCK_START}\n{table}{BLOCK_END}\n" in results_page.read_text()
    result = cli("scoreboard", f"{runs}/*/*", "--datasets", hopper_store, "--out", out, "--published", published, "--markdown", page)
    assert result.code == 0, result.err
    data = json.loads((out / "scores.json").read_text())
    assert len(data["runs"]) == 4 and set(data["datasets"]) == {"hopper-a", "hopper-b"}
    table = (out / "table.md").read_text()
    assert table == render_table(data) and table in page.read_text()
    assert "| hopper-a | bc | 2 |" in table and table.splitlines()[2].endswith("| 12.5 |")
    assert {p.name for p in out.glob("*.png")} == {"curves-hopper-a.png", "curves-hopper-b.png"}
    # a held-out return is scored with D4RL's Hopper references
    run = data["runs"][0]
    assert run_score(data, run) == pytest.approx(100 * (run["metrics"]["heldout_return_mean"] + 20.272305) / (3234.3 + 20.272305))

    # runs on a dataset without reference returns cannot be scored: one line, exit 2, nothing written
    cli(
        "sweep", "bc", "--dataset", "pendulum", "--store", hopper_store, "--seeds", "0", "--root", tmp_path / "sweeps", "--name", "p", *fast
    )
    result = cli("scoreboard", f"{tmp_path}/sweeps/p/runs/*/*", "--datasets", hopper_store, "--out", tmp_path / "none")
    assert result.code == 2 and "records no reference scores" in result.err and len(result.err.strip().splitlines()) == 1
    assert not (tmp_path / "none").exists()
    # an --out that is a file: one line, exit 2, the file as it was
    (tmp_path / "afile").write_text("mine")
    result = cli("scoreboard", f"{runs}/*/*", "--datasets", hopper_store, "--out", tmp_path / "afile")
    assert result.code == 2 and "is not a directory" in result.err and len(result.err.strip().splitlines()) == 1
    assert (tmp_path / "afile").read_text() == "mine"


def test_iql_reward_scale_makes_the_episode_returns_span_1000(hopper_store: Path) -> None:
    from rlpipe.algos import get_algo
    from rlpipe.datasets.loader import load_dataset
    from rlpipe.training.env import BOX
    from rlpipe.training.offline import load_offline, returns_range_scale

    config = get_algo("iql").make_config("Hopper-v5", dataset="hopper-a", store=str(hopper_store), scale_rewards=True)
    scale = returns_range_scale(load_offline("iql", config, (BOX,)))
    returns = load_dataset("hopper-a", hopper_store).episode_returns()
    assert np.ptp(returns * scale) == pytest.approx(1000.0)


def test_keep_from_adds_earlier_runs_unless_replaced_or_their_dataset_changed(hopper_store: Path, tmp_path: Path, cli) -> None:
    fast = ["--set", "updates=20", "--set", "eval_every=10", "--set", "eval_episodes=1", "--set", "heldout_eval_episodes=2"]
    sweep = ["sweep", "bc", "--dataset", "hopper-a,hopper-b", "--store", hopper_store, "--seeds", "0", "--workers", "1", *fast]
    assert cli(*sweep, "--root", tmp_path / "sweeps", "--name", "bc").code == 0
    runs = tmp_path / "sweeps" / "bc" / "runs"
    first = tmp_path / "first"
    assert cli("scoreboard", f"{runs}/*/*", "--datasets", hopper_store, "--out", first).code == 0
    earlier = json.loads((first / "scores.json").read_text())

    # one run given again, the other kept from the earlier board: the same board
    again = tmp_path / "again"
    result = cli(
        "scoreboard", f"{runs}/dataset=hopper-a/*", "--datasets", hopper_store, "--out", again, "--keep-from", first / "scores.json"
    )
    assert result.code == 0 and "2 runs on 2 datasets" in result.out, result.err
    assert (again / "table.md").read_text() == (first / "table.md").read_text()
    # a kept run of the same dataset, algorithm and seed as a given one is replaced by it
    doubled = copy.deepcopy(earlier)
    doubled["runs"][0]["metrics"]["heldout_return_mean"] = 1e6
    (tmp_path / "doubled.json").write_text(json.dumps(doubled))
    assert cli("scoreboard", f"{runs}/*/*", "--datasets", hopper_store, "--out", again, "--keep-from", tmp_path / "doubled.json").code == 0
    assert (again / "table.md").read_text() == (first / "table.md").read_text()

    # a kept run scored on other data (its dataset's content hash differs) is dropped, and said so
    changed = copy.deepcopy(earlier)
    changed["runs"][1]["metrics"]["dataset_content_hash"] = "0" * 64
    (tmp_path / "changed.json").write_text(json.dumps(changed))
    result = cli(
        "scoreboard", f"{runs}/dataset=hopper-a/*", "--datasets", hopper_store, "--out", again, "--keep-from", tmp_path / "changed.json"
    )
    assert result.code == 0 and "1 runs on 1 datasets; 1 kept runs dropped" in result.out, result.out
    assert set(json.loads((again / "scores.json").read_text())["datasets"]) == {"hopper-a"}

    # no earlier board yet: the given runs alone
    result = cli("scoreboard", f"{runs}/*/*", "--datasets", hopper_store, "--out", again, "--keep-from", tmp_path / "absent.json")
    assert result.code == 0 and (again / "table.md").read_text() == (first / "table.md").read_text()
    # a file that is not a scores.json: one line, exit 2, nothing written
    for broken in ({"runs": [{**earlier["runs"][0], "seed": "zero"}]}, {"runs": [{"algo": "bc"}]}, [1, 2]):
        (tmp_path / "broken.json").write_text(json.dumps(broken))
        result = cli("scoreboard", "--datasets", hopper_store, "--out", tmp_path / "none", "--keep-from", tmp_path / "broken.json")
        assert result.code == 2 and "is not a scoreboard's scores.json" in result.err and len(result.err.strip().splitlines()) == 1
        assert not (tmp_path / "none").exists()


def test_rows_whose_runs_predate_their_stage_code_are_marked_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--stale-from`: a run under the outputs of a stage whose recorded code changed is
    marked, with what changed; a run of a stage whose code is as recorded is not."""
    import hashlib

    from rlpipe.commands import stage_deps
    from rlpipe.commands.scoreboard import mark_stale

    (tmp_path / "rlpipe").mkdir()
    (tmp_path / "rlpipe" / "iql.py").write_text("changed since the run\n")
    (tmp_path / "rlpipe" / "bc.py").write_text("as recorded\n")
    pipeline = tmp_path / "profile"
    pipeline.mkdir()
    (pipeline / "params.yaml").write_text("{}\n")
    (pipeline / "dvc.yaml").write_text("stages:\n  train_offline-iql: {}\n  train_offline-bc: {}\n")
    recorded = {"iql": hashlib.md5(b"the code the run used\n").hexdigest(), "bc": hashlib.md5(b"as recorded\n").hexdigest()}
    lock = {
        "stages": {
            f"train_offline-{algo}@{algo}": {"deps": [{"path": f"../rlpipe/{algo}.py", "md5": md5}], "outs": [{"path": f"sweeps/{algo}"}]}
            for algo, md5 in recorded.items()
        }
    }
    (pipeline / "dvc.lock").write_text(yaml.safe_dump(lock))
    monkeypatch.setattr(stage_deps, "REPO", tmp_path)
    data = board()
    data["runs"].append(_run("bc", "hopper-medium", 1, 380.0, [380.0]))
    for run in data["runs"]:
        run["path"] = f"sweeps/{run['algo']}/runs/default/seed-{run['seed']}"
    mark_stale(data["runs"], pipeline)
    assert {run["algo"]: run["stale"] for run in data["runs"]} == {"iql": ["../rlpipe/iql.py"], "bc": []}
    table = render_table(data)
    assert "| hopper-medium | iql (stale: 3 of 3 runs predate their code) | 3 |" in table and "| hopper-medium | bc | 2 |" in table
    with pytest.raises(RlpipeError, match="not a DVC pipeline"):
        mark_stale(data["runs"], tmp_path / "elsewhere")
