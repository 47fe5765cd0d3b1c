"""`plcql-bench bench-speed`: update rounds per second for each algorithm on a task."""

from __future__ import annotations

import click


@click.command("bench-speed")
@click.option("--algo", "algos", multiple=True, help="Algorithm(s); default: all registered.")
@click.option("--task", "tasks", multiple=True, default=("mpe-cn",), show_default=True)
@click.option("--tier", default="medium", show_default=True, help="Tier whose reference config is used.")
@click.option("--rounds", default=20, show_default=True)
@click.option("--threads", default=2, show_default=True, help="torch.set_num_threads")
@click.option("--device", default="cpu", show_default=True)
def bench_speed(algos, tasks, tier, rounds, threads, device) -> None:
    """Median milliseconds per update round on a synthetic 100k-transition buffer."""
    import torch

    from plcql_bench.algorithms.base import get_algorithm, load_all
    from plcql_bench.algorithms.common.speed import time_update_rounds
    from plcql_bench.suite.tasks import get_task

    torch.set_num_threads(threads)
    names = list(algos) or sorted(load_all())
    click.echo(f"{'algo':<12} {'task':<12} {'batch':>6} {'ms/round':>9} {'rounds/s':>9}")
    for task_id in tasks:
        spec = get_task(task_id).spec
        for name in names:
            cls = get_algorithm(name)
            overrides = cls.task_overrides(spec, tier)
            t = time_update_rounds(name, spec, overrides, rounds=rounds, device=device)
            batch = overrides.get("batch_size", cls.Config().batch_size)
            click.echo(f"{name:<12} {task_id:<12} {batch:>6} {t['median_ms']:>9.1f} "
                       f"{1000 / t['median_ms']:>9.2f}")
