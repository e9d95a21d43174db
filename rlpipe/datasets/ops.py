"""Derived datasets: merge, filter, split and sample stored datasets into new ones.

Every operation chooses whole episodes of its sources from a per-episode index (ids,
lengths, returns: two scalar columns), then streams the chosen rows shard by shard through
the one atomic, verified writer, so memory is bounded by a shard, not by the dataset.
Episodes keep their source order and are numbered 0, 1, 2, ... in the result.

A parent must pass every check loading runs (`rlpipe.datasets.loader.ShardVerifier`: its
files, each shard's sha256, the row checks, and the row and episode counts of its metadata)
before anything is written: the index is built by reading every shard through the verifier,
which checks the counts once the last shard is read, and the rows written are read through
it again. A parent that fails is a one-line error naming it and the problem, and nothing is
written. Every output name is checked, and locked, before the first row is written; `split`
publishes its two sides as one group (`rlpipe.datasets.writer.publish_together`): both or
neither, whatever moment the process dies.

The result's `metadata.json` records its `lineage`: the operation, its arguments and each
parent's name and content hash together with the parent's own lineage (or, for a
collection, its producer), so the tree back to the collections survives even when a parent
is deleted, and `rlpipe datasets lineage NAME` prints it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlpipe.datasets.hdf5 import MINARI_METADATA_KEYS
from rlpipe.datasets.loader import ShardVerifier, info_space_of
from rlpipe.datasets.schema import Columnar, map_columnar
from rlpipe.datasets.store import DatasetInfo, check_name, open_dataset, store_root
from rlpipe.datasets.writer import DatasetWriter, publish_together
from rlpipe.errors import RlpipeError
from rlpipe.storage.names import check_distinct

OPERATIONS = ("merge", "filter", "split", "sample")


@dataclass(frozen=True)
class EpisodeIndex:
    """One entry per episode of a dataset, in row order: its id, row count and return."""

    episode_id: np.ndarray
    length: np.ndarray
    episode_return: np.ndarray

    def __len__(self) -> int:
        return len(self.episode_id)


def episode_index(info: DatasetInfo) -> EpisodeIndex:
    """The episodes of `info`, read from its verified shards one at a time (every check
    loading runs, the counts of metadata included)."""
    verifier = ShardVerifier(info)
    ids, lengths, returns = [], [], []
    for rel in info.shard_rels:
        columns = verifier.read(rel, ("episode_id", "reward"))
        episode_id = np.asarray(columns["episode_id"])
        if len(episode_id) == 0:
            continue
        starts = np.flatnonzero(np.r_[True, episode_id[1:] != episode_id[:-1]])
        ids.append(episode_id[starts])
        lengths.append(np.diff(np.r_[starts, len(episode_id)]))
        returns.append(np.add.reduceat(np.asarray(columns["reward"], dtype=np.float64), starts))
    verifier.finish()  # the counts of metadata, as loading checks them
    if not ids:
        raise RlpipeError(f"dataset {info.name!r} holds no rows")
    episode_id = np.concatenate(ids)
    if np.any(np.diff(episode_id) <= 0):  # also an episode split across shards, which the format rules out
        raise RlpipeError(f"dataset {info.name!r} is corrupted: its episode ids are not in increasing order")
    return EpisodeIndex(episode_id, np.concatenate(lengths), np.concatenate(returns))


@dataclass(frozen=True)
class Selection:
    """The episodes taken from one source dataset (sorted ids)."""

    info: DatasetInfo
    episode_ids: np.ndarray


def _selected_rows(selection: Selection, first_new_id: int) -> Iterator[dict[str, Columnar]]:
    """The rows of the selected episodes, shard by shard (an episode never spans two
    shards), with episode ids renumbered from `first_new_id` in source order."""
    chosen = np.sort(selection.episode_ids)
    if len(chosen) == 0:
        return
    verifier = ShardVerifier(selection.info)
    for rel in selection.info.shard_rels:
        columns = verifier.read(rel)
        episode_id = np.asarray(columns["episode_id"])
        position = np.minimum(np.searchsorted(chosen, episode_id), len(chosen) - 1)
        keep = chosen[position] == episode_id
        if keep.any():
            rows = {key: map_columnar(value, lambda a, keep=keep: a[keep]) for key, value in columns.items()}
            rows["episode_id"] = position[keep].astype(np.int64) + first_new_id
            yield rows
    verifier.finish()


def _lineage_node(info: DatasetInfo) -> dict[str, Any]:
    """What the lineage records of one parent: its identity and how it came to be."""
    meta = info.metadata
    node: dict[str, Any] = {"name": info.name, "content_hash": meta["content_hash"], "total_steps": meta["total_steps"]}
    if "lineage" in meta:
        node["lineage"] = meta["lineage"]
    elif "provenance" in meta:  # a HER relabelling
        node["provenance"] = meta["provenance"]
    else:
        node["producer"] = {key: meta["producer"][key] for key in ("algorithm", "seed", "expert_run") if key in meta["producer"]}
    return node


def _check_compatible(infos: Sequence[DatasetInfo]) -> None:
    """Refuse sources that cannot share one dataset (another env, other spaces)."""
    first = infos[0].metadata
    for info in infos:
        meta = info.metadata
        if meta["multi_agent"]:
            raise RlpipeError(f"dataset {info.name!r} is multi-agent: merge, filter, split and sample take single-agent datasets")
        for key in ("env_id", "observation_space", "action_space", "info_space"):
            if meta.get(key) != first.get(key):
                raise RlpipeError(f"datasets {infos[0].name!r} and {info.name!r} differ in {key.replace('_', ' ')}: they cannot be merged")


@dataclass(frozen=True)
class Output:
    """One dataset an operation writes: its name, the episodes it takes from each source (in
    order) and the arguments its lineage records."""

    name: str
    selections: Sequence[Selection]
    arguments: dict[str, Any]


def _write(
    outputs: Sequence[Output],
    operation: str,
    *,
    store: str | os.PathLike | None,
    fmt: str,
    force: bool,
) -> list[Path]:
    """Write each output's selected episodes of every source, in order. Every output's name is
    checked and locked before the first row is written, and several outputs are published
    together (all or none)."""
    for output in outputs:
        if sum(len(s.episode_ids) for s in output.selections) == 0:
            raise RlpipeError(f"the {operation} would leave dataset {output.name!r} empty")
    with ExitStack() as stack:  # a writer that is not published is aborted: nothing is left
        writers = [stack.enter_context(_writer(output, store=store, fmt=fmt, force=force)) for output in outputs]
        for output, writer in zip(outputs, writers):
            next_id = 0
            for selection in output.selections:
                for rows in _selected_rows(selection, next_id):
                    writer.write(rows)
                next_id += len(selection.episode_ids)
            producer, extra = _record(output, operation)
            writer.prepare(producer, extra)
        return publish_together(writers)


def _parents(output: Output) -> list[DatasetInfo]:
    paths = list(dict.fromkeys(s.info.path for s in output.selections))
    return [next(s.info for s in output.selections if s.info.path == path) for path in paths]


def _writer(output: Output, *, store: str | os.PathLike | None, fmt: str, force: bool) -> DatasetWriter:
    parents = _parents(output)
    first = parents[0]
    return DatasetWriter(
        output.name,
        first.observation_space,
        first.action_space,
        env_id=first.env_id,
        env_spec=first.metadata.get("env_spec"),
        store=store,
        fmt=fmt,
        force=force,
        info_space=info_space_of(first),
        kind="transitions" if any(p.metadata.get("kind") == "transitions" for p in parents) else "episodes",
    )


def _record(output: Output, operation: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The producer and the extra metadata (lineage, Minari keys its parents share) of an output."""
    parents = _parents(output)
    first = parents[0]
    shared = {
        key: first.metadata[key]
        for key in MINARI_METADATA_KEYS
        if key in first.metadata and all(p.metadata.get(key) == first.metadata[key] for p in parents)
    }
    producer = (
        {**first.metadata["producer"], "derived_by": operation} if len(parents) == 1 else {"algorithm": operation, "derived_by": operation}
    )
    lineage = {"operation": operation, "arguments": output.arguments, "parents": [_lineage_node(p) for p in parents]}
    return producer, {"lineage": lineage, **shared}


def _open_sources(names: Sequence[str], store: str | os.PathLike | None) -> list[DatasetInfo]:
    infos = [open_dataset(name, store) for name in names]
    _check_compatible(infos)
    return infos


def _check_new(names: Sequence[str], store: str | os.PathLike | None, force: bool) -> None:
    """Refuse before anything is read or written when an output name is invalid, taken, or
    given twice (differing only in case counts as twice)."""
    for name in names:
        check_name(name)
    check_distinct(names, "output name")
    root = store_root(store)
    for name in names:
        if os.path.lexists(root / name) and not force:
            raise RlpipeError(f"dataset {name!r} already exists in {root} (use --force to replace it)")


def _take_steps(index: EpisodeIndex, order: np.ndarray, steps: int) -> np.ndarray:
    """The shortest prefix of `order` (episode positions) that holds at least `steps` rows."""
    enough = np.searchsorted(np.cumsum(index.length[order]), steps) + 1
    return order[:enough]


def merge_datasets(
    sources: Sequence[str],
    name: str,
    *,
    weights: Sequence[float] | None = None,
    seed: int = 0,
    store: str | os.PathLike | None = None,
    fmt: str = "arrow",
    force: bool = False,
) -> Path:
    """Concatenate datasets of the same env and spaces into `name`.

    Without `weights` every episode of every source is kept. With weights (one per source,
    summing to 1) the result holds the largest number of steps whose shares match the
    weights, each source contributing a seeded random subset of whole episodes (so a share
    is met to within one episode)."""
    if len(sources) < 2:
        raise RlpipeError("merge needs at least two datasets")
    _check_new([name], store, force)
    infos = _open_sources(sources, store)
    arguments: dict[str, Any] = {"sources": list(sources)}
    if weights is None:
        selections = [Selection(info, episode_index(info).episode_id) for info in infos]
    else:
        if len(weights) != len(sources):
            raise RlpipeError(f"--weights needs one weight per dataset ({len(sources)}), got {len(weights)}")
        if any(not math.isfinite(w) or w < 0 for w in weights) or not math.isclose(sum(weights), 1.0, abs_tol=1e-6):
            raise RlpipeError(f"--weights must be non-negative and sum to 1, got {', '.join(map(str, weights))}")
        indexes = [episode_index(info) for info in infos]
        total = min(int(index.length.sum()) / w for index, w in zip(indexes, weights) if w > 0)
        rng = np.random.default_rng(seed)
        selections = []
        for info, index, weight in zip(infos, indexes, weights):
            target = int(round(total * weight))
            taken = _take_steps(index, rng.permutation(len(index)), target) if target else np.array([], dtype=np.int64)
            selections.append(Selection(info, np.sort(index.episode_id[taken])))
        arguments.update(weights=[float(w) for w in weights], seed=seed)
    (path,) = _write([Output(name, selections, arguments)], "merge", store=store, fmt=fmt, force=force)
    return path


def parse_top(value: str) -> tuple[float | None, int | None]:
    """`--top-return` as (fraction, None) for `P%` or (None, count) for a whole number."""
    text = value.strip()
    try:
        if text.endswith("%"):
            percent = float(text[:-1])
            if not 0 < percent <= 100:
                raise ValueError
            return percent / 100, None
        count = int(text)
        if count < 1:
            raise ValueError
        return None, count
    except ValueError:
        raise RlpipeError(f"--top-return takes a percentage in (0, 100] such as 10% or a count of episodes >= 1, got {value!r}") from None


def filter_dataset(
    source: str,
    name: str,
    *,
    top_return: str | None = None,
    min_return: float | None = None,
    max_length: int | None = None,
    episode_ids: Sequence[int] | None = None,
    store: str | os.PathLike | None = None,
    fmt: str = "arrow",
    force: bool = False,
) -> Path:
    """Keep the episodes of `source` that pass every given criterion: among the best
    `top_return` by return (`10%` or a count; ties broken by episode order), with return >=
    `min_return`, at most `max_length` steps, and in `episode_ids`."""
    if top_return is None and min_return is None and max_length is None and episode_ids is None:
        raise RlpipeError("filter needs a criterion: --top-return, --min-return, --max-length or --episodes")
    _check_new([name], store, force)
    (info,) = _open_sources([source], store)
    if (top_return is not None or min_return is not None) and info.metadata.get("kind") == "transitions":
        raise RlpipeError(f"dataset {source!r} holds transitions, not trajectories: its rows have no episode returns")
    index = episode_index(info)
    keep = np.ones(len(index), dtype=bool)
    arguments: dict[str, Any] = {"source": source}
    if top_return is not None:
        fraction, count = parse_top(top_return)
        count = count if count is not None else max(1, math.ceil(fraction * len(index)))  # type: ignore[operator]
        best = np.argsort(-index.episode_return, kind="stable")[:count]
        keep &= np.isin(np.arange(len(index)), best)
        arguments["top_return"] = top_return
    if min_return is not None:
        if not math.isfinite(min_return):
            raise RlpipeError(f"--min-return must be a finite number, got {min_return}")
        keep &= index.episode_return >= min_return
        arguments["min_return"] = min_return
    if max_length is not None:
        if max_length < 1:
            raise RlpipeError(f"--max-length must be at least 1, got {max_length}")
        keep &= index.length <= max_length
        arguments["max_length"] = max_length
    if episode_ids is not None:
        wanted = np.asarray(sorted(set(episode_ids)), dtype=np.int64)
        unknown = wanted[~np.isin(wanted, index.episode_id)]
        if len(unknown):
            raise RlpipeError(
                f"dataset {source!r} has no episode {int(unknown[0])}" + (f" (+{len(unknown) - 1} more)" if len(unknown) > 1 else "")
            )
        keep &= np.isin(index.episode_id, wanted)
        arguments["episodes"] = wanted.tolist()
    (path,) = _write([Output(name, [Selection(info, index.episode_id[keep])], arguments)], "filter", store=store, fmt=fmt, force=force)
    return path


def split_dataset(
    source: str,
    val_fraction: float,
    *,
    train_name: str,
    val_name: str,
    seed: int = 0,
    store: str | os.PathLike | None = None,
    fmt: str = "arrow",
    force: bool = False,
) -> tuple[Path, Path]:
    """Split `source` by episode into a training and a validation dataset: a seeded random
    `val_fraction` of the episodes (rounded, at least one) goes to `val_name`."""
    if not 0 < val_fraction < 1:
        raise RlpipeError(f"--val must be a fraction in (0, 1), got {val_fraction}")
    _check_new([train_name, val_name], store, force)
    (info,) = _open_sources([source], store)
    index = episode_index(info)
    val_count = max(1, round(val_fraction * len(index)))
    if val_count >= len(index):
        raise RlpipeError(
            f"dataset {source!r} has {len(index)} episode(s): a {val_fraction} validation split would leave the training side empty"
        )
    val = np.zeros(len(index), dtype=bool)
    val[np.random.default_rng(seed).permutation(len(index))[:val_count]] = True
    arguments = {"source": source, "val": val_fraction, "seed": seed}
    sides = [
        Output(train_name, [Selection(info, index.episode_id[~val])], {**arguments, "side": "train"}),
        Output(val_name, [Selection(info, index.episode_id[val])], {**arguments, "side": "val"}),
    ]
    train_path, val_path = _write(sides, "split", store=store, fmt=fmt, force=force)  # both sides or neither
    return train_path, val_path


def sample_dataset(
    source: str,
    name: str,
    *,
    episodes: int | None = None,
    steps: int | None = None,
    seed: int = 0,
    store: str | os.PathLike | None = None,
    fmt: str = "arrow",
    force: bool = False,
) -> Path:
    """A seeded random subset of whole episodes of `source`: `episodes` of them, or the
    fewest (in a random order) that hold at least `steps` steps."""
    if (episodes is None) == (steps is None):
        raise RlpipeError("sample needs exactly one of --episodes N and --steps N")
    _check_new([name], store, force)
    (info,) = _open_sources([source], store)
    index = episode_index(info)
    order = np.random.default_rng(seed).permutation(len(index))
    if episodes is not None:
        if not 1 <= episodes <= len(index):
            raise RlpipeError(f"--episodes must be in 1..{len(index)} (the episodes of {source!r}), got {episodes}")
        taken = order[:episodes]
    else:
        total = int(index.length.sum())
        if not 1 <= steps <= total:  # type: ignore[operator]
            raise RlpipeError(f"--steps must be in 1..{total} (the steps of {source!r}), got {steps}")
        taken = _take_steps(index, order, steps)  # type: ignore[arg-type]
    arguments = {"source": source, "seed": seed, **({"episodes": episodes} if episodes is not None else {"steps": steps})}
    (path,) = _write(
        [Output(name, [Selection(info, np.sort(index.episode_id[taken]))], arguments)], "sample", store=store, fmt=fmt, force=force
    )
    return path


def _lineage_description(node: dict[str, Any]) -> str:
    """How the dataset of a lineage node was made, in a few words."""
    if "lineage" in node:
        arguments = node["lineage"]["arguments"]
        return f"{node['lineage']['operation']}({', '.join(f'{k}={v}' for k, v in arguments.items() if k not in ('source', 'sources'))})"
    if "provenance" in node:
        provenance = node["provenance"]
        return f"{provenance.get('transform')} relabelling (strategy={provenance.get('strategy')}, k={provenance.get('k')})"
    if "producer" in node:
        return "collected by " + ", ".join(f"{k}={v}" for k, v in node["producer"].items())
    return "origin unknown"


def lineage_lines(info: DatasetInfo, store: str | os.PathLike | None = None) -> list[str]:
    """The lineage tree of `info` as text lines, each parent marked as still in the store,
    changed in the store since, or gone."""
    root = store_root(store)

    def stored(node: dict[str, Any]) -> DatasetInfo | None:
        try:
            return open_dataset(node["name"], root, check_files=False) if (root / node["name"]).is_dir() else None
        except RlpipeError:
            return None

    def children(node: dict[str, Any]) -> list[dict[str, Any]]:
        if "lineage" in node:
            return node["lineage"]["parents"]
        if "provenance" in node:  # HER records only its source's name and hash: the store may know more
            provenance = node["provenance"]
            source = {"name": provenance["source_dataset"], "content_hash": provenance["source_content_hash"]}
            found = stored(source)
            return [_lineage_node(found) if found and found.metadata["content_hash"] == source["content_hash"] else source]
        return []

    lines: list[str] = []

    def walk(node: dict[str, Any], prefix: str, connector: str) -> None:
        label = f"{node['name']} [{node['content_hash'][:12]}] {_lineage_description(node)}"
        if connector:
            found = stored(node)
            state = (
                "not in the store"
                if found is None
                else "in the store"
                if found.metadata["content_hash"] == node["content_hash"]
                else "changed in the store since"
            )
            label += f" ({state})"
        lines.append(prefix + connector + label)
        kids = children(node)
        inner = prefix + ("" if not connector else "    " if connector.startswith("└") else "│   ")
        for i, kid in enumerate(kids):
            walk(kid, inner, "└── " if i == len(kids) - 1 else "├── ")

    walk(_lineage_node(info), "", "")
    return lines


__all__ = [
    "EpisodeIndex",
    "OPERATIONS",
    "episode_index",
    "filter_dataset",
    "lineage_lines",
    "merge_datasets",
    "parse_top",
    "sample_dataset",
    "split_dataset",
]
