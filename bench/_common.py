"""Helpers shared by the benchmarks in bench/: thread limits, core pinning, page-cache
eviction of our own files, machine description and plain-text tables.

Import this module before numpy/torch so the thread limits apply to their pools.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS"):
    os.environ.setdefault(_var, "1")
# jax (pulled in by minari's DataCollector) must not grab an accelerator or pre-allocate memory.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import datetime as _dt
import platform
import statistics
import time
from collections.abc import Iterable, Sequence
from pathlib import Path


def limit_threads() -> None:
    """One intra-op thread for torch (numpy/BLAS are limited through the environment above)."""
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:  # torch is a runtime dependency, but the helpers do not need it
        pass


def _cpu_times() -> dict[int, tuple[int, int]]:
    times = {}
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu") and line[3:4].isdigit():
            fields = line.split()
            values = [int(v) for v in fields[1:]]
            idle = values[3] + (values[4] if len(values) > 4 else 0)
            times[int(fields[0][3:])] = (idle, sum(values))
    return times


def least_busy_core(window: float = 0.5) -> int:
    """The allowed core with the most idle time over a short window (another process may hold one)."""
    allowed = sorted(os.sched_getaffinity(0))
    try:
        before = _cpu_times()
        time.sleep(window)
        after = _cpu_times()
    except OSError:
        return allowed[0]

    def idle_share(core: int) -> float:
        if core not in before or core not in after:
            return 0.0
        idle = after[core][0] - before[core][0]
        total = after[core][1] - before[core][1]
        return idle / total if total else 1.0

    return max(allowed, key=idle_share)


def core_loads(window: float = 0.5) -> dict[int, float]:
    """Busy share of each core over a short window (what else runs on the machine)."""
    before = _cpu_times()
    time.sleep(window)
    after = _cpu_times()
    loads = {}
    for core in sorted(after):
        idle = after[core][0] - before[core][0]
        total = after[core][1] - before[core][1]
        loads[core] = 1.0 - idle / total if total else 0.0
    return loads


class pinned:
    """Context manager: run the current process on `cores` only, restoring the old mask after."""

    def __init__(self, cores: Iterable[int] | None) -> None:
        self.cores = None if cores is None else set(cores)
        self.saved: set[int] | None = None

    def __enter__(self) -> pinned:
        if self.cores is not None:
            self.saved = os.sched_getaffinity(0)
            os.sched_setaffinity(0, self.cores)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.saved is not None:
            os.sched_setaffinity(0, self.saved)


def evict_from_page_cache(paths: Iterable[Path]) -> None:
    """Drop our own files from the OS page cache (fsync, then POSIX_FADV_DONTNEED).

    Needs no privileges and touches nothing but the given files, so a following read is cold.
    """
    for path in paths:
        path = Path(path)
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        for file in files:
            fd = os.open(file, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def machine_description() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 2**20:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return f"{os.cpu_count()} cores ({cpu}){mem}, Linux {platform.release()}, Python {platform.python_version()}"


def versions(*modules: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    parts = []
    for name in modules:
        try:
            parts.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            parts.append(f"{name} (not installed)")
    return ", ".join(parts)


def pinned_setup(core: int, *packages: str) -> str:
    """Lines describing a side-by-side run: machine, package versions, the core both
    contenders are pinned to (one torch thread each) and what else loads the cores."""
    loads = ", ".join(f"{c}: {load:.0%}" for c, load in core_loads().items())
    return (
        f"machine: {machine_description()}\nversions: {versions(*packages)}\n"
        f"torch threads: 1 for both, pinned to core {core}; core loads before start: {loads}"
    )


def random_dataset(store: Path, env_id: str, name: str, steps: int) -> None:
    """A random-policy dataset of at least `steps` transitions (whole episodes, 8 envs,
    seed 0, Arrow only) named `name` in `store`: the data the speed checks train on."""
    from rlpipe.commands.collect import collect_dataset

    collect_dataset(env_id, steps=steps, num_envs=8, seed=0, name=name, fmt="arrow", store=store, progress=False)


def today() -> str:
    return _dt.date.today().isoformat()


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table (also readable as plain text)."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "| " + " | ".join(cell.ljust(width) for cell, width in zip(row, widths)) + " |"

    out = [line(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(row) for row in cells[1:]]
    return "\n".join(out)
