"""Static leaderboard: statistics and Jinja templates."""
