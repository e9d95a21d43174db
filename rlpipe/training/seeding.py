"""Seeding: the same seed gives the same numbers on CPU."""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int, torch_threads: int | None = 1) -> np.random.Generator:
    """Seed Python, NumPy and torch; pin torch to ``torch_threads`` threads.

    One thread by default: results are then bit-reproducible on CPU, and benchmarks compare
    libraries at equal threads. Returns a NumPy generator for the caller's own sampling.
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if torch_threads is not None:
        torch.set_num_threads(torch_threads)
    return np.random.default_rng(seed)
