"""Atomic file writes: write a temp file in the same directory, fsync, then os.replace.
A reader therefore sees either the old complete file or the new complete file, never half."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """``path`` = ``data``, atomically. Its mode is what open() would give (0666 less the umask): the temp
    file mkstemp makes is private (0600), and results, exports and cards are shared with a group or others."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
    import gzip
    import zlib

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
    import gzip

    atomic_write_bytes(Path(dest), gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0))
