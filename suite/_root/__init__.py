"""plcql-bench: offline multi-agent RL benchmark suite (PLCQL and baselines)."""

__version__ = "0.1.0"
