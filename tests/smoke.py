"""The smoke profile: ``params.yaml`` with every budget cut to seconds, derived by explicit
rules, so that the end-to-end test (tests/test_pipeline.py) runs every stage of the real
pipeline without a hand-kept copy of its parameters."""

from __future__ import annotations

import copy
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from rlpipe.algos import get_algo

REPO = Path(__file__).resolve().parents[1]

# Key (at any depth of params.yaml) -> the most the smoke profile keeps of its value.
CAPS: dict[str, int] = {
    "episodes": 10,  # collected episodes
    "num_envs": 4,
    "expert_steps": 400,  # collect_mixed: the expert's training steps
    "env_steps": 400,
    "updates": 100,
    "eval_every": 200,
}
# Fields set in every training entry's `set:` whose algorithm's config declares them: the
# evaluation and the per-step cost (planning, model fitting, model rollouts) cut down.
SMOKE_SETTINGS: dict[str, Any] = {
    "heldout_eval_episodes": 2,
    "eval_episodes": 2,
    "learning_starts": 100,
    "batch_size": 64,
    "update_every": 50,
    "horizon": 3,
    "population": 10,
    "iterations": 1,
    "model_max_epochs": 2,
    "rollout_batch": 100,
    "rollout_every": 25,
    "updates_per_step": 1.0,
    "fqe_updates": 100,  # runs on data with no environment
}
SMOKE_SEEDS = 2  # a sweep's seed range keeps its first two seeds


def _capped(tree: Any) -> Any:
    if not isinstance(tree, dict):
        return tree
    return {key: min(value, CAPS[key]) if key in CAPS and isinstance(value, int) else _capped(value) for key, value in tree.items()}


def smoke_params(params: dict[str, Any]) -> dict[str, Any]:
    """The smoke profile of a params.yaml tree: the same groups and entries (so the same
    stages), the counts and budgets capped (:data:`CAPS`), every training entry's `set:` given
    :data:`SMOKE_SETTINGS` (the fields its algorithm has) and sweeps' seed ranges shortened."""
    smoke = _capped(copy.deepcopy(params))
    for entries in smoke.values():
        for entry in entries.values():
            if "algo" in entry:
                declared = {f.name for f in fields(get_algo(entry["algo"]).config_class)}
                entry["set"] = {**entry.get("set", {}), **{k: v for k, v in SMOKE_SETTINGS.items() if k in declared}}
            if "seeds" in entry:
                first, _, _ = str(entry["seeds"]).partition("-")
                entry["seeds"] = f"{first}-{int(first) + SMOKE_SEEDS - 1}"
    return smoke


def write_smoke_params(path: Path, params: Path = REPO / "params.yaml") -> Path:
    """Write the smoke profile of ``params`` to ``path``; returns ``path``."""
    path.write_text(yaml.safe_dump(smoke_params(yaml.safe_load(params.read_text())), sort_keys=False))
    return path
