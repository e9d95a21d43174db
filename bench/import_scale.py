"""Importing a large table of logged transitions: throughput and memory against the table's size.

Writes a Parquet table of ``--gigabytes`` of transitions (17 float32 observation values and 6
float32 action values a row, as Hopper's and HalfCheetah's; episode and step columns; 1000-step
episodes; no next observations, so the import derives them), then runs
``rlpipe datasets import FILE --from parquet --format arrow`` in a child process and reports
its wall time, MB/s of Parquet read, rows/s and peak resident set (the child's ``ru_maxrss``).
The import streams record batches and writes shards of at most 256 MiB, so its memory should
not grow with the table.

    .venv/bin/python bench/import_scale.py --gigabytes 10 --workdir /tmp/import-scale
    .venv/bin/python bench/import_scale.py --gigabytes 0.05          # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import _common  # noqa: F401  (sets thread limits before numpy/torch are imported)
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from _common import machine_description, today

OBS, ACT, EPISODE = 17, 6, 1000
ROWS_PER_GROUP = 1_000_000  # a whole number of episodes


def write_table(path: Path, gigabytes: float) -> int:
    """A Parquet table of about ``gigabytes`` on disk; returns its rows."""
    rng = np.random.default_rng(0)
    writer = None
    rows = 0
    try:
        while not path.exists() or path.stat().st_size < gigabytes * 1e9:
            n = ROWS_PER_GROUP
            obs = rng.standard_normal((n, OBS), dtype=np.float32)
            act = rng.uniform(-1, 1, (n, ACT)).astype(np.float32)
            step = np.tile(np.arange(EPISODE, dtype=np.int64), n // EPISODE)
            table = pa.table(
                {
                    "episode_id": np.repeat(np.arange(rows // EPISODE, (rows + n) // EPISODE, dtype=np.int64), EPISODE),
                    "step": step,
                    "obs": pa.FixedSizeListArray.from_arrays(pa.array(obs.reshape(-1)), OBS),
                    "action": pa.FixedSizeListArray.from_arrays(pa.array(act.reshape(-1)), ACT),
                    "reward": rng.standard_normal(n, dtype=np.float32),
                    "terminated": np.zeros(n, bool),
                    "truncated": step == EPISODE - 1,
                }
            )
            writer = writer or pq.ParquetWriter(path, table.schema)
            writer.write_table(table)
            rows += n
    finally:
        if writer is not None:
            writer.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gigabytes", type=float, default=10.0)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/import-scale"))
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "import_scale.json")
    args = parser.parse_args()
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    table = args.workdir / "transitions.parquet"
    rows = write_table(table, args.gigabytes)
    size = table.stat().st_size
    command = [sys.executable, "-m", "rlpipe", "datasets", "import", str(table), "--from", "parquet", "--name", "big"]
    command += ["--store", str(args.workdir / "store"), "--format", "arrow"]
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"import failed: {child.stderr.read().decode() if child.stderr else ''}")
    result = {
        "date": today(),
        "machine": machine_description(),
        "rows": rows,
        "parquet_bytes": size,
        "wall_seconds": round(wall, 1),
        "mb_per_second": round(size / 1e6 / wall, 1),
        "rows_per_second": round(rows / wall),
        "peak_rss_mib": round(usage.ru_maxrss / 1024),
        "stored_bytes": sum(p.stat().st_size for p in (args.workdir / "store").rglob("*") if p.is_file()),
    }
    print(json.dumps(result, indent=2))
    if args.gigabytes >= 1:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out}")
    shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
