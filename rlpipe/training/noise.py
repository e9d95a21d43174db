"""Exploration noise for deterministic policies (DDPG, TD3), batched over envs."""

from __future__ import annotations

import numpy as np


class GaussianNoise:
    """i.i.d. N(0, sigma^2) per step and action dimension."""

    def __init__(self, shape: tuple[int, ...], sigma: float, rng: np.random.Generator) -> None:
        self.shape, self.sigma, self.rng = shape, sigma, rng

    def __call__(self, reset: np.ndarray | None = None) -> np.ndarray:
        return self.sigma * self.rng.standard_normal(self.shape)


class OUNoise:
    """Ornstein-Uhlenbeck process, Euler-Maruyama discretised:

        x <- x + theta * (mu - x) * dt + sigma * sqrt(dt) * N(0, 1)

    Temporally correlated noise (lag-1 autocorrelation 1 - theta*dt); its stationary
    variance is sigma^2 * dt / (1 - (1 - theta*dt)^2) ~= sigma^2 / (2 theta).
    ``reset`` is a per-env mask: those envs restart from ``x0`` (= mu).
    """

    def __init__(
        self, shape: tuple[int, ...], sigma: float, rng: np.random.Generator, theta: float = 0.15, mu: float = 0.0, dt: float = 1e-2
    ) -> None:
        self.shape, self.sigma, self.rng = shape, sigma, rng
        self.theta, self.mu, self.dt = theta, mu, dt
        self.x = np.full(shape, mu, dtype=np.float64)

    def __call__(self, reset: np.ndarray | None = None) -> np.ndarray:
        if reset is not None and reset.any():
            self.x[reset] = self.mu
        self.x = self.x + self.theta * (self.mu - self.x) * self.dt + self.sigma * np.sqrt(self.dt) * self.rng.standard_normal(self.shape)
        return self.x.copy()


def make_noise(kind: str, shape: tuple[int, ...], sigma: float, rng: np.random.Generator, **ou_kwargs: float) -> GaussianNoise | OUNoise:
    if kind == "gaussian":
        return GaussianNoise(shape, sigma, rng)
    if kind == "ou":
        return OUNoise(shape, sigma, rng, **ou_kwargs)
    raise ValueError(f"unknown noise {kind!r}; use 'gaussian' or 'ou'")
