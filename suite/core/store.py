"""Atomic writes: a file (atomic_write_bytes / _json) and a whole folder (staged_directory).

A file is written to a temp file in the same directory, fsynced, then os.replace'd over the target; a
folder is built in a temp folder beside the target and exchanged with it in one rename. A reader
therefore sees either the old complete file (folder) or the new one, never half, never a mix.

Temp files and folders are named after their target and their writer (``.<name>.<host>-<pid>-XXXX.tmp``,
``.<name>.stage-<host>-<pid>-XXXX``), so the next write to the same target deletes those a killed writer
left (remove_stale_temps) without touching a live writer's. Errors name the target, not the temp file."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import glob
import gzip
import json
import os
import re
import shutil
import socket
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any, Iterator

LEGACY_TEMP_AGE_S = 3600.0  # a temp file named without its writer counts as stale after this long


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """``path`` = ``data``, atomically. Its mode is what open() would give (0666 less the umask): the temp
    file mkstemp makes is private (0600), and results, exports and cards are shared with a group or others."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a directory (expected the path of a file to write)", str(path))
    tmp = None
    try:
        with named_errors(path):
            fd, tmp = new_temp_file(path)
            os.fchmod(fd, 0o666 & ~current_umask())
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def named_errors(path: Path, rename: tuple[Path, Path] | None = None) -> Iterator[None]:
    """OSErrors raised inside name ``path``, the target, and never a temp path: a write to an open file
    names no file at all ('No space left on device'), os.replace names its temp source. With
    ``rename=(temp folder, target folder)`` a path inside the temp folder is named as the same path inside
    the target; any other path an error names is kept."""
    try:
        yield
    except OSError as exc:
        named = _target_name(exc.filename, path, rename)
        if named == exc.filename and exc.filename2 is None:
            raise
        raise type(exc)(exc.errno, exc.strerror or str(exc), named) from None


def _target_name(named: Any, path: Path, rename: tuple[Path, Path] | None) -> str:
    if named is None:
        return str(path)
    named = os.fsdecode(named) if isinstance(named, (bytes, os.PathLike)) else str(named)
    if rename is None:
        return str(path)
    temp, target = (str(p) for p in rename)
    return target + named[len(temp):] if named == temp or named.startswith(temp + os.sep) else named


def _writer_tag() -> str:
    """This process, as temp names record it: host and pid (the pid alone says nothing across hosts)."""
    host = re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname())[:40] or "host"
    return f"{host}-{os.getpid()}"


def new_temp_file(path: Path) -> tuple[int, str]:
    """(fd, name) of a new temp file beside ``path`` for writing it, after deleting the ones a killed
    writer of ``path`` left (remove_stale_temps)."""
    path = Path(path)
    remove_stale_temps(path)
    return tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{_writer_tag()}-", suffix=".tmp")


def _alive(tag: str) -> bool | None:
    """Whether the writer a temp name records still runs: None when it ran on another host (unknown)."""
    host, _, pid = tag.rpartition("-")
    if host != _writer_tag().rpartition("-")[0] or not pid.isdigit():
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stale(entry: Path, tag: str | None) -> bool:
    alive = _alive(tag) if tag else None
    if alive is not None:
        return not alive
    try:  # another host's, or named before writers were: only when old
        return time.time() - entry.lstat().st_mtime > LEGACY_TEMP_AGE_S
    except OSError:
        return False


def remove_stale_temps(path: Path) -> list[Path]:
    """Delete the temp files and staging folders that writers of ``path`` left behind when they were killed
    (SIGKILL, power loss): those of a process that no longer runs on this host, and those named without
    their writer or by another host once older than LEGACY_TEMP_AGE_S. Returns what was deleted."""
    path = Path(path)
    name = re.escape(path.name)
    pattern = re.compile(rf"\.{name}\.(?:(?:stage|old)-)?(?:(?P<tag>.+-\d+)-)?[A-Za-z0-9_]+(?:\.tmp)?")
    removed = []
    for entry in path.parent.glob(f".{glob.escape(path.name)}.*"):
        m = pattern.fullmatch(entry.name)
        if m is None or not (entry.name.endswith(".tmp") or ".stage-" in entry.name or ".old-" in entry.name):
            continue
        if _stale(entry, m.group("tag")):
            with contextlib.suppress(OSError):
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
                removed.append(entry)
    return removed


# ----------------------------------------------------------------------------- links out of a folder
def link_leaving(path: Path, root: Path) -> tuple[Path, Path] | None:
    """(link, where it points) when ``path`` or a folder between ``root`` and it is a symbolic link that
    leads outside ``root``; None otherwise (``root`` itself may be a link: it is where results live)."""
    root, path = Path(root), Path(path)
    real_root = Path(os.path.realpath(root))
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        return None
    current = root
    for part in parts:
        current = current / part
        if current.is_symlink():
            target = Path(os.path.realpath(current))
            if target != real_root and real_root not in target.parents:
                return current, target
    return None


def links_leaving(root: Path) -> list[tuple[Path, Path]]:
    """Every symbolic link under ``root`` (to a folder or a file) that leads outside it: (link, target)."""
    root = Path(root)
    real_root = Path(os.path.realpath(root))
    out = []
    for folder, dirs, files in os.walk(root):  # does not follow links to folders
        for name in sorted(dirs) + sorted(files):
            entry = Path(folder) / name
            if entry.is_symlink():
                target = Path(os.path.realpath(entry))
                if target != real_root and real_root not in target.parents:
                    out.append((entry, target))
    return sorted(out)


# ----------------------------------------------------------------------------- a whole folder at once
_RENAME_EXCHANGE = 2  # linux/fs.h


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one atomic step (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


@contextlib.contextmanager
def staged_directory(target: Path) -> Iterator[Path]:
    """Build a folder in a new temp folder beside ``target`` (yielded) and, when the block ends normally,
    put it in ``target``'s place in one atomic rename (the old folder exchanged and then deleted): a reader
    sees the old folder or the new one, complete, never a mix. When the block raises (a stop, a full disk)
    the temp folder is deleted and ``target`` is untouched; OSErrors name the path in ``target``.
    Where the file system cannot exchange two folders, the old one is renamed away and the new one in,
    with nothing else in between; a kill between the two is undone by the next build (_recover_swap)."""
    target = Path(os.path.realpath(target))
    if target.exists() and not target.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "exists and is not a directory", str(target))
    with named_errors(target):  # (a read-only or full folder: named as the target, not the staging folder)
        target.parent.mkdir(parents=True, exist_ok=True)
        _recover_swap(target)
        remove_stale_temps(target)
        stage = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.stage-{_writer_tag()}-"))
    try:
        with named_errors(target, rename=(stage, target)):
            yield stage
            _fsync_tree(stage)
            _swap_in(stage, target)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def _swap_in(stage: Path, target: Path) -> None:
    if not target.exists():
        os.rename(stage, target)
    elif _exchange(stage, target):
        shutil.rmtree(stage, ignore_errors=True)  # now the old folder
    else:
        old = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.old-{_writer_tag()}-"))
        os.rename(target, old / target.name)
        os.rename(stage, target)
        shutil.rmtree(old, ignore_errors=True)
    _fsync_dir(target.parent)


def _recover_swap(target: Path) -> None:
    """A folder a killed writer renamed away (``.<name>.old-*/<name>``) without putting the new one in its
    place goes back to ``target``."""
    if target.exists():
        return
    for kept in sorted(target.parent.glob(f".{glob.escape(target.name)}.old-*/{glob.escape(target.name)}")):
        with contextlib.suppress(OSError):
            os.rename(kept, target)
            return


def _fsync_tree(root: Path) -> None:
    for folder, _dirs, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(folder))


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def current_umask() -> int:
    """The process's umask, read without changing it where Linux shows it (/proc/self/status); elsewhere set
    and restored at once."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=1, sort_keys=True, default=_default) + "\n").encode())


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


def _default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy / torch scalars
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


METRICS = "metrics.jsonl"            # a run's learning curve and diagnostics, as the runner writes it
METRICS_GZ = "metrics.jsonl.gz"      # the same rows gzipped (schema.compact_metrics_text), as runs are published


def read_metrics_text(path: Path) -> str | None:
    """The text of a run's metrics.jsonl at `path`, or of its published, gzipped sibling (`METRICS_GZ`)
    when only that exists; None when neither does. Raises OSError/UnicodeDecodeError on a damaged file."""

    path = Path(path)
    if path.exists():
        return path.read_text(encoding="utf-8")
    packed = path.with_name(path.name + ".gz")
    if packed.exists():
        try:
            return gzip.decompress(packed.read_bytes()).decode("utf-8")
        except (EOFError, gzip.BadGzipFile, zlib.error) as exc:  # truncated, not gzip, corrupt inside
            raise OSError(f"{packed}: {exc}") from None
    return None


def gzip_text(text: str, dest: Path) -> None:
    """`dest` = gzip of the UTF-8 `text`, written atomically and byte-for-byte reproducible (no name or time
    in the header), so publishing the same run twice gives the same committed bytes."""

    atomic_write_bytes(Path(dest), gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0))
