"""`rlpipe report`: PNG learning curves and the HTML comparison page over run directories."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from rlpipe.commands.report import CURVE_FILE, find_runs, group_runs, load_run, read_diagnostics, spearman, write_report


def assert_not_blank(path: Path) -> None:
    """The image has pixel variance and more than one colour."""
    pixels = np.asarray(Image.open(path).convert("RGB"))
    assert pixels.std() > 0
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 1


def fake_run(
    root: Path,
    name: str,
    seed: int,
    curve: list[tuple[int, float]],
    *,
    algo: str = "sac",
    lr: float = 1e-3,
    dataset: str | None = None,
    success: float | None = None,
    heldout: float | None = None,
    sha: str | None = None,
) -> Path:
    """A run directory laid out as `rlpipe train` writes it (metrics, config, DVCLive TSV)."""
    run = root / name
    (run / CURVE_FILE).parent.mkdir(parents=True)
    (run / CURVE_FILE).write_text("step\treturn_mean\n" + "".join(f"{x}\t{y}\n" for x, y in curve))
    offline = dataset is not None
    metrics = {
        "algo": algo,
        "env_id": "Pendulum-v1",
        "seed": seed,
        "eval_return_mean": curve[-1][1],
        "eval_return_std": 5.0,
        "eval_episodes": 10,
        "env_steps": 0 if offline else curve[-1][0],
        "gradient_updates": curve[-1][0],
        "wall_seconds": 3.0,
        **({"dataset": dataset} if offline else {}),
        **({} if success is None else {"eval_success_rate": success}),
        **({} if heldout is None else {"heldout_return_mean": heldout, "heldout_return_std": 7.0, "heldout_episodes": 100}),
        **({} if sha is None else {"checkpoint_sha256": sha}),
    }
    (run / "metrics.json").write_text(json.dumps(metrics))
    (run / "checkpoint.json").write_text(json.dumps({"config": {"seed": seed, "actor_lr": lr, "env_id": "Pendulum-v1"}}))
    return run


def test_runs_differing_only_by_seed_form_one_group(tmp_path: Path) -> None:
    fake_run(tmp_path, "sac-s0", 0, [(1000, -900.0), (2000, -300.0)])
    fake_run(tmp_path, "sac-s1", 1, [(1000, -700.0), (2000, -100.0)])
    fake_run(tmp_path, "sac-lr", 0, [(1000, -800.0), (2000, -500.0)], lr=3e-4)  # another setting
    fake_run(tmp_path, "cql", 0, [(500, -600.0), (1000, -200.0)], algo="cql", dataset="pendulum-mixed")
    paths, skipped = find_runs([str(tmp_path / "*")])
    groups = {group.label: group for group in group_runs([load_run(p) for p in paths])}
    assert skipped == [] and sorted(groups) == ["cql", "sac", "sac-lr"]
    assert [run.seed for run in groups["sac"].runs] == [0, 1]
    x, mean, low, high = groups["sac"].mean_curve()
    assert x.tolist() == [1000, 2000] and mean.tolist() == [-800.0, -200.0]
    assert low.tolist() == [-900.0, -300.0] and high.tolist() == [-700.0, -100.0]
    assert groups["cql"].first.unit == "updates" and groups["sac"].first.unit == "env steps"


def test_report_writes_table_and_curves(tmp_path: Path, cli) -> None:
    runs = tmp_path / "models"
    fake_run(runs, "sac-s0", 0, [(1000, -900.0), (2000, -300.0)], heldout=-350.0)
    fake_run(runs, "sac-s1", 1, [(1000, -700.0), (2000, -100.0)], heldout=-150.0)
    fake_run(runs, "cql", 0, [(500, -600.0), (1000, -200.0)], algo="cql", dataset="pendulum-mixed", success=0.5, heldout=-210.0)
    (runs / "unfinished").mkdir()  # a glob skips it (and says so); naming it is an error
    res = cli("report", str(runs / "*"), "--out", tmp_path / "report")
    assert res.code == 0, res.err
    assert "3 runs in 2 groups, 2 figures" in res.out and "skipped" in res.err
    page = (tmp_path / "report" / "index.html").read_text()
    assert "-200.0 ± 100.0 (over seeds)" in page  # the two sac seeds' final means: -300, -100
    assert "<th>held-out return</th>" in page and "-250.0 ± 100.0 (over seeds)" in page and "-210.0 ± 7.0" in page
    assert "pendulum-mixed (Pendulum-v1)" in page and "0.50" in page
    pngs = sorted((tmp_path / "report").glob("*.png"))
    assert [p.name for p in pngs] == ["curves-pendulum-v1-env-steps.png", "curves-pendulum-v1-updates.png"]
    for png in pngs:
        assert f'src="{png.name}"' in page
        assert_not_blank(png)


def test_report_of_a_real_training_run(tmp_path: Path, cli) -> None:
    from rlpipe.algos import get_algo

    ppo = get_algo("ppo")
    ppo.train(ppo.make_config("CartPole-v1", env_steps=2048, eval_every=1024, eval_episodes=2), tmp_path / "ppo", progress=False)
    res = cli("report", tmp_path / "ppo", "--out", tmp_path / "report")
    assert res.code == 0, res.err
    pngs = sorted(path.name for path in (tmp_path / "report").glob("*.png"))
    assert pngs == ["curves-cartpole-v1-env-steps.png", "diagnostics-ppo.png"], pngs
    for png in pngs:
        assert_not_blank(tmp_path / "report" / png)
    assert len(load_run(tmp_path / "ppo").steps) >= 2  # the DVCLive curve, not only the final point
    diagnostics = read_diagnostics(tmp_path / "ppo")  # what the second figure plots
    assert {"policy_loss", "value_loss", "approx_kl", "clip_fraction", "eval/length_mean"} <= set(diagnostics), sorted(diagnostics)
    assert all(len(steps) == 2 and np.isfinite(values).all() for steps, values in diagnostics.values())


@pytest.mark.parametrize("how", ["glob", "named", "parent"])
def test_an_unfinished_run_is_skipped_with_one_line_and_the_others_reported(tmp_path: Path, cli, how: str) -> None:
    runs = tmp_path / "models"
    fake_run(runs, "sac-s0", 0, [(1000, -900.0), (2000, -300.0)])
    fake_run(runs, "sac-s1", 1, [(1000, -700.0), (2000, -100.0)])
    (
        fake_run(runs, "sac-s2", 2, [(1000, -500.0)]) / "metrics.json"
    ).unlink()  # killed before its end: dvclive/ holds DVCLive's own metrics.json
    named = {"glob": [str(runs / "*")], "named": [runs / "sac-s0", runs / "sac-s1", runs / "sac-s2"], "parent": [runs]}[how]
    res = cli("report", *named, "--out", tmp_path / "report")
    assert res.code == 0, res.err
    assert res.err.strip().splitlines() == [f"skipped {runs / 'sac-s2'}: no metrics.json (not a finished run)"]
    assert "2 runs in 1 groups" in res.out and "-200.0 ± 100.0 (over seeds)" in (tmp_path / "report" / "index.html").read_text()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda root: [], "no runs given"),
        (lambda root: [str(root / "nothing-*")], "no run directories match"),
        (lambda root: [str(root / "empty")], "has no metrics.json"),
        (lambda root: [str(root / "empty" / "*")], "no finished runs"),
        (lambda root: [str(root / "unfinished")], "no finished runs"),
    ],
)
def test_report_bad_input_is_one_line(tmp_path: Path, cli, make, message: str) -> None:
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    (fake_run(tmp_path, "unfinished", 0, [(1000, -900.0)]) / "metrics.json").unlink()
    res = cli("report", *make(tmp_path), "--out", tmp_path / "report")
    assert res.code == 2 and message in res.err and len(res.err.strip().splitlines()) == 1
    assert not (tmp_path / "report").exists()


def test_report_refuses_a_broken_curve(tmp_path: Path) -> None:
    run = fake_run(tmp_path, "sac", 0, [(1000, -900.0)])
    (run / CURVE_FILE).write_text("step\treturn_mean\n1000\tnot-a-number\n")
    from rlpipe.errors import RlpipeError

    with pytest.raises(RlpipeError, match="cannot read the eval curve"):
        write_report([str(run)], tmp_path / "report")


def test_report_markdown_and_dataset_cards(tmp_path: Path, cli) -> None:
    runs, store = tmp_path / "runs", tmp_path / "datasets"
    fake_run(runs, "sac-s0", 0, [(1000, -900.0), (2000, -300.0)], heldout=-310.0)
    fake_run(runs, "bc", 0, [(500, -400.0)], algo="bc", dataset="pendulum-random", heldout=-420.0)
    assert cli("collect", "--env", "Pendulum-v1", "--episodes", "6", "--num-envs", "2", "--store", store, "--quiet").code == 0
    assert cli("datasets", "filter", "pendulum-random", "--top-return", "50%", "--name", "best-half", "--store", store).code == 0
    result = cli("report", f"{runs}/*", "--out", tmp_path / "report", "--datasets", store, "--markdown", tmp_path / "results.md")
    assert result.code == 0, result.err
    table = (tmp_path / "results.md").read_text().splitlines()
    rows = [line for line in table if line.startswith("|")]
    assert table[0] == "# Results" and rows[0].startswith("| run | algo |") and len(rows) == 4 and "-310.0 ± 7.0" in "".join(rows)
    assert not any("scoreboard" in line for line in table)  # a page without a scoreboard block gets none
    page = (tmp_path / "report" / "index.html").read_text()
    assert "<h2>Datasets</h2>" in page and "best-half" in page and "filter(top_return=50%)" in page
    for name in ("pendulum-random", "best-half"):
        assert_not_blank(tmp_path / "report" / f"dataset-{name}.png")


def ope_record(sha: str, estimate: float, dataset: str = "pendulum-mixed") -> dict:
    """One entry of an `rlpipe ope fqe --out` file."""
    return {
        "run": sha,
        "dataset": dataset,
        "checkpoint_sha256": sha,
        "estimate": estimate,
        "standard_error": 1.5,
        "config": {"gamma": 0.99},
    }


def test_report_shows_fqe_estimates_beside_held_out_returns(tmp_path: Path, cli) -> None:
    runs = tmp_path / "runs"
    fake_run(runs, "sac-s0", 0, [(1000, -300.0)], heldout=-150.0, sha="a")
    fake_run(runs, "sac-s1", 1, [(1000, -200.0)], heldout=-170.0, sha="b")
    fake_run(runs, "bc", 0, [(500, -400.0)], algo="bc", dataset="pendulum-mixed", heldout=-420.0, sha="c")
    fake_run(runs, "cql", 0, [(500, -900.0)], algo="cql", dataset="pendulum-mixed", heldout=-800.0, sha="d")
    estimates = tmp_path / "fqe.json"
    # c's estimate ranks it above a and b, which held out better: three of four pairs agree.
    records = [ope_record("a", -20.0), ope_record("b", -30.0), ope_record("c", -10.0), ope_record("d", -90.0), ope_record("old", 0.0)]
    estimates.write_text(json.dumps(records))
    result = cli("report", f"{runs}/*", "--out", tmp_path / "report", "--ope", estimates, "--markdown", tmp_path / "results.md")
    assert result.code == 0, result.err
    page = (tmp_path / "report" / "index.html").read_text()
    assert "<th>FQE on pendulum-mixed</th>" in page
    assert "-25.0 ± 5.0 (over seeds)" in page and "-10.0 ± 1.5" in page and "-90.0 ± 1.5" in page
    rho = spearman([-20, -30, -10, -90], [-150, -170, -420, -800])
    assert f"against the held-out returns of 4 runs: Spearman rank correlation {rho:+.2f}" in page
    markdown = (tmp_path / "results.md").read_text()
    assert "FQE on pendulum-mixed |" in markdown and f"{rho:+.2f}" in markdown
    # Without --ope the table has no FQE column.
    assert cli("report", f"{runs}/*", "--out", tmp_path / "plain").code == 0
    assert "FQE" not in (tmp_path / "plain" / "index.html").read_text()


@pytest.mark.parametrize("text", ["{", "[{}]", '[{"dataset": "d", "estimate": NaN}]', '{"a": 1}'])
def test_report_refuses_a_bad_ope_file_in_one_line(tmp_path: Path, cli, text: str) -> None:
    fake_run(tmp_path / "runs", "sac", 0, [(1000, -300.0)], heldout=-150.0, sha="a")
    (tmp_path / "fqe.json").write_text(text)
    result = cli("report", tmp_path / "runs" / "sac", "--out", tmp_path / "report", "--ope", tmp_path / "fqe.json")
    assert result.code == 2 and "fqe.json" in result.err and len(result.err.strip().splitlines()) == 1
    assert not (tmp_path / "report").exists()


def test_report_replaces_a_planted_link_instead_of_writing_through_it(tmp_path: Path, cli) -> None:
    fake_run(tmp_path / "runs", "sac", 0, [(1000, -900.0), (2000, -300.0)])
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    out = tmp_path / "report"
    out.mkdir()
    (out / "curves-pendulum-v1-env-steps.png").symlink_to(victim)
    assert cli("report", tmp_path / "runs" / "sac", "--out", out).code == 0
    assert victim.read_text() == "keep" and not (out / "curves-pendulum-v1-env-steps.png").is_symlink()
    assert_not_blank(out / "curves-pendulum-v1-env-steps.png")


def test_spearman_ranks_ties_by_their_mean_rank() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 2, 3], [5, 5, 6, 7]) == pytest.approx(1.0)  # tied at rank 0.5 in both


def _browser() -> str | None:
    import shutil

    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(_browser() is None, reason="no chromium on PATH (`make test` installs Debian's chromium where apt-get can)")
def test_report_renders_in_a_headless_browser(tmp_path: Path, cli) -> None:
    """The page opens in a real browser, every image loads, and the screenshot is not blank."""
    import subprocess

    runs = tmp_path / "runs"
    fake_run(runs, "sac-s0", 0, [(1000, -900.0), (2000, -300.0)], heldout=-310.0)
    fake_run(runs, "sac-s1", 1, [(1000, -800.0), (2000, -250.0)], heldout=-260.0)
    store = tmp_path / "datasets"
    assert cli("collect", "--env", "Pendulum-v1", "--episodes", "4", "--num-envs", "2", "--store", store, "--quiet").code == 0
    out = tmp_path / "report"
    assert cli("report", f"{runs}/*", "--out", out, "--datasets", store).code == 0
    # A copy of the page that records, once loaded, whether every image decoded.
    probe = out / "probe.html"
    probe.write_text(
        (out / "index.html")
        .read_text()
        .replace(
            "</body>",
            "<script>window.addEventListener('load', () => document.body.dataset.images = "
            "[...document.images].every(i => i.complete && i.naturalWidth > 0) ? 'loaded' : 'broken');</script></body>",
        )
    )
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--virtual-time-budget=5000"]
    dom = subprocess.run([_browser(), *flags, "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120)
    assert 'data-images="loaded"' in dom.stdout, dom.stderr[-2000:]
    assert dom.stdout.count("<img") == 2  # one curve figure (two seeds, one group) and one dataset card
    shot = tmp_path / "shot.png"
    subprocess.run(
        [_browser(), *flags, f"--screenshot={shot}", "--window-size=1200,1600", (out / "index.html").as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert_not_blank(shot)
