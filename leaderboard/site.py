"""A site of two boards: the committed results as the front page, the user's own runs one click
away (``plcql-bench leaderboard --front leaderboard/results``; `make all` and `make board` end
with it). Also where the committed results live, for the commands that point a newcomer to them.

    site/index.html             the front board (e.g. leaderboard/results: the paper-budget runs)
    site/your-runs/index.html   the board of --results-dir (e.g. results/: what `make all` trained)

Each page carries a bar naming both boards, with their results folder, run count and profile(s),
so neither can be mistaken for the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from plcql_bench.leaderboard.build import BoardLink, Built, prepare, write
from plcql_bench.suite.runs.profiles import builtin_profiles, load_profile

__all__ = ["COMMITTED_RESULTS", "YOUR_RUNS", "Site", "build_boards", "committed_hint", "committed_results",
           "count_runs", "profile_about", "shown"]

COMMITTED_RESULTS = Path("leaderboard") / "results"  # the published runs, committed with the code
YOUR_RUNS = "your-runs"  # the folder of the second board, inside the front board's
_RUN_FILES = ("final.json", "status.json", "config.json")  # any of them makes a folder a run's


def committed_results(cwd: Path | None = None) -> Path | None:
    """The committed results folder: ``leaderboard/results`` under the working directory (the
    repository root, as every documented command runs), else the one beside this module (an
    editable install used from elsewhere); None when neither exists (an installed wheel)."""
    for candidate in ((cwd or Path.cwd()) / COMMITTED_RESULTS, Path(__file__).resolve().parent / "results"):
        if candidate.is_dir():
            return candidate
    return None


def count_runs(results_dir: Path) -> int:
    """Run folders under ``results_dir`` (0 when it does not exist): the folders holding one of a
    run's files, as `status` lists them."""
    root = Path(results_dir)
    if not root.is_dir():
        return 0
    return len({p.parent for name in _RUN_FILES for p in root.rglob(name) if p.is_file()})


def committed_hint(results_dir: Path, command: str, profile: str | None = None) -> str | None:
    """Where the committed results are and the command that reads them, for a command that found
    nothing in ``results_dir``; None when there are none or ``results_dir`` is them. ``command``
    gets ``--profile`` when ``profile`` is given: that one if the committed results hold it, else
    one they hold (paper first)."""
    committed = committed_results()
    if committed is None or Path(results_dir).resolve() == committed.resolve():
        return None
    held = {d.name: count_runs(d) for d in sorted(committed.iterdir()) if d.is_dir()}
    held = {name: n for name, n in held.items() if n}
    if not held:
        return None
    if profile is not None:
        choice = profile if profile in held else ("paper" if "paper" in held else next(iter(held)))
        command = f"{command} --profile {choice}"
    what = ", ".join(f"{n} runs of profile {name}" for name, n in held.items())
    return (f"{shown(results_dir)} holds no runs{f' of profile {profile}' if profile else ''}; the committed results "
            f"are in {shown(committed)} ({what}): plcql-bench --results-dir {shown(committed).rstrip('/')} {command}")


def profile_about(profiles) -> str:
    """The built-in profiles' one-line descriptions (suite/runs/profiles/*.yaml), for the bar."""

    known = set(builtin_profiles())
    return " ".join(f"{p}: {load_profile(p).description}" for p in profiles if p in known)


@dataclass(frozen=True)
class Site:
    front: Built
    yours: Built | None  # None when --results-dir holds no runs (no second page)


def build_boards(front_dir: Path, own_dir: Path, out_dir: Path, *, front_name: str = "Committed results",
                 front_shown: str | None = None, now: datetime | None = None, **kw) -> Site:
    """``front_dir``'s board as ``out_dir/index.html`` and ``own_dir``'s as
    ``out_dir/your-runs/index.html`` when it holds runs, each page linking the other. ``own_dir``
    may be missing (nothing trained yet): the front page then says so. ``front_shown``: how the bar
    names the front folder (default: as the user would type it). ``kw``: ``prepare``'s options (tests)."""
    front_dir, own_dir, out_dir = Path(front_dir), Path(own_dir), Path(out_dir)
    front = prepare(front_dir, now=now, **kw)
    links = [BoardLink(front_name, out_dir / "index.html", front_shown or shown(front_dir), front.n_runs, front.profiles,
                       profile_about(front.profiles))]
    if own_dir.resolve() == front_dir.resolve():  # one folder: one board
        return Site(write(front, out_dir, boards=links), None)
    own = prepare(own_dir, now=now, **kw) if count_runs(own_dir) else None
    own_index = out_dir / YOUR_RUNS / "index.html"
    links.append(BoardLink("Your runs", own_index if own else None, shown(own_dir), own.n_runs if own else 0,
                           own.profiles if own else (),
                           profile_about(own.profiles) if own else
                           "Nothing trained yet: make all trains the smoke matrix into it and links its board here."))
    # The front board first: its folder is swapped in whole (leaderboard/write.py), your-runs/ inside it after
    front_built = write(front, out_dir, boards=links, current=0)
    yours = write(own, own_index.parent, title="PLCQL-bench: your runs", boards=links, current=1) if own else None
    return Site(front_built, yours)


def shown(path: Path) -> str:
    """A folder as the user would type it: relative to the working directory when inside it."""
    path = Path(path)
    try:
        rel = path.resolve().relative_to(Path.cwd().resolve())
        return f"{rel.as_posix()}/" if rel.parts else "./"
    except ValueError:
        return f"{path.as_posix().rstrip('/')}/"
