"""rlpipe: offline-RL and imitation-learning data pipeline."""
__version__ = "0.1.0"
