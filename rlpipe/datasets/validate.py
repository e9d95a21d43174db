"""Re-checking a stored dataset: files, sizes, content hash, Arrow schema and row counts."""

from __future__ import annotations

import pyarrow as pa

from rlpipe.datasets.schema import step_schema
from rlpipe.datasets.store import DatasetInfo, hash_files, layout_problems
from rlpipe.errors import RlpipeError


def validate_dataset(info: DatasetInfo) -> list[str]:
    """Return a list of problems (empty when the dataset is intact)."""
    problems = []
    recorded = info.metadata["files"]
    missing = [rel for rel in recorded if not (info.path / rel).is_file()]
    problems += [f"missing file {rel}" for rel in missing]
    problems += [problem for problem in layout_problems(info) if problem.startswith("stray file")]
    present = [rel for rel in recorded if rel not in missing]
    actual, content_hash = hash_files(info.path, present)
    for rel, facts in actual.items():
        if facts != recorded[rel]:
            problems.append(f"{rel} does not match its recorded size/sha256 (modified or truncated)")
    if not missing and content_hash != info.metadata["content_hash"]:
        problems.append("content hash differs from metadata")
    expected = step_schema(info.observation_space, info.action_space, info.metadata.get("multi_agent", False))
    rows = 0
    for path in info.shard_paths:
        if not path.is_file():
            continue
        try:
            reader = pa.ipc.open_file(pa.memory_map(str(path), "r"))
            if not reader.schema.equals(expected):
                problems.append(f"{path.name}: schema differs from the one the spaces imply")
            rows += sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))
        except (pa.ArrowInvalid, OSError) as exc:
            problems.append(f"{path.name}: unreadable Arrow IPC file ({exc})")
    if not missing and rows != info.metadata["total_steps"]:
        problems.append(f"shards hold {rows} rows, metadata says {info.metadata['total_steps']}")
    return problems


def require_valid(info: DatasetInfo) -> None:
    """Raise a one-line error naming the first problem, if any."""
    problems = validate_dataset(info)
    if problems:
        raise RlpipeError(f"dataset {info.name!r} is corrupted: {problems[0]}" + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""))
