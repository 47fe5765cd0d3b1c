"""Experiment trackers (`run`/`all --log tensorboard|wandb`): a mirror of what a run records, never the record.

Each evaluation point's metrics.jsonl row (return_mean, score, train/*, diag/*) is logged at its update
round, and the final evaluation as final/score, final/return_mean, final/return_std, final/normalised_score,
final/win_rate at the last round (the names `export` uses). The run's identity (run key, algorithm, config,
task, tier, dataset sha256, seed, profile, budget) is the tracker run's config. Files live in the run folder:

  tensorboard   <run_dir>/tensorboard/events.out.tfevents.*   (`tensorboard --logdir results/` finds them all)
  wandb         <run_dir>/wandb/offline-run-*/                (offline unless WANDB_MODE says otherwise;
                                                               `wandb sync` uploads it; project $WANDB_PROJECT
                                                               or plcql-bench; run id = the run key's first 32)

A resumed run logs from its checkpoint on: TensorBoard purges the points a killed process logged after its
last checkpoint (purge_step), so the curve is the uninterrupted run's, as metrics.jsonl is. A tracker that
fails while training is closed with one warning in run.log; the run goes on (metrics.jsonl stays complete).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any, Callable

from plcql_bench.suite.core.errors import BenchError

TRACKERS = ("tensorboard", "wandb")
INSTALL = {"tensorboard": "pip install 'plcql-bench[tensorboard]'", "wandb": "pip install 'plcql-bench[wandb]'"}
FINAL_KEYS = ("return_mean", "return_std", "normalised_score", "win_rate")


def check_available(names) -> tuple[str, ...]:
    """The tracker names, checked before anything runs: known, and their package installed (BenchError
    naming the extra that installs it)."""

    names = tuple(dict.fromkeys(names or ()))
    for name in names:
        if name not in TRACKERS:
            raise BenchError(f"--log {name!r}: expected one of {', '.join(TRACKERS)}")
        if importlib.util.find_spec(name) is None:
            raise BenchError(f"--log {name} needs the {name} package: {INSTALL[name]}")
    return names


class _Tracker:
    """One open tracker of one run."""

    def scalars(self, values: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class _TensorBoard(_Tracker):
    def __init__(self, run_dir: Path, identity: dict, first_step: int):
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: points a killed process logged after the checkpoint this process resumes from are dropped
        self.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=first_step)
        self.writer.add_text("run", "```json\n" + json.dumps(identity, indent=1, sort_keys=True) + "\n```", first_step)

    def scalars(self, values: dict[str, float], step: int) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _WandB(_Tracker):
    def __init__(self, run_dir: Path, identity: dict, first_step: int):
        import wandb

        cell = f"{identity['algo']}/{identity['task']}/{identity['dataset']}"
        self.run = wandb.init(
            mode=os.environ.get("WANDB_MODE", "offline"), dir=str(run_dir),
            project=os.environ.get("WANDB_PROJECT", "plcql-bench"), id=identity["run_key"][:32], resume="allow",
            name=f"{cell}/seed{identity['seed']}", group=f"{identity['profile']}/{cell}",
            config=identity, reinit="create_new", settings=wandb.Settings(silent=True, console="off"))

    def scalars(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


_OPENERS = {"tensorboard": _TensorBoard, "wandb": _WandB}


class Session:
    """The trackers of one run in this process, opened at its first logged point (whose round a resumed
    TensorBoard purges from)."""

    def __init__(self, names: tuple[str, ...], run_dir: Path, identity: dict, log: Callable[[str], Any]):
        self.names, self.run_dir, self.identity, self.log = names, Path(run_dir), identity, log
        self.open: dict[str, _Tracker] | None = None

    def point(self, row: dict) -> None:
        """A metrics.jsonl row: every number but `update`, at step `update`."""
        values = {k: float(v) for k, v in row.items()
                  if k != "update" and isinstance(v, (int, float)) and not isinstance(v, bool)}
        self._log(values, int(row["update"]))

    def final(self, result: dict) -> None:
        """final.json's headline numbers at the last round."""
        final = result["final_eval"]
        values = {"final/score": result["score"], **{f"final/{k}": final.get(k) for k in FINAL_KEYS}}
        self._log({k: float(v) for k, v in values.items() if v is not None}, int(result["train"]["updates"]))

    def close(self) -> None:
        for name, tracker in (self.open or {}).items():
            self._guard(name, tracker.close)
        self.open = {}

    def _log(self, values: dict[str, float], step: int) -> None:
        if self.open is None:
            self.open = {}
            for name in self.names:
                opened = self._guard(name, lambda n=name: _OPENERS[n](self.run_dir, self.identity, step))
                if opened is not False:
                    self.open[name] = opened
        for name, tracker in list(self.open.items()):
            if self._guard(name, lambda t=tracker: t.scalars(values, step)) is False:
                self.open.pop(name, None)

    def _guard(self, name: str, call: Callable[[], Any]) -> Any:
        """``call()``; a tracker's exception is one warning in run.log, and the tracker is dropped (False)."""
        try:
            result = call()
            return True if result is None else result
        except Exception as exc:  # noqa: BLE001 - a mirror must not fail the run it mirrors
            self.log(f"warning: --log {name} failed and is off for this run: {type(exc).__name__}: "
                     f"{' '.join(str(exc).split())} (metrics.jsonl has every value)")
            return False
