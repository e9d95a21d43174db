"""Peer side of bench/offline.py, run inside the d3rlpy virtualenv (d3rlpy pins gymnasium 1.0.0).

Reads transitions from an .npz (rlpipe.datasets.d4rl.d4rl_arrays), trains d3rlpy's CQL or BC for a fixed number of gradient
updates with 256x256 networks (optionally with its ``compile_graph=True``) and prints one JSON line: {"algo", "updates", "seconds",
"cpu_seconds"} (wall and process CPU time of the timed updates).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("npz")
    parser.add_argument("--algo", choices=["cql", "bc"], required=True)
    parser.add_argument("--updates", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--action-samples", type=int, default=10)
    parser.add_argument("--device", default="cpu:0", help="d3rlpy's device string, e.g. cuda:0")
    parser.add_argument("--compile-graph", action="store_true", help="d3rlpy's compile_graph=True (torch.compile + CUDA graphs)")
    parser.add_argument(
        "--warmup-updates",
        type=int,
        default=None,
        help="untimed updates first (default: 1; 50 with --compile-graph, whose compilation and graph recording run over its first updates)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)

    import d3rlpy

    data = np.load(args.npz)
    dataset = d3rlpy.dataset.MDPDataset(
        observations=data["observations"],
        actions=data["actions"],
        rewards=data["rewards"],
        terminals=data["terminals"].astype(np.float32),
        timeouts=data["timeouts"].astype(np.float32),
    )
    encoder = d3rlpy.models.encoders.VectorEncoderFactory([args.hidden, args.hidden])
    if args.algo == "cql":
        config = d3rlpy.algos.CQLConfig(
            batch_size=args.batch_size,
            actor_encoder_factory=encoder,
            critic_encoder_factory=encoder,
            n_action_samples=args.action_samples,
            compile_graph=args.compile_graph,
        )
    else:
        config = d3rlpy.algos.BCConfig(batch_size=args.batch_size, encoder_factory=encoder, compile_graph=args.compile_graph)
    algo = config.create(device=args.device)
    algo.build_with_dataset(dataset)
    # untimed warm-up: lazy initialisation and, with compile_graph, compilation and graph recording
    warmup = args.warmup_updates if args.warmup_updates is not None else (50 if args.compile_graph else 1)
    algo.fit(
        dataset,
        n_steps=warmup,
        n_steps_per_epoch=warmup,
        show_progress=False,
        save_interval=10**9,
        logger_adapter=d3rlpy.logging.NoopAdapterFactory(),
    )
    start, cpu_start = time.perf_counter(), time.process_time()
    algo.fit(
        dataset,
        n_steps=args.updates,
        n_steps_per_epoch=args.updates,
        show_progress=False,
        save_interval=10**9,
        logger_adapter=d3rlpy.logging.NoopAdapterFactory(),
    )
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    print(
        json.dumps(
            {
                "algo": args.algo,
                "updates": args.updates,
                "seconds": seconds,
                "cpu_seconds": cpu_seconds,
                "compile_graph": args.compile_graph,
                "d3rlpy": d3rlpy.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
