"""What a row's flags mean: episodes ending with both terminated and truncated, D4RL-style
timeouts, and the two dataset kinds (episodes, transitions) that `validate` enforces."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np

from rlpipe.datasets.d4rl import d4rl_arrays
from rlpipe.datasets.loader import load_dataset
from rlpipe.datasets.store import open_dataset
from rlpipe.datasets.validate import validate_dataset
from rlpipe.datasets.writer import write_rows
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
