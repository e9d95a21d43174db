"""Expert datasets: find (or train) an expert run, then collect with it.

An expert lives in `models/<algo>-<env>` (the run directory `rlpipe train` and the
`train_online` DVC stage write). It is reused when its saved config equals the config the
current parameters produce; an expert with other parameters goes to
`models/<algo>-<env>-<config hash>` instead, so the model an older dataset records
(`checkpoint_sha256`, `run_dir`) is never overwritten. Datasets record the expert's
checkpoint hash in their metadata.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlpipe.algos import LoadedPolicy, get_algo, load_policy
from rlpipe.algos.registry import import_algorithm
from rlpipe.datasets.collector import EpisodeAssembler
from rlpipe.datasets.writer import DatasetWriter
from rlpipe.envs import env_slug
from rlpipe.errors import RlpipeError
from rlpipe.nets.checkpoint import read_meta
from rlpipe.training.run import METRICS_FILE

if TYPE_CHECKING:
    from rlpipe.training.config import RunConfig
    from rlpipe.training.multiagent import SavedActor

EXPERTS = ("ppo", "sac", "dqn", "qrdqn")  # PPO for either action kind, SAC continuous, (QR-)DQN discrete


def load_saved_actor(run_dir: str | Path, device: Any = "cpu") -> SavedActor:
    """The policy network of any saved run and its checkpoint record, rebuilt by the class its algorithm's module registers."""
    from rlpipe.algos.policy import rebuild_actor
    from rlpipe.nets.checkpoint import load_checkpoint
    from rlpipe.training.multiagent import SavedActor

    ckpt = load_checkpoint(run_dir, device)
    import_algorithm(ckpt.meta["algo"])
    return SavedActor(rebuild_actor(ckpt, run_dir, device), ckpt.meta, ckpt.sha256, Path(run_dir))


def default_run_dir(algo: str, env_id: str, models_root: str | Path = "models") -> Path:
    """Where the expert `algo` for `env_id` is kept, e.g. models/ppo-cartpole."""
    return Path(models_root) / f"{algo}-{env_slug(env_id)}"


def expert_run_dir(algo: str, env_id: str, overrides: dict[str, Any], models_root: str | Path = "models") -> Path:
    """Where the expert these parameters give lives: `models/<algo>-<env>` when that is free
    or holds the same config, else a sibling named by the config's hash (content-addressed)."""
    check_expert(algo)
    config = get_algo(algo).make_config(env_id, **overrides)
    base = default_run_dir(algo, env_id, models_root)
    if not base.exists() or _saved_config_matches(base, config):
        return base
    digest = hashlib.sha256(json.dumps(asdict(config), sort_keys=True).encode()).hexdigest()[:12]
    return base.with_name(f"{base.name}-{digest}")


def check_expert(algo: str) -> None:
    """Raise unless `algo` can serve as an expert."""
    if algo not in EXPERTS:
        raise RlpipeError(f"unknown expert {algo!r}: choose one of {', '.join(EXPERTS)}")


def _saved_config_matches(run_dir: Path, config: RunConfig) -> bool:
    try:
        saved = read_meta(run_dir).get("config")
    except (RlpipeError, FileNotFoundError, OSError):
        return False
    return saved == json.loads(json.dumps(asdict(config)))


def ensure_expert(
    algo: str,
    env_id: str,
    run_dir: Path,
    overrides: dict[str, Any],
    *,
    match_params: bool = True,
    deterministic: bool = True,
    progress: bool = True,
) -> tuple[LoadedPolicy, bool]:
    """Load the expert in `run_dir`, training it there first when it is missing — or, with
    `match_params`, when its saved config differs from what `overrides` give.

    Without `match_params` an existing run is used as it is (a run the pipeline trained),
    provided it is an `algo` run on `env_id`. Returns the policy and whether it was trained now.
    """
    check_expert(algo)
    spec = get_algo(algo)
    config = spec.make_config(env_id, **overrides)
    trained = not _saved_config_matches(run_dir, config) if match_params else not (run_dir / METRICS_FILE).is_file()
    if trained:
        spec.train(config, run_dir, progress=progress)
    policy = load_policy(run_dir, deterministic=deterministic)
    if (policy.algo, policy.env_id) != (algo, env_id):
        raise RlpipeError(f"{run_dir} holds a {policy.algo} run on {policy.env_id}, not {algo} on {env_id}")
    return policy, trained


def collect_training_transitions(
    algo: str,
    env_id: str,
    writer: DatasetWriter,
    run_dir: Path,
    overrides: dict[str, Any],
    *,
    progress: bool = True,
) -> dict[str, Any]:
    """Train `algo` from scratch and store every transition it saw (a mixed-quality dataset).

    The run's checkpoint is saved to `run_dir`; returns the training metrics.
    """
    check_expert(algo)
    spec = get_algo(algo)
    if not spec.records_training:
        recording = ", ".join(name for name in EXPERTS if get_algo(name).records_training)
        raise RlpipeError(f"{algo} cannot report its training transitions; use --expert {recording}")
    config = spec.make_config(env_id, **overrides)
    assembler = EpisodeAssembler(config.num_envs, writer.write)
    result = spec.train(config, run_dir, progress=progress, step_sink=assembler.add_step)
    assembler.close()
    return {**result.metrics, "checkpoint_sha256": result.checkpoint_sha256}
