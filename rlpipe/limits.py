"""The valid ranges of the seeds and env counts users give, shared by every command and config,
and the sizes stored files may claim (spaces, run files) before anything is allocated for them.

Just above ``errors.py`` at the bottom of the package, so collect, train, eval, relabel
and sweep (and the run configs they build) refuse the same values with the same words,
before anything is allocated or written.
"""

from __future__ import annotations

from rlpipe.errors import RlpipeError

# 0 <= seed < 2**32: NumPy's global seed (np.random.seed) takes no more, and the offsets added
# to a seed (per env, per episode, evaluation and held-out episodes) stay far inside the 64-bit
# range that torch.manual_seed and the int64 seed columns of datasets hold.
MAX_SEED = 2**32 - 1
# Envs stepped at once. Each env holds its own state and a row in every batched buffer (a
# random policy pre-draws 1024 actions per env): collecting with 4096 envs takes about 10 MB
# more than with one (CartPole; Pendulum, stepped one by one, about 100 MB), while 10^11 envs
# asked for 373 GiB before the first step. `--num-envs auto` picks at most 256.
MAX_NUM_ENVS = 4096
# A hidden layer's width: a 8192 x 8192 float32 layer is 256 MiB, while --set hidden=[10**9]
# would ask torch for exabytes before the first update.
MAX_LAYER_WIDTH = 8192
# Replay rows: 10^8 rows of a 17-dim observation (and the next one) are about 14 GiB.
MAX_BUFFER_SIZE = 100_000_000
# Values in one stored space (a Box's shape, summed over a Dict's parts): a 2**24-value float32
# Box holds 64 MiB in each of its bounds, far above any observation here (an 84x84x3 image
# stack of 4 is 85k values), while a metadata.json naming shape [10**12] asked for terabytes.
MAX_SPACE_ELEMENTS = 2**24
# A run's metrics.json, checkpoint.json and eval curve, as `rlpipe report` reads them: kilobytes
# (MBPO's metrics list every training episode's return; a curve is a line per evaluation).
MAX_RUN_FILE_BYTES = 16 << 20
# Gradient updates of one fit (`rlpipe ope fqe --updates`, `rlpipe train --updates`): ten times D4RL's 10^6-update
# offline runs, hours on any machine here, while --updates 10**18 ran until it was killed.
MAX_UPDATES = 10_000_000
# An @FILE argument (`rlpipe datasets filter --episodes @ids.txt`): about two million ids. Read
# up to this many bytes, a regular file only (@/dev/zero or a FIFO must not exhaust or hang).
MAX_ARGUMENT_FILE_BYTES = 16 << 20


def check_seed(seed: int, name: str = "seed") -> int:
    """``seed`` if 0 <= seed <= MAX_SEED, else an RlpipeError naming ``name`` and the range."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise RlpipeError(f"{name}={seed!r}: expected an integer from 0 to {MAX_SEED} (2**32 - 1)")
    return seed


def check_num_envs(num_envs: int, name: str = "num_envs") -> int:
    """``num_envs`` if 1 <= num_envs <= MAX_NUM_ENVS, else an RlpipeError naming the limit."""
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or not 1 <= num_envs <= MAX_NUM_ENVS:
        raise RlpipeError(f"{name}={num_envs!r}: expected an integer from 1 to {MAX_NUM_ENVS}")
    return num_envs
