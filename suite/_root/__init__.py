"""plcql-bench: offline multi-agent RL benchmark suite (PLCQL and baselines)."""

from plcql_bench import moved

__version__ = "0.1.0"
moved.install()  # old import paths of modules that moved (moved.py)
