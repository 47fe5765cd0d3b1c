"""The runner layer: profiles, the matrix, one run (runner.py) and many (executors.py, stacking.py, campaign.py),
calibration and planning, export, the regression band, the trackers, the reference scripts and the Python API
(api.py). It imports the layers below (core, envs, datasets, algorithms), never leaderboard or CLI."""
