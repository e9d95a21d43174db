"""One process of a data-parallel run, as `rlpipe.commands.runs.train_ranks` starts each under
torch's elastic launcher: ``python -m rlpipe.commands.rank ALGO RUN_DIR CONFIG_JSON PROGRESS
HISTORY_FILE`` (the run's config as JSON, PROGRESS True or False). Rank 0 writes the run
directory, its eval history to HISTORY_FILE (the caller's `TrainResult.history`) and says what
stopped a run on bad input; a rank that died is named by the launcher."""

from __future__ import annotations

import json
import sys

from rlpipe.commands.runs import prepare_from_config, train_run, write_history
from rlpipe.errors import RlpipeError
from rlpipe.training.distributed import launched_rank


def main(argv: list[str]) -> int:
    """Train this rank's part of the run; an RlpipeError is one line on stderr and exit 2."""
    algo, run_dir, config, progress, history_file = argv
    try:
        result = train_run(prepare_from_config(algo, json.loads(config), run_dir), progress=progress == "True")
    except RlpipeError as exc:
        if launched_rank() == 0:  # every rank meets the same bad input: one says it
            print(f"error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError:  # a collective failed because another rank died: the launcher names that rank
        return 1
    if launched_rank() == 0:
        write_history(result.history, history_file)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
