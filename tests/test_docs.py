"""The documentation: the site builds strictly, the CLI reference and the results page are
what their generators print, and no page keeps a lab notebook."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_cli_reference_is_generated_from_the_commands() -> None:
    from rlpipe.cli.reference import reference

    assert (REPO / "docs" / "cli.md").read_text() == reference(), "run: python -m rlpipe.cli.reference > docs/cli.md"


@pytest.mark.skipif(shutil.which("mkdocs", path=str(Path(sys.executable).parent)) is None, reason="mkdocs is not installed")
def test_docs_site_builds_strictly(tmp_path: Path) -> None:
    mkdocs = Path(sys.executable).parent / "mkdocs"
    run = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").is_file()


def test_results_page_is_generated_from_the_committed_metrics(tmp_path: Path) -> None:
    from rlpipe.commands.report import write_report

    if not list((REPO / "models").glob("*/metrics.json")):
        pytest.skip("no pipeline metrics are committed: run make repro, then make results")
    estimates = sorted((REPO / "ope").glob("*.json"))  # the pipeline's FQE estimates, committed with the metrics
    page = tmp_path / "results.md"
    page.write_text((REPO / "docs" / "results.md").read_text())  # its D4RL block (rlpipe scoreboard's) is kept
    write_report([str(REPO / "models" / "*")], tmp_path / "report", markdown=page, ope_files=estimates)
    assert (REPO / "docs" / "results.md").read_text() == page.read_text(), "run: make results"


def test_readme_is_a_front_door() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    assert "make repro" in readme and "make test" in readme


NOTEBOOK = re.compile(r"\b(session \d+|sessions? [0-9]+-[0-9]+|round of work|issue \d+)\b", re.IGNORECASE)


def test_no_page_speaks_of_rounds_of_work() -> None:
    """History lives in git and CHANGELOG.md; the guide states current facts."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    found = [
        f"{page.relative_to(REPO)}:{n}: {line.strip()[:80]}"
        for page in pages
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if NOTEBOOK.search(line)
    ]
    assert not found, "\n".join(found)
    assert not (REPO / "notes").exists()


def test_every_page_fits_a_reader() -> None:
    """A page a reader opens stays under 400 lines; the evidence behind it goes to experiments/ pages."""
    long = {
        str(page.relative_to(REPO)): n for page in sorted((REPO / "docs").rglob("*.md")) if (n := len(page.read_text().splitlines())) > 400
    }
    assert not long, f"pages over 400 lines: {long}"
