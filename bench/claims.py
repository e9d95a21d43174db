"""Every learning test's claim on seeds no tuning used: each test that takes a training seed
(tests/conftest.py's `learning_seed`) asserts a mechanism's effect (A beats B by M, a control
stays under a bar); this runs them on the given seeds and tabulates, per claim, each seed's
recorded returns and how many seeds hold.

    .venv/bin/python bench/claims.py run --seeds 5-9 --marker heavy --out bench/results/claims-heavy.json
    .venv/bin/python bench/claims.py run --seeds 5-9 --marker slow --out bench/results/claims-slow.json
    .venv/bin/python bench/claims.py table bench/results/claims-heavy.json   # the markdown table again

`run` calls pytest with RLPIPE_TEST_SEED and RLPIPE_TEST_RECORD (each test's recorded
returns, appended as it finishes, so a partial sweep keeps what ran), two processes; the
JSON holds every record and the per-claim summary. A test that asserts no per-seed bar but a
mean over seeds is still run per seed: its records are the data for that mean.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_SEED_PARAM = re.compile(r"seed(\d+)")


def parse_seeds(text: str) -> list[int]:
    """``5-9`` or ``0,3,7`` as a list of seeds."""
    if "-" in text:
        first, last = (int(part) for part in text.split("-"))
        return list(range(first, last + 1))
    return [int(part) for part in text.split(",")]


def claim_of(node: str) -> tuple[str, int | None]:
    """A test id without its seed parameter (the claim), and the seed."""
    match = re.search(r"\[(.*)\]$", node)
    if not match:
        return node, None
    params = match.group(1).split("-")
    seeds = [int(m.group(1)) for p in params if (m := _SEED_PARAM.fullmatch(p))]
    rest = [p for p in params if not _SEED_PARAM.fullmatch(p)]
    base = node[: match.start()] + (f"[{'-'.join(rest)}]" if rest else "")
    return base, seeds[0] if seeds else None


def summarise(records: list[dict]) -> dict[str, dict]:
    """Per claim: each seed's outcome and recorded values, and how many seeds passed."""
    claims: dict[str, dict] = {}
    for record in records:
        claim, seed = claim_of(record["test"])
        values = {key: value for key, value in record.items() if key not in ("test", "outcome")}
        entry = claims.setdefault(claim, {"seeds": {}, "passed": 0, "ran": 0})
        entry["seeds"][str(seed)] = {"outcome": record["outcome"], **values}
        entry["ran"] += 1
        entry["passed"] += record["outcome"] == "passed"
    return dict(sorted(claims.items()))


def markdown(claims: dict[str, dict]) -> str:
    """One row per claim: the test, how many seeds hold, each seed's recorded values."""
    lines = ["| claim (test) | seeds holding | per seed |", "|---|---|---|"]
    for claim, entry in claims.items():
        per_seed = "; ".join(
            f"{seed}: {'' if v['outcome'] == 'passed' else 'FAILED '}{_values(v)}" for seed, v in sorted(entry["seeds"].items())
        )
        lines.append(f"| `{claim.split('::')[-1]}` | {entry['passed']}/{entry['ran']} | {per_seed} |")
    return "\n".join(lines)


def _values(values: dict) -> str:
    shown = {key: value for key, value in values.items() if key != "outcome"}
    return json.dumps(shown, separators=(",", ":"), default=str).replace("|", "/")[:300]


def run(seeds: list[int], marker: str, out: Path, workers: int, tests: str | None = None) -> dict[str, dict]:
    """Run the learning tests carrying ``marker`` (and matching the ``-k`` expression
    ``tests``) on ``seeds``; write and return the summary."""
    with tempfile.TemporaryDirectory() as folder:
        record = Path(folder) / "records.jsonl"
        env = {**os.environ, "RLPIPE_TEST_SEED": ",".join(map(str, seeds)), "RLPIPE_TEST_RECORD": str(record)}
        selected = " or ".join(f"seed{seed}" for seed in seeds)
        if tests:
            selected = f"({selected}) and ({tests})"
        command = [sys.executable, "-m", "pytest", "-q", "-n", str(workers), "--dist", "loadgroup", "-m", marker, "-k", selected]
        completed = subprocess.run(command, cwd=ROOT, env=env)
        records = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    claims = summarise(records)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {"seeds": seeds, "marker": marker, "tests": tests, "pytest_exit": completed.returncode, "claims": claims, "records": records}
    out.write_text(json.dumps(report, indent=1) + "\n")
    return claims


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    running = commands.add_parser("run", help="run the learning tests on seeds and write the JSON")
    running.add_argument("--seeds", default="5-9")
    running.add_argument("--marker", default="heavy", help="pytest marker expression: heavy, slow, 'slow or heavy'")
    running.add_argument("--out", type=Path, required=True)
    running.add_argument("--workers", type=int, default=2)
    running.add_argument("--tests", help="a pytest -k expression narrowing the tests, e.g. 'mopo or rebrac'")
    tabling = commands.add_parser("table", help="print a written JSON's table")
    tabling.add_argument("path", type=Path)
    tabling.add_argument("--records", type=Path, help="summarise a RLPIPE_TEST_RECORD file instead and write it into PATH")
    args = parser.parse_args()
    if args.command == "run":
        claims = run(parse_seeds(args.seeds), args.marker, args.out, args.workers, args.tests)
    elif args.records is not None:
        records = [json.loads(line) for line in args.records.read_text().splitlines()]
        claims = summarise(records)
        args.path.parent.mkdir(parents=True, exist_ok=True)
        args.path.write_text(json.dumps({"claims": claims, "records": records}, indent=1) + "\n")
    else:
        claims = json.loads(args.path.read_text())["claims"]
    print(markdown(claims))


if __name__ == "__main__":
    main()
