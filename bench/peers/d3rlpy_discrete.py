"""Peer side of bench/discrete_peer.py, run inside the d3rlpy virtualenv (d3rlpy pins gymnasium 1.0.0).

Reads transitions from an .npz (observations N x H x W x C uint8 boards, discrete actions),
trains d3rlpy's DiscreteCQL for ``--updates`` gradient updates with rlpipe's network for
MinAtar (one 3x3 convolution of 16 filters, then ``--hidden`` ReLU layers; d3rlpy's Q head on
top), one torch thread, and saves its greedy policy as TorchScript (``save_policy``) for the
caller to play. Prints one JSON line: {"updates", "seconds", "cpu_seconds", "d3rlpy"} (wall
and process CPU time of ``fit``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import numpy as np
import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("npz")
    parser.add_argument("--policy-out", required=True, help="where to save the TorchScript greedy policy")
    parser.add_argument("--updates", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--learning-rate", type=float, default=3e-4)
    parser.add_argument("--alpha", type=float, default=5.0, help="the conservative weight")
    parser.add_argument("--target-update-interval", type=int, default=200)
    parser.add_argument("--hidden", type=int, nargs="*", default=[256, 256])
    args = parser.parse_args()
    torch.set_num_threads(1)

    import d3rlpy
    from d3rlpy.models.encoders import EncoderFactory, register_encoder_factory
    from d3rlpy.models.torch import Encoder

    class MinAtarEncoder(Encoder):
        """H x W x C boards -> MinAtar's convolution -> ReLU MLP features."""

        def __init__(self, shape: tuple[int, int, int], hidden: list[int]) -> None:
            super().__init__()
            height, width, channels = shape
            layers: list[nn.Module] = [nn.Conv2d(channels, 16, 3), nn.ReLU(), nn.Flatten()]
            features = 16 * (height - 2) * (width - 2)
            for size in hidden:
                layers += [nn.Linear(features, size), nn.ReLU()]
                features = size
            self.net = nn.Sequential(*layers)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x.float().permute(0, 3, 1, 2))

    @dataclasses.dataclass()
    class MinAtarEncoderFactory(EncoderFactory):
        hidden: list[int] = dataclasses.field(default_factory=lambda: [256, 256])

        def create(self, observation_shape: tuple[int, ...]) -> Encoder:
            return MinAtarEncoder(tuple(observation_shape), self.hidden)

        @staticmethod
        def get_type() -> str:
            return "minatar"

    register_encoder_factory(MinAtarEncoderFactory)
    d3rlpy.seed(args.seed)
    data = np.load(args.npz)
    dataset = d3rlpy.dataset.MDPDataset(
        observations=data["observations"],
        actions=data["actions"],
        rewards=data["rewards"],
        terminals=data["terminals"].astype(np.float32),
        timeouts=data["timeouts"].astype(np.float32),
        action_space=d3rlpy.ActionSpace.DISCRETE,
        action_size=int(data["action_size"]),
    )
    config = d3rlpy.algos.DiscreteCQLConfig(
        encoder_factory=MinAtarEncoderFactory(args.hidden),
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        alpha=args.alpha,
        target_update_interval=args.target_update_interval,
    )
    algo = config.create(device="cpu:0")
    algo.build_with_dataset(dataset)
    start, cpu_start = time.perf_counter(), time.process_time()
    algo.fit(
        dataset,
        n_steps=args.updates,
        n_steps_per_epoch=args.updates,
        show_progress=False,
        save_interval=10**9,
        logger_adapter=d3rlpy.logging.NoopAdapterFactory(),
    )
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    algo.save_policy(args.policy_out)
    print(json.dumps({"updates": args.updates, "seconds": seconds, "cpu_seconds": cpu_seconds, "d3rlpy": d3rlpy.__version__}))


if __name__ == "__main__":
    main()
