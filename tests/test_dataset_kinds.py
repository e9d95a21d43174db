"""What a row's flags mean: episodes ending with both terminated and truncated, D4RL-style
timeouts, and the two dataset kinds (episodes, transitions) that `validate` enforces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlpipe.datasets.d4rl import d4rl_arrays
from rlpipe.datasets.loader import load_dataset
from rlpipe.datasets.store import open_dataset
from rlpipe.datasets.validate import validate_dataset
from rlpipe.datasets.writer import write_rows
from rlpipe.errors import RlpipeError
from tests.test_dataset_store import BOX, synthetic_rows


def test_rows_with_both_flags_are_kept_and_become_terminals_not_timeouts(store: Path, cli) -> None:
    rows = synthetic_rows([3, 4, 2], BOX, BOX)
    rows["truncated"][[2, 6]] = True  # episode 0 (rows 0-2) ends with both flags,
    rows["terminated"][6] = False  # episode 1 (rows 3-6) with truncated only
    write_rows("both", [rows], BOX, BOX, env_id=None, producer={"algorithm": "test"}, store=store)
    data = load_dataset("both", store)
    assert (data.terminated[2], data.truncated[2]) == (True, True)  # kept as written
    assert cli("datasets", "validate", "both", "--store", store).code == 0
    d4rl = d4rl_arrays(data)
    np.testing.assert_array_equal(d4rl["terminals"], data.terminated)
    np.testing.assert_array_equal(np.flatnonzero(d4rl["timeouts"]), [6])
    assert not (d4rl["terminals"] & d4rl["timeouts"]).any()  # what d3rlpy's MDPDataset requires


def test_validate_enforces_the_episode_invariant(store: Path, cli) -> None:
    """Flags inside an episode, or an episode ending with neither flag, fail `validate` for
    an episodes dataset; the same rows are a valid transitions dataset."""
    broken = synthetic_rows([3, 4], BOX, BOX)
    broken["terminated"][1] = True  # mid-episode
    unfinished = synthetic_rows([3, 4], BOX, BOX)
    unfinished["terminated"][6] = False  # the second episode ends with neither flag
    for name, rows, message in [
        ("mid", broken, "episode 0 is terminated or truncated before its last row (step 1)"),
        ("open", unfinished, "episode 1 ends with neither terminated nor truncated"),
    ]:
        write_rows(name, [rows], BOX, BOX, env_id=None, producer={"algorithm": "test"}, store=store)
        result = cli("datasets", "validate", name, "--store", store)
        assert result.code == 2 and message in result.err, result.err
        write_rows(f"{name}-t", [rows], BOX, BOX, env_id=None, producer={"algorithm": "test"}, store=store, fmt="arrow", kind="transitions")
        assert validate_dataset(open_dataset(f"{name}-t", store)) == []
    assert open_dataset("mid", store).metadata["kind"] == "episodes"
    skipped = synthetic_rows([2, 2], BOX, BOX)
    skipped["episode_id"] = np.array([0, 0, 2, 2])
    write_rows("gap", [skipped], BOX, BOX, env_id=None, producer={"algorithm": "test"}, store=store, fmt="arrow")
    assert any("without gaps" in problem for problem in validate_dataset(open_dataset("gap", store)))


def test_her_relabelling_writes_a_valid_transitions_dataset(store: Path, cli) -> None:
    import rlpipe.envs  # noqa: F401  (registers GoalWorld-v0)
    from tests.test_collector import collect_dataset

    collect_dataset(store, "GoalWorld-v0", "goals", fmt="arrow", episodes=6, num_envs=2)
    assert cli("relabel", "her", "--dataset", "goals", "--k", "2", "--name", "her", "--store", store).code == 0
    meta = open_dataset("her", store).metadata
    assert meta["kind"] == "transitions" and "episode_return" not in meta and "episode_length" not in meta
    assert meta["env_spec"] == open_dataset("goals", store).metadata["env_spec"]
    data = load_dataset("her", store)
    copies = data.episode_id >= 6
    # what makes it a transitions dataset: relabelled copies terminate mid-"episode" or end with no flag
    starts = np.flatnonzero(np.r_[True, np.diff(data.episode_id) != 0])
    last = np.zeros(len(data), bool)
    last[np.r_[starts[1:], len(data)] - 1] = True
    assert (copies & data.terminated & ~last).any() or (copies & last & ~(data.terminated | data.truncated)).any()
    assert cli("datasets", "validate", "her", "--store", store).code == 0
    listed = cli("datasets", "list", "--store", store)
    assert listed.code == 0 and "her" in listed.out
    assert cli("datasets", "inspect", "her", "--store", store).code == 0


def test_transition_datasets_are_arrow_only(store: Path) -> None:
    with pytest.raises(RlpipeError, match="Arrow-only"):
        write_rows("t", [synthetic_rows([2], BOX, BOX)], BOX, BOX, env_id=None, producer={}, store=store, kind="transitions")
    with pytest.raises(RlpipeError, match="unknown dataset kind"):
        write_rows("t", [synthetic_rows([2], BOX, BOX)], BOX, BOX, env_id=None, producer={}, store=store, fmt="arrow", kind="steps")
    assert not any(store.iterdir())
