"""Re-checking a stored dataset: files, sizes and content hash, then every check loading runs
(`rlpipe.datasets.checks`, through the loader's `ShardVerifier`), then the Minari HDF5 copy
against the Arrow data (docs/dataset-format.md)."""

from __future__ import annotations

from rlpipe.datasets.hdf5 import hdf5_problems
from rlpipe.datasets.loader import ShardVerifier, info_space_of
from rlpipe.datasets.store import METADATA_FILE, MINARI_DIR, DatasetInfo, hash_files, layout_problems
from rlpipe.envs import trusted_env_id, trusted_env_spec
from rlpipe.errors import RlpipeError


def validate_dataset(info: DatasetInfo) -> list[str]:
    """Return a list of problems (empty when the dataset is intact)."""
    problems, missing = file_problems(info)
    problems += row_problems(info, missing)
    if info.hdf5_path is not None and not problems:  # compared with the Arrow data only once that is sound
        problems += hdf5_problems(info, info_space_of(info))
    return problems


def file_problems(info: DatasetInfo) -> tuple[list[str], list[str]]:
    """Missing and stray files, files whose size or sha256 differs from metadata, and the
    content hash; also returns the missing files."""
    recorded = info.metadata["files"]
    missing = [rel for rel in recorded if not (info.path / rel).is_file()]
    problems = [f"missing file {rel}" for rel in missing]
    problems += [problem for problem in layout_problems(info) if problem.startswith("stray file")]
    present = [rel for rel in recorded if rel not in missing]
    actual, content_hash = hash_files(info.path, present)
    for rel, facts in actual.items():
        if facts != recorded[rel]:
            problems.append(f"{rel} does not match its recorded size/sha256 (modified or truncated)")
    if not missing and content_hash != info.metadata["content_hash"]:
        problems.append("content hash differs from metadata")
    if "hdf5" in info.metadata["formats"] and info.hdf5_path is None:
        problems.append(f"formats name hdf5, but files lists no {MINARI_DIR}/ copy")
    return problems, missing


def row_problems(info: DatasetInfo, missing: list[str]) -> list[str]:
    """What the loader's checks find in each shard's rows, and the counts (when every shard was read)."""
    verifier = ShardVerifier(info)
    problems = []
    complete = not missing
    for rel in info.shard_rels:
        if rel in missing:
            continue
        try:
            columns, found = verifier.check(rel)
        except RlpipeError:
            found, columns = [f"{rel} is not a readable Arrow IPC file"], {}
        problems += found
        complete = complete and bool(columns)
    if complete:  # a skipped shard would miscount
        problems += verifier.checks.totals()
    return problems


def require_valid(info: DatasetInfo) -> None:
    """Raise a one-line error naming the first problem, if any."""
    problems = validate_dataset(info)
    if problems:
        raise RlpipeError(
            f"dataset {info.name!r} is corrupted: {problems[0]}" + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else "")
        )


def require_trusted_env(info: DatasetInfo) -> None:
    """Raise a one-line error when building the env the dataset records (its env spec,
    Minari's eval env spec or a `module:Env-v0` id) would run code not registered here,
    unless env specs are trusted (`rlpipe.envs.trusted_env_spec`). Nothing is imported."""
    for key in ("env_spec", "eval_env_spec"):
        if info.metadata.get(key):
            trusted_env_spec(info.metadata[key], f"dataset {info.name!r} ({key})", f"{info.path / METADATA_FILE} {key!r}")
    if info.env_id:
        trusted_env_id(info.env_id, f"dataset {info.name!r}")
