"""Observation encoders: what turns an observation into the feature vector an MLP head reads.

Flat observations need none. Images (:func:`rlpipe.envs.spaces.is_image_space`: a uint8 or
bool Box of rank 3) go through a CNN chosen from the frame size: the Nature-DQN CNN (Mnih et
al. 2015) for Atari-sized frames (84 x 84), MinAtar's one-layer CNN (Young & Tian 2019) for
small boards (10 x 10 x C). A frame-stacked observation (``[k, *frame]``) puts its k frames
side by side on the channel axis; stacked vectors are concatenated. An encoder is described
by a JSON spec (:func:`rlpipe.training.env.encoder_spec` picks it from the observation space),
so a policy rebuilds it from a checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import nn

FLAT, NATURE, MINATAR = "flat", "nature", "minatar"
ARCHITECTURES = (NATURE, MINATAR)  # the CNNs a config may name; "auto" picks by frame size
EncoderChoice = Literal["auto", "nature", "minatar"]  # an algorithm config's `encoder` setting
NATURE_MIN_SIZE = 36  # the Nature CNN's three convolutions need frames of at least 36 x 36


def channels_last(shape: Sequence[int]) -> bool:
    """Whether a rank-3 frame shape is H x W x C (the channel axis is the smaller end)."""
    return shape[-1] <= shape[0]


def _cnn(arch: str, channels: int) -> nn.Sequential:
    if arch == NATURE:
        return nn.Sequential(
            nn.Conv2d(channels, 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
        )
    return nn.Sequential(nn.Conv2d(channels, 16, 3, stride=1), nn.ReLU(), nn.Flatten())


class ObsEncoder(nn.Module):
    """Observations ``[..., (k,) *shape]`` (or flattened ``[..., k * prod(shape)]``) ->
    features ``[..., out_dim]``; values are divided by ``scale`` (255 for uint8 frames)."""

    def __init__(self, arch: str, shape: Sequence[int], frame_stack: int = 1, scale: float = 1.0) -> None:
        super().__init__()
        if arch not in (FLAT, *ARCHITECTURES):
            raise ValueError(f"unknown encoder architecture {arch!r}")
        self.arch, self.shape, self.frame_stack, self.scale = arch, tuple(shape), frame_stack, scale
        self.in_shape = (frame_stack, *self.shape) if frame_stack > 1 else self.shape
        self.in_numel = math.prod(self.in_shape)
        self.cnn: nn.Module | None = None
        if arch == FLAT:
            self.out_dim = self.in_numel
            return
        self.last = channels_last(self.shape)
        channels = self.shape[-1] if self.last else self.shape[0]
        self.cnn = _cnn(arch, frame_stack * channels)
        with torch.no_grad():
            self.out_dim = int(self._features(torch.zeros(1, *self.in_shape)).shape[-1])

    def _features(self, x: torch.Tensor) -> torch.Tensor:
        assert self.cnn is not None  # only image encoders call this
        if self.frame_stack == 1:
            x = x.unsqueeze(1)  # [N, 1, *shape]
        if self.last:
            x = x.permute(0, 1, 4, 2, 3)  # [N, k, C, H, W]; dims counted from the front: ONNX refuses negative ones
        return self.cnn(x.flatten(1, 2))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        rank = len(self.in_shape)
        stacked = tuple(obs.shape[obs.dim() - rank :]) == self.in_shape
        lead = obs.shape[: obs.dim() - rank] if stacked else obs.shape[:-1]
        x = obs.reshape(-1, *self.in_shape).float()
        if self.scale != 1.0:
            x = x * (1.0 / self.scale)
        features = x.flatten(1) if self.cnn is None else self._features(x)
        return features.reshape(*lead, self.out_dim)


def build_encoder(spec: dict[str, Any] | None, obs_dim: int) -> tuple[nn.Module, int]:
    """(encoder, feature size) for a spec from :func:`rlpipe.training.env.encoder_spec`; None: identity on
    ``obs_dim`` flat values."""
    if spec is None:
        return nn.Identity(), obs_dim
    encoder = ObsEncoder(**spec)
    return encoder, encoder.out_dim
