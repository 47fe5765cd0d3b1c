"""The suite's own layers, one folder each, lowest first: core/, envs/, runs/ (the runner layer), commands/ (the
CLI); datasets, algorithms and the leaderboard sit between them in their own top-level folders
(docs/architecture.md)."""
