"""docs/your-own-data.md runs as printed: its Python and shell blocks, in order, in an empty
directory with rlpipe's executables first on PATH."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "your-own-data.md"


def page_script(folder: Path) -> str:
    """The page's blocks as one shell script: each Python block a file run by this interpreter."""
    lines = ["set -euo pipefail"]
    for number, (language, code) in enumerate(re.findall(r"^```(python|bash)\n(.*?)^```", PAGE.read_text(), flags=re.M | re.S)):
        if language == "python":
            (folder / f"block{number}.py").write_text(code)
            lines.append(f"{sys.executable} block{number}.py")
        elif not code.startswith(".venv/bin/python bench/"):  # the measurement's command, not the walkthrough's
            lines.append(code)
    return "\n".join(lines)


@pytest.mark.heavy  # a minute: IQL's 3000 updates and FQE of its six copies
def test_the_page_runs_as_printed(tmp_path: Path) -> None:
    env = {**{k: v for k, v in os.environ.items() if k != "RLPIPE_DATASETS"}, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    run = subprocess.run(["bash", "-c", page_script(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    metrics = json.loads((tmp_path / "runs" / "iql-tank" / "metrics.json").read_text())
    assert metrics["env_id"] == "" and metrics["select_by"] == "fqe" and len(metrics["checkpoints"]) == 6
    assert re.search(r"level 0\.5, no inflow: valve [+-]\d\.\d\d", run.stdout)
    assert (tmp_path / "report" / "fqe-tank.png").is_file()
