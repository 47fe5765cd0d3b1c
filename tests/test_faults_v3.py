"""Fault injection, round 3 (issue 57): hostile inputs, torn writes and odd statistics.

Each of the 17 cases of the issue's second trial round (6 BAD, 11 WEAK) as the user meets it, through
the real entry point, asserting what the suite promises (docs/runner.md, "Guarantees"): one line naming
the file or field and no traceback, exit status 2 for user errors, nothing written or nothing lost, no
wrong result counted as done. Cases that need a memory cap run the CLI in a child process under
RLIMIT_AS; a real full disk or read-only folder is a small tmpfs where this process may mount one
(root), with an injected error in its place everywhere else.

The world (datasets and two finished runs) and the helpers are test_faults.py's."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_faults import PROFILE, RUN, bench, one_error_line, run_dir, snapshot, world, ws  # noqa: F401 (fixtures)

CN = "mpe-cn"


# ----------------------------------------------------------------------------- helpers
def cli_capped(ws: Path, *args: str, mem_bytes: int = 1_500_000_000, timeout: float = 180) -> tuple[int, str, str]:
    """`plcql-bench` in a child process whose address space is capped at ``mem_bytes`` (so a memory bomb
    fails fast instead of taking the machine): (exit status, stdout, stderr)."""
    code = "import sys; from plcql_bench.suite.cli import main; sys.argv[0] = 'plcql-bench'; main()"

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))

    proc = subprocess.run([sys.executable, "-c", code, "--data-dir", str(ws / "data"), "--results-dir",
                           str(ws / "results"), *args], capture_output=True, text=True, timeout=timeout,
                          preexec_fn=cap, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return proc.returncode, proc.stdout, proc.stderr


def dataset_path(ws: Path, tier: str = "random") -> Path:
    return ws / "data" / "faults" / CN / f"{tier}.h5"


def refile_in_manifest(ws: Path, tier: str = "random") -> None:
    """Record the dataset file's current sha256 and size in the manifest, as someone replacing the file
    on purpose would (so the checksum alone does not refuse it)."""
    from plcql_bench.datasets.format import sha256_file

    path, manifest = dataset_path(ws, tier), ws / "data" / "faults" / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc[f"{CN}/{tier}"].update(sha256=sha256_file(path), size_bytes=path.stat().st_size)
    manifest.write_text(json.dumps(doc))


def declare_huge(path: Path, rows: int, names: tuple[str, ...] | None = None, source: Path | None = None) -> None:
    """Rewrite a dataset (from ``source``, default itself) so that the arrays ``names`` (default: all, and
    the header's n_transitions with them) declare ``rows`` rows: chunked gzip datasets with no data
    written, so the file stays small."""
    import h5py

    with h5py.File(source or path, "r") as f:
        attrs = dict(f.attrs)
        arrays = {k: f[k][()] for k in f}
    names = tuple(arrays) if names is None else names
    if set(names) == set(arrays):
        attrs["n_transitions"] = rows
    path.unlink()
    with h5py.File(path, "w") as f:
        for k, a in arrays.items():
            if k in names:
                f.create_dataset(k, shape=(rows, *a.shape[1:]), dtype=a.dtype, compression="gzip",
                                 chunks=(min(rows, 4096), *a.shape[1:]))
            else:
                f.create_dataset(k, data=a)
        f.attrs.update(attrs)


# ----------------------------------------------------------------------------- BAD 1: YAML alias bomb
def _alias_bomb(levels: int = 9) -> str:
    """A profile whose description (which must be a string) is 9 nested lists of 9 aliases: ~400 million
    values once expanded, from 1 KB of YAML."""
    parts = ['&l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    parts += [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return PROFILE.replace("description: fault-injection tests", "description: [" + ", ".join(parts) + "]")


def test_bad1_yaml_alias_bomb_in_a_profile_is_refused_in_one_line(ws):
    """The error message used to print the alias-expanded value: 3.1 GB in 38 s under a 4 GB cap, then a
    MemoryError traceback. Here under a 1.5 GB cap: refused at once, one line naming the file."""
    (ws / "bomb.yaml").write_text(_alias_bomb())
    code, out, err = cli_capped(ws, "plan", "--profile", str(ws / "bomb.yaml"), timeout=120)
    assert code == 2, err[-2000:]
    one_error_line(err, "bomb.yaml", "line 2", "alias *l0 is not allowed")


def test_bad1_errors_quote_a_short_excerpt_of_a_long_value(ws, monkeypatch, capsys):
    """A wrong-typed value is quoted as a bounded excerpt, never in full (an algo_overrides value used to
    be printed whole)."""
    long_list = "[" + ", ".join(str(i) for i in range(20000)) + "]"
    for old, new, field in (("batch_size: 16", f"batch_size: {long_list}", "algo_overrides.batch_size"),
                            ("description: fault-injection tests", f"description: {long_list}", "description")):
        (ws / "long.yaml").write_text(PROFILE.replace(old, new))
        code, _, err = bench(monkeypatch, capsys, ws, "plan", "--profile", str(ws / "long.yaml"))
        assert code == 2
        line = one_error_line(err, "long.yaml", field, "...")
        assert len(line) < 300 + len(str(ws)), line


def test_bad1_aliases_are_refused_in_campaign_files_too(ws):
    from plcql_bench.suite.campaign import load_campaign
    from plcql_bench.suite.core.errors import BenchError

    (ws / "c.yaml").write_text("profile: smoke\nstages:\n- &s {name: a, only: algo=bc}\n- *s\n")
    with pytest.raises(BenchError, match=r"c\.yaml: cannot read campaign: line 4: YAML alias \*s is not allowed"):
        load_campaign(ws / "c.yaml")


# ----------------------------------------------------------------------------- BAD 2: HDF5 memory bomb
@pytest.mark.parametrize("which", ["obs-only", "whole-header"])
def test_bad2_hdf5_declaring_gigabytes_is_refused_before_any_array_is_read(ws, which):
    """A small gzip file declaring obs of 1.2e7 x 3 x 18 made the loader allocate 2.7 GB before the shape
    error. Refused before any array is read, whether only obs is huge (its shape disagrees with the header)
    or the header agrees (n_transitions 1.2e7: the declared size disagrees with the file's). Under a 1.5 GB
    cap, so the old loader dies instead of taking the machine."""
    rows = 12_000_000
    declare_huge(dataset_path(ws), rows, ("obs",) if which == "obs-only" else None)
    refile_in_manifest(ws)
    assert dataset_path(ws).stat().st_size < 5_000_000
    before = snapshot(ws / "results")
    code, out, err = cli_capped(ws, "run", *RUN, "--seed", "5", "--profile", str(ws / "p.yaml"))
    assert code == 2, err[-2000:]
    if which == "obs-only":
        one_error_line(err, "random.h5", "obs: shape (12000000, 3, 18), expected (100, 3, 18)")
    else:
        one_error_line(err, "random.h5", "arrays: the arrays declare", "more than 1000x its size", "no array was loaded")
    assert snapshot(ws / "results") == before


def test_weak_absurd_declared_shape_names_file_and_field(ws, monkeypatch, capsys):
    """obs declared 10^10 x 3 x 18 gave numpy's _ArrayMemoryError traceback naming neither file nor field."""
    shutil.copyfile(dataset_path(ws), ws / "healthy.h5")
    declare_huge(dataset_path(ws), 10 ** 10, ("obs",))
    refile_in_manifest(ws)
    code, _, err = bench(monkeypatch, capsys, ws, "run", *RUN, "--seed", "5", "--profile", str(ws / "p.yaml"))
    assert code == 2
    one_error_line(err, "random.h5", "obs: shape (10000000000, 3, 18)")
    declare_huge(dataset_path(ws), 10 ** 10, source=ws / "healthy.h5")  # the header agrees: the size check names them
    refile_in_manifest(ws)
    code, _, err = bench(monkeypatch, capsys, ws, "run", *RUN, "--seed", "5", "--profile", str(ws / "p.yaml"))
    assert code == 2
    one_error_line(err, "random.h5", "arrays: the arrays declare", "obs alone 2.2 TB")


def test_bad2_declared_size_beyond_this_process_memory_is_refused(ws, monkeypatch):
    """A file whose arrays would not fit the memory this process may use is refused by name, before reading."""
    from plcql_bench.datasets import format as fmt
    from plcql_bench.suite.tasks import get_task

    monkeypatch.setattr(fmt, "_memory_budget", lambda: 1000)
    with pytest.raises(fmt.DatasetError, match=r"random\.h5: arrays: the arrays declare .* more than this process "
                                               r"may allocate \(1\.0 KB\); no array was loaded"):
        fmt.load_dataset(dataset_path(ws), get_task(CN).spec)


# ----------------------------------------------------------------------------- BAD 3: swapped between checksum and read
def _swap_at_second_open(monkeypatch, replace) -> dict:
    """Call ``replace()`` just before the second h5py.File open of the run: the first reads the dataset's
    attributes (the identity check), the second is the load, which follows the sha256 check."""
    import h5py

    real, calls = h5py.File, {"n": 0}

    def hooked(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            replace()
        return real(*args, **kwargs)

    monkeypatch.setattr(h5py, "File", hooked)
    return calls


def test_bad3_dataset_replaced_between_checksum_and_read_trains_on_the_hashed_bytes(ws, monkeypatch, capsys):
    """The sha256 check and the HDF5 read opened the file separately: a file swapped between them trained
    on the new file, recorded the old sha256 and was marked done. Now what is hashed is what is read."""
    from plcql_bench.datasets.build import build_dataset
    from plcql_bench.datasets.format import sha256_file
    from plcql_bench.suite import runner

    other = ws / "other"
    build_dataset(CN, "random", 6, other, profile="faults")  # another valid mpe-cn/random: 150 rows, not 100
    target = dataset_path(ws)
    original_sha = sha256_file(target)
    seen: dict = {}
    real_sampler = runner.make_sampler

    def recording_sampler(cls, arrays, *args, **kwargs):
        seen["rows"] = len(arrays["rewards"])
        return real_sampler(cls, arrays, *args, **kwargs)

    monkeypatch.setattr(runner, "make_sampler", recording_sampler)
    calls = _swap_at_second_open(monkeypatch, lambda: os.replace(other / CN / "random.h5", target))
    code, out, err = bench(monkeypatch, capsys, ws, "run", *RUN, "--seed", "5", "--profile", str(ws / "p.yaml"))
    assert calls["n"] >= 2 and sha256_file(target) != original_sha, err  # the swap happened
    finals = list((ws / "results").rglob("seed5-*/final.json"))
    if code == 0:  # trained: on the bytes whose sha256 it records
        assert json.loads(finals[0].read_text())["dataset_sha256"] == original_sha
        assert seen["rows"] == 100, "trained on the replacement while recording the original's sha256"
    else:  # or refused, in one line, with nothing recorded as done
        assert code == 2 and not finals, err
        one_error_line(err, "random.h5")


def test_bad3_dataset_changed_in_place_while_read_is_refused(ws, monkeypatch, capsys):
    """A file rewritten in place (same inode) while it is read is refused by name, not trained on."""
    target = dataset_path(ws)

    def scribble() -> None:
        with open(target, "r+b") as fh:
            fh.seek(0, os.SEEK_END)
            fh.write(b"\0" * 16)

    _swap_at_second_open(monkeypatch, scribble)
    code, _, err = bench(monkeypatch, capsys, ws, "run", *RUN, "--seed", "5", "--profile", str(ws / "p.yaml"))
    assert code == 2
    one_error_line(err, "random.h5", "changed while it was being read")
    assert not list((ws / "results").rglob("seed5-*/final.json"))
