"""The core layer: what every other layer shares and that imports nothing else of ours.

task spec (spec.py), batch types (batch.py), the result record (schema.py), errors (errors.py),
config validation (validate.py) and atomic file writes (store.py). Layers above, lowest first:
envs, datasets, algorithms, runner, leaderboard, CLI (docs/architecture.md; tests/test_layers.py).
"""
