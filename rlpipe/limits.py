"""The valid ranges of the seeds and env counts users give, shared by every command and config,
and the sizes stored files may claim (spaces, run files) before anything is allocated for them.

Just above ``errors.py`` at the bottom of the package, so collect, train, eval, relabel
and sweep (and the run configs they build) refuse the same values with the same words,
before anything is allocated or written.
"""

from __future__ import annotations

import os

from rlpipe.errors import ArgumentError, ArgumentTypeError

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
# Env steps of one run (`--env-steps`, `--set env_steps=`, fine-tuning): five times Atari's
# 200M frames, weeks on any machine here, while --env-steps 2**63 ran until it was killed.
MAX_ENV_STEPS = 1_000_000_000
# Episodes of one evaluation (`rlpipe eval --episodes`, `rlpipe.evaluate`, eval_episodes and
# heldout_eval_episodes): D4RL's papers use 10-100; 2**63 hung in the first episode's loop.
MAX_EPISODES = 1_000_000
# Rows of one minibatch (`--set batch_size=`, `sampler(...).sample(n)`): 2**24 rows of a 17-dim
# float32 observation and its successor are about 2.3 GiB, while 2**63 ended in a torch C++ error.
MAX_BATCH_SIZE = 2**24
# Copies of a network or of a batch that one update holds at once (ensemble members and critics,
# quantiles, sampled or candidate actions, a planner's population, particles and horizon): the
# papers use 2 to 1000, while 2**63 - 1 overflowed torch's size arithmetic in a traceback.
MAX_COPIES = 8192
# Blocks and attention heads of a transformer: --set layers=10**12 built blocks until killed.
MAX_LAYERS = 256
# Torch threads per process, a small multiple of the machine's cores: --set torch_threads=100000
# spawned threads until every process on the machine failed to fork.
MAX_THREADS_PER_CORE = 4
# Ranks of one data-parallel run (nproc, across machines under torchrun or Ray); `--nproc` on one
# machine starts at most max_torch_threads() processes.
MAX_RANKS = 1024
# An @FILE argument (`rlpipe datasets filter --episodes @ids.txt`): about two million ids. Read
# up to this many bytes, a regular file only (@/dev/zero or a FIFO must not exhaust or hang).
MAX_ARGUMENT_FILE_BYTES = 16 << 20


def check_seed(seed: int, name: str = "seed") -> int:
    """``seed`` if 0 <= seed <= MAX_SEED, else an RlpipeError naming ``name`` and the range."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ArgumentTypeError(f"{name}={seed!r}: expected an integer from 0 to {MAX_SEED} (2**32 - 1)")
    if not 0 <= seed <= MAX_SEED:
        raise ArgumentError(f"{name}={seed!r}: expected an integer from 0 to {MAX_SEED} (2**32 - 1)")
    return seed


def max_torch_threads() -> int:
    """The most torch threads a run may ask for on this machine (its cores times MAX_THREADS_PER_CORE)."""
    return MAX_THREADS_PER_CORE * (os.cpu_count() or 1)


def check_count(value: int, name: str, at_most: int, at_least: int = 1) -> int:
    """``value`` if it is an integer from ``at_least`` to ``at_most``, else an RlpipeError naming ``name`` and the range."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"{name}={value!r}: expected an integer from {at_least} to {at_most}")
    if not at_least <= value <= at_most:
        raise ArgumentError(f"{name}={value!r}: expected an integer from {at_least} to {at_most}")
    return value


def check_num_envs(num_envs: int, name: str = "num_envs") -> int:
    """``num_envs`` if 1 <= num_envs <= MAX_NUM_ENVS, else an RlpipeError naming the limit."""
    return check_count(num_envs, name, MAX_NUM_ENVS)
