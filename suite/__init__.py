"""Suite: CLI, tasks, runner, result store, profiles."""
