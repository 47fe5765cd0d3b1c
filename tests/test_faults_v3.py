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

from test_faults import PROFILE, RUN, bench, make_world, one_error_line, run_dir, snapshot

CN = "mpe-cn"


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """test_faults.py's world: datasets (mpe-cn random, expert) and two finished runs (bc random seeds 0, 1)."""
    return make_world(tmp_path_factory.mktemp("faults-v3"))


@pytest.fixture()
def ws(world, tmp_path) -> Path:
    """A private copy of the world."""
    shutil.copytree(world, tmp_path / "w")
    return tmp_path / "w"


# ----------------------------------------------------------------------------- helpers
def cli_capped(ws: Path, *args: str, mem_bytes: int = 1_500_000_000, timeout: float = 180) -> tuple[int, str, str]:
    """`plcql-bench` in a child process whose address space is capped at ``mem_bytes`` (so a memory bomb
    fails fast instead of taking the machine): (exit status, stdout, stderr)."""
    code = "import sys; from plcql_bench.suite.commands.main import main; sys.argv[0] = 'plcql-bench'; main()"

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
    from plcql_bench.suite.runs.campaign import load_campaign
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
    from plcql_bench.suite.envs.tasks import get_task

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
    from plcql_bench.suite.runs import runner

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


# ----------------------------------------------------------------------------- BAD 4-6: the leaderboard site
@pytest.fixture()
def site(ws, monkeypatch, capsys) -> Path:
    """A site built from the world's two runs; then one run is removed, so the next build differs."""
    code, _, err = bench(monkeypatch, capsys, ws, "leaderboard", "--out", str(ws / "site"))
    assert code == 0, err
    shutil.rmtree(run_dir(ws, 1))
    return ws / "site"


def _on_write(monkeypatch, name: str, action) -> None:
    """Run ``action(path, text)`` in place of writing the site file ``name`` (index.html, results.json)."""
    real = Path.write_text

    def hooked(self, text, *args, **kwargs):
        if self.name == name:
            return action(self, text)
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", hooked)


def _sigterm(monkeypatch):
    """A real SIGTERM to this process, handled by the suite's handler (installed by the CLI)."""
    import signal

    from plcql_bench.suite.core import stop

    monkeypatch.setattr(stop._state, "requested_at", None)  # not a repeat of an earlier test's stop
    os.kill(os.getpid(), signal.SIGTERM)


def _assert_old_site_kept(site: Path, before: dict) -> None:
    assert snapshot(site) == before
    assert sorted(p.name for p in site.parent.iterdir() if p.name.startswith(f".{site.name}.")) == []


def test_bad4_sigterm_while_index_html_is_written_keeps_the_old_site(ws, site, monkeypatch, capsys):
    """A SIGTERM during `leaderboard` left index.html at 0 bytes (the old site lost), exit 130, no message."""
    before = snapshot(site)

    def truncate_then_stop(path, text):
        path.open("w").close()  # the file is open for writing, nothing in it yet
        _sigterm(monkeypatch)

    _on_write(monkeypatch, "index.html", truncate_then_stop)
    code, _, err = bench(monkeypatch, capsys, ws, "leaderboard", "--out", str(site))
    assert code == 130
    one_error_line(err, "leaderboard stopped", f"{site} is unchanged")
    _assert_old_site_kept(site, before)


def test_bad5_sigterm_after_index_html_never_leaves_a_mixed_site(ws, site, monkeypatch, capsys):
    """A SIGTERM just after index.html was written left the new index.html beside the old results.json and
    tables/. The site is swapped in whole: old or new, never a mix."""
    before = snapshot(site)
    real = Path.write_text
    _on_write(monkeypatch, "results.json", lambda path, text: _sigterm(monkeypatch))
    code, _, err = bench(monkeypatch, capsys, ws, "leaderboard", "--out", str(site))
    assert code == 130
    one_error_line(err, "leaderboard stopped")
    _assert_old_site_kept(site, before)
    monkeypatch.setattr(Path, "write_text", real)
    code, out, _ = bench(monkeypatch, capsys, ws, "leaderboard", "--out", str(site))  # then a full build: all new
    assert code == 0 and "(1 runs" in out
    after = snapshot(site)
    assert all(after[p] != before[p] for p in (site / "index.html", site / "results.json", site / "results.csv"))


def test_bad6_disk_full_during_leaderboard_keeps_the_old_site_and_names_the_file(ws, site, monkeypatch, capsys):
    """A full disk replaced index.html with a truncated one (no </html>), and the error named no path."""
    import errno

    before = snapshot(site)

    def half_then_full(path, text):
        with open(path, "w") as fh:
            fh.write(text[: len(text) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")  # as a write to a full disk: no file named

    _on_write(monkeypatch, "index.html", half_then_full)
    code, _, err = bench(monkeypatch, capsys, ws, "leaderboard", "--out", str(site))
    assert code == 2
    one_error_line(err, f"{site / 'index.html'}: No space left on device", f"the site in {site} is unchanged")
    _assert_old_site_kept(site, before)


@pytest.fixture()
def small_fs(tmp_path) -> Path:
    """A 1 MB tmpfs (needs root: a real full disk); skipped where it cannot be mounted."""
    mnt = tmp_path / "small-fs"
    mnt.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("a real full disk needs root to mount a small tmpfs (the injected ENOSPC test covers the rest)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill(fs: Path) -> None:
    """Fill the file system up to its last byte."""
    import errno

    fd = os.open(fs / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)


def test_bad6_real_full_disk_during_leaderboard(ws, small_fs, monkeypatch, capsys):
    code, _, err = bench(monkeypatch, capsys, ws, "leaderboard", "--out", str(small_fs / "site"))
    assert code == 0, err
    before = snapshot(small_fs / "site")
    _fill(small_fs)
    code, _, err = bench(monkeypatch, capsys, ws, "leaderboard", "--out", str(small_fs / "site"))
    assert code == 2
    one_error_line(err, f"{small_fs / 'site'}", "No space left on device", "unchanged")
    _assert_old_site_kept(small_fs / "site", before)


def test_site_swap_refuses_a_folder_that_is_not_a_site(ws, monkeypatch, capsys):
    """The swap replaces the --out folder as a whole: one holding other files is refused, not emptied."""
    (ws / "mine").mkdir()
    (ws / "mine" / "notes.txt").write_text("keep me")
    code, _, err = bench(monkeypatch, capsys, ws, "leaderboard", "--out", str(ws / "mine"))
    assert code == 2
    one_error_line(err, str(ws / "mine"), "not part of a leaderboard site (notes.txt)")
    assert (ws / "mine" / "notes.txt").read_text() == "keep me"


# ----------------------------------------------------------------------------- WEAK: temporary files left behind
KILL_AT_REPLACE = """
real = os.replace
def replace(src, dst, *a, **k):
    if os.path.basename(dst) == TARGET: os.kill(os.getpid(), signal.SIGKILL)
    return real(src, dst, *a, **k)
os.replace = replace
"""
KILL_AT_SWAP = """
from plcql_bench.suite.core import store
store._swap_in = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
"""


def _killed(ws: Path, patch: str, target: str, *args: str) -> None:
    """`plcql-bench *args` in a child process that SIGKILLs itself where ``patch`` says: as it would rename
    its temp file over ``target`` (KILL_AT_REPLACE: the temp file complete, the target not yet replaced),
    or as it would swap a staged folder in (KILL_AT_SWAP)."""
    code = (f"import os, signal, sys\nTARGET = {target!r}\n{patch}\n"
            "from plcql_bench.suite.commands.main import main; sys.argv[0] = 'plcql-bench'; main()\n")
    done = subprocess.run([sys.executable, "-c", code, "--data-dir", str(ws / "data"), "--results-dir",
                           str(ws / "results"), *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == -9, done.stderr[-2000:]


def test_weak_temp_file_of_a_killed_dataset_build_is_removed_by_the_next_build(ws, monkeypatch, capsys):
    """A SIGKILL during a dataset build left `.<tier>.h5.*.tmp` beside the dataset for good."""
    folder = dataset_path(ws).parent
    _killed(ws, KILL_AT_REPLACE, "random.h5", "datasets", "build", CN, "random", "--profile", str(ws / "p.yaml"),
            "--force")
    assert len(list(folder.glob(".random.h5.*.tmp"))) == 1
    code, _, err = bench(monkeypatch, capsys, ws, "datasets", "build", CN, "random", "--profile", str(ws / "p.yaml"),
                         "--force")
    assert code == 0, err
    assert list(folder.glob(".random.h5.*.tmp")) == []


def test_weak_temp_file_of_a_killed_export_is_removed_by_the_next_export(ws, monkeypatch, capsys):
    """A stopped export left a `.*.tmp` beside its --out file."""
    out = ws / "runs.csv"
    _killed(ws, KILL_AT_REPLACE, "runs.csv", "export", "--out", str(out))
    assert len(list(ws.glob(".runs.csv.*.tmp"))) == 1 and not out.exists()
    code, _, err = bench(monkeypatch, capsys, ws, "export", "--out", str(out))
    assert code == 0, err
    assert list(ws.glob(".runs.csv.*.tmp")) == [] and out.is_file()


def test_weak_staging_folder_of_a_killed_leaderboard_is_removed_by_the_next_build(ws, monkeypatch, capsys):
    site = ws / "site"
    _killed(ws, KILL_AT_SWAP, "site", "leaderboard", "--out", str(site))
    assert [p.name for p in ws.iterdir() if p.name.startswith(".site.stage-")] and not site.exists()
    code, _, err = bench(monkeypatch, capsys, ws, "leaderboard", "--out", str(site))
    assert code == 0, err
    assert sorted(p.name for p in ws.iterdir() if p.name.startswith(".site.")) == []


# ----------------------------------------------------------------------------- WEAK: rates and scales
@pytest.mark.parametrize("setting, field, problem", [
    ("lr=1e308", "lr", "must be in (0, 1]"),
    ("lr=2", "lr", "must be in (0, 1]"),
    ("cql_alpha=1e308", "cql_alpha", "must be within \u00b11e+06"),
    ("temperature=0", "temperature", "must be > 0"),
])
def test_weak_rates_and_scales_have_sane_ranges(ws, monkeypatch, capsys, setting, field, problem):
    """`--set lr=1e308` passed validation, then training overflowed at update 7 (exit 1, a failed run left)."""
    algo = "plcql" if field in ("temperature", "cql_alpha") else "bc"
    code, _, err = bench(monkeypatch, capsys, ws, "run", "--algo", algo, "--task", CN, "--dataset", "random",
                         "--profile", str(ws / "p.yaml"), "--set", setting, results=ws / "fresh")
    assert code == 2
    one_error_line(err, "--set", field, problem)
    assert not (ws / "fresh").exists()
    value = setting.split("=")[1]
    value = f"{float(value):.1e}" if "e" in value else value  # (YAML reads 1e308 as a string, 1.0e+308 as a float)
    (ws / "big.yaml").write_text(PROFILE.replace("hidden: 16", f"hidden: 16, {field}: {value}"))
    code, _, err = bench(monkeypatch, capsys, ws, "plan", "--profile", str(ws / "big.yaml"))
    assert code == 2
    one_error_line(err, "big.yaml", f"algo_overrides.{field}", problem)


# ----------------------------------------------------------------------------- WEAK: empty selectors
@pytest.mark.parametrize("args, message", [
    (("--queue", ""), "--queue '': empty selection"),
    (("--queue", ","), "--queue ',': empty selection"),
    (("--only", ""), "--only '': empty selection"),
    (("--only", "seed=0,seed="), "seed= has no value"),
    (("--only", "algo=bc,,seed=0"), "empty value at position 2"),
])
def test_weak_empty_selectors_are_errors(ws, monkeypatch, capsys, args, message):
    """`--queue ""` or `--queue ","` selected every cell (and `all` would train them all); a trailing
    `seed=` in `--only` was silently ignored."""
    for cmd in ("all", "plan"):
        code, _, err = bench(monkeypatch, capsys, ws, cmd, "--profile", str(ws / "p.yaml"), *args,
                             results=ws / "fresh")
        assert code == 2, (cmd, err)
        one_error_line(err, message)
    assert not (ws / "fresh").exists()


# ----------------------------------------------------------------------------- WEAK: links out of results/
def test_weak_run_directory_linked_outside_results_is_named_and_refused(ws, monkeypatch, capsys):
    """A run directory symlinked outside results/ was silently dropped by `status`, `export` and
    `leaderboard`, while `all --force` followed the link and wrote outside."""
    outside = ws / "elsewhere"
    seed0 = run_dir(ws, 0)
    shutil.move(str(seed0), outside)
    seed0.symlink_to(outside, target_is_directory=True)
    before = snapshot(outside)
    for cmd in (("status",), ("export", "--out", str(ws / "o.csv")), ("leaderboard", "--out", str(ws / "site"))):
        code, out, err = bench(monkeypatch, capsys, ws, *cmd)
        assert code == 0, (cmd, err)
        warnings = [x for x in err.splitlines() if x.startswith("warning: ")]
        assert len(warnings) == 1 and seed0.name in warnings[0] and "outside the results directory" in warnings[0], err
        code, _, err = bench(monkeypatch, capsys, ws, *cmd, "--strict")
        assert code == 2, cmd
    for cmd in (("all", "--force", "--jobs", "1", "--only", "dataset=random"), ("plan",)):
        code, out, err = bench(monkeypatch, capsys, ws, *cmd, "--profile", str(ws / "p.yaml"))
        assert code == 2, (cmd, out, err)
        assert "Traceback" not in err and "outside the results directory" in out + err
    code, _, err = bench(monkeypatch, capsys, ws, "run", *RUN, "--profile", str(ws / "p.yaml"))
    assert code == 2
    one_error_line(err, seed0.name, "a symbolic link to", "refused")
    assert snapshot(outside) == before  # nothing written through the link


# ----------------------------------------------------------------------------- WEAK: implausible result values
def test_weak_score_of_1e308_is_skipped_by_name_everywhere(ws, monkeypatch, capsys):
    """A score of 1e308 in final.json was accepted by `status` and `export`; `leaderboard` crashed with an
    OverflowError traceback naming no file."""
    final = run_dir(ws, 0) / "final.json"
    rec = json.loads(final.read_text())
    rec["score"] = rec["final_eval"]["normalised_score"] = 1e308
    final.write_text(json.dumps(rec))
    for cmd in (("status",), ("export", "--out", str(ws / "o.csv")), ("leaderboard", "--out", str(ws / "site")),
                ("plan", "--profile", str(ws / "p.yaml"))):
        code, out, err = bench(monkeypatch, capsys, ws, *cmd)
        assert code == 0, (cmd, err)
        warnings = [x for x in err.splitlines() if x.startswith("warning: ")]
        assert len(warnings) == 1 and "seed0-" in warnings[0] and "final.json" in warnings[0], (cmd, err)
        assert "plausible" in warnings[0]
    assert "1e+308" not in (ws / "o.csv").read_text()
    cells = json.loads((ws / "site" / "results.json").read_text())["cells"]
    assert [(c["n"], c["seeds"]) for c in cells] == [(1, [1])]  # seed 1 only
    assert all(abs(v) < 1e6 for c in cells for view in c["views"].values() for v in view["values"])


# ----------------------------------------------------------------------------- WEAK: what each `all` trained
def test_weak_concurrent_all_reports_what_it_trained(ws, monkeypatch, capsys):
    """Two concurrent `all` both printed "trained 12" though the second trained only 2. Here another
    process finishes seed 0 while this one waits for its lock: it is counted as done, not as trained."""
    from plcql_bench.suite.runs import runner

    real_enter, other = runner._run_lock.__enter__, {"done": False}

    def enter(self):
        if not other["done"] and self.plan.cell.seed == 0:
            other["done"] = True
            runner.execute(self.plan, log=lambda *_: None)  # "the other process" trains it meanwhile
        return real_enter(self)

    monkeypatch.setattr(runner._run_lock, "__enter__", enter)
    code, out, err = bench(monkeypatch, capsys, ws, "all", "--profile", str(ws / "p.yaml"), "--jobs", "1",
                           "--only", "dataset=random", results=ws / "r2")
    assert code == 0, err
    assert other["done"] and "2 cells: trained 1, skipped 1 (done), failed 0" in out, out


# ----------------------------------------------------------------------------- WEAK: a read-only results folder
@pytest.fixture()
def make_read_only(monkeypatch):
    """Make a folder read-only: a read-only bind mount where this process may mount (root), else the
    denials injected where the suite writes (test_faults._deny_writes_under, plus deleting and renaming)."""
    mounted = []

    def apply(folder: Path) -> None:
        if os.geteuid() == 0 and shutil.which("mount"):
            if subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True).returncode == 0:
                mounted.append(folder)
                if subprocess.run(["mount", "-o", "remount,ro,bind", str(folder)], capture_output=True).returncode == 0:
                    return
        _deny_all_writes_under(monkeypatch, folder)

    yield apply
    for folder in reversed(mounted):
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def _deny_all_writes_under(monkeypatch, folder: Path) -> None:
    from test_faults import _deny_writes_under

    _deny_writes_under(monkeypatch, folder)
    real_open = os.open

    def inside(p) -> bool:
        return str(Path(p).resolve()).startswith(str(folder.resolve()))

    def denied(real):
        def call(path, *a, **kw):
            if inside(path):
                raise PermissionError(13, "Permission denied", str(path))
            return real(path, *a, **kw)
        return call

    def os_open(path, flags, *a, **kw):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC) and inside(path):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *a, **kw)

    for name in ("unlink", "remove", "rename", "replace"):
        monkeypatch.setattr(os, name, denied(getattr(os, name)))
    monkeypatch.setattr(os, "open", os_open)


def test_weak_all_force_on_a_read_only_results_folder(ws, monkeypatch, capsys, make_read_only):
    """`all --force` on a read-only results folder exited 1, not 2, and each FAILED line pointed to a
    status.json that could not be written and still said done."""
    before = snapshot(ws / "results")
    make_read_only(ws / "results")
    code, out, err = bench(monkeypatch, capsys, ws, "all", "--profile", str(ws / "p.yaml"), "--jobs", "1",
                           "--force", "--only", "dataset=random")
    assert code == 2, out + err
    failed = [x for x in err.splitlines() if x.startswith("FAILED")]
    assert len(failed) == 2 and all("status.json" not in x and str(ws / "results") in x for x in failed), err
    assert "Traceback" not in err
    assert snapshot(ws / "results") == before  # both runs still done, nothing lost


# ----------------------------------------------------------------------------- WEAK: export to a full disk, to a folder
def test_weak_disk_full_during_export_names_the_out_path(ws, monkeypatch, capsys):
    """Disk full during `export`: the old file was intact and the exit status 2, but the message named no path."""
    import errno

    out = ws / "runs.csv"
    code, _, _ = bench(monkeypatch, capsys, ws, "export", "--out", str(out))
    old = out.read_bytes()
    shutil.rmtree(run_dir(ws, 1))  # the next export differs

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    code, _, err = bench(monkeypatch, capsys, ws, "export", "--out", str(out))
    assert code == 2
    one_error_line(err, f"{out}: No space left on device")
    assert out.read_bytes() == old and not list(ws.glob(".runs.csv.*"))


def test_weak_real_full_disk_during_export(ws, monkeypatch, capsys, small_fs):
    out = small_fs / "runs.csv"
    code, _, err = bench(monkeypatch, capsys, ws, "export", "--out", str(out))
    assert code == 0, err
    old = out.read_bytes()
    _fill(small_fs)
    shutil.rmtree(run_dir(ws, 1))
    code, _, err = bench(monkeypatch, capsys, ws, "export", "--out", str(out))
    assert code == 2
    one_error_line(err, f"{out}: No space left on device")
    assert out.read_bytes() == old and not list(small_fs.glob(".runs.csv.*"))


@pytest.mark.parametrize("fmt", ["csv", "marl-eval", "parquet"])
def test_weak_export_out_an_existing_directory_names_the_out_path(ws, monkeypatch, capsys, fmt):
    """`export --out` an existing directory named a temporary file instead of the --out path."""
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    (ws / "outdir").mkdir()
    code, _, err = bench(monkeypatch, capsys, ws, "export", "--format", fmt, "--out", str(ws / "outdir"))
    assert code == 2
    line = one_error_line(err, f"{ws / 'outdir'}: is a directory")
    assert ".tmp" not in line
    assert list((ws / "outdir").iterdir()) == [] and not list(ws.glob(".outdir.*"))


# ----------------------------------------------------------------------------- WEAK: statistics
def _cells(values_by_algo: dict[str, list[float]]):
    from plcql_bench.leaderboard.cells import cell_stats

    return [cell_stats(v) for v in values_by_algo.values()]


def test_weak_equal_looking_means_without_spread_are_not_significantly_different():
    """Two cells with zero variance whose means differ by 1e-6 both showed 50.0 ± 0.0, and Welch's test
    returned p = 0: one was "significantly" below the other."""
    from plcql_bench.leaderboard.stats import welch_p
    from plcql_bench.leaderboard.tables import mark_group

    a, b = [50.0] * 3, [50.0 + 1e-6] * 3
    stats = _cells({"a": a, "b": b})
    best, other = mark_group(stats, [True, True])[::-1]
    assert best.bold and other.ns and other.p == 1.0 and other.decimals is None
    assert welch_p(a, b, resolution=0.05) == 1.0 and welch_p([50.0] * 3, [51.0] * 3, resolution=0.05) == 0.0
    win = mark_group(_cells({"a": [0.5] * 3, "b": [0.5001] * 3}), [True, True], score_name="win_rate")
    assert win[0].ns  # win rates: 2 decimals, the same rule


def test_weak_a_claimed_difference_is_shown_with_enough_digits(tmp_path):
    """Seeds with a tiny spread whose means differ below display precision are significantly different:
    then the board shows both means with the digits that tell them apart, not "50.0" twice."""
    from plcql_bench.leaderboard.cells import format_mean_std
    from plcql_bench.leaderboard.tables import mark_group

    stats = _cells({"a": [50.000, 50.001, 50.002], "b": [50.020, 50.021, 50.022]})
    marks = mark_group(stats, [True, True])
    assert marks[1].bold and marks[0].p < 0.05 and not marks[0].ns
    shown = [format_mean_std(s.mean, s.std, "normalised", m.decimals) for s, m in zip(stats, marks)]
    assert shown[0] != shown[1] and shown == ["50.00 \u00b1 < 0.005", "50.02 \u00b1 < 0.005"]


def test_weak_board_renders_the_extra_digits(tmp_path):
    """The same, end to end: the page's cells for two such algorithms show different means."""
    from lb_fixtures import write_run

    from plcql_bench.leaderboard import build

    res = tmp_path / "results"
    for algo, base in (("cfcql", 50.0), ("plcql", 50.02)):
        for seed in range(3):
            write_run(res, algo, CN, "expert", seed, base + seed * 0.001)
    html = build.build(res, tmp_path / "site", bootstrap_reps=20, poi_reps=10).index.read_text()
    assert "50.02 \u00b1 &lt; 0.005" in html and "50.00 \u00b1 &lt; 0.005" in html
