"""The envs layer: batched environments per task family, the task registry (tasks.py) and the evaluation
protocol (protocol.py: seeds, rollouts). It imports only the core layer."""
