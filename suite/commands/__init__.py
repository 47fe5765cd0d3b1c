"""The CLI layer: every `plcql-bench` command. main.py holds the root group and the run/plan/status/export/
leaderboard commands; datasets.py, bench.py (bench-speed, build-kernels), campaign.py and regress.py the others.
The top layer: it may import every layer below."""
