"""Native (C) CPU kernels, compiled on first use with the machine's C compiler and called through ctypes.

The fused paths call these when this module can build them (discrete: the first three; continuous: the last):
- `cf_negative`, the native form of kernels_discrete._CFNegative's forward (CF-CQL's negative term, λ and
  the per-row gradient). The torch form makes ~12 passes (one per op) over every cache block of the
  [rows, n, A, embed] intermediate; the C form computes each embed-long vector once and keeps it in
  registers and L1 (smax-2s3z, 10 members: 469 -> 166 ms at 2 threads; docs/algorithms/discrete-machinery.md).
- `gru_forward_step` and `gru_backward_step`, the elementwise parts of one step of the GRU's recurrence
  (kernels_discrete._gru_steps) and of its backward pass (_GRU.backward): ~8 and ~10 torch ops, each a
  pass over [E, k, H]-sized operands, in one pass each, on torch's OpenMP threads.
- `cql_block_layer1`, `cql_block_head` and `cql_block_tail` (`cql_block_kernels`), the elementwise work of one
  block of the continuous CF-CQL penalty (kernels._BlockedLSE: CFCQL, MACQL, SPaCQL, PLCQL, and OMAR's CQL
  term) between its three GEMMs, which stay in torch: the first layer (K = nA GEMM, state part, ReLU); the
  output layer, offsets, softmax, dW3 and the ReLU derivative; dh1's ReLU derivative, dW1a and dh_s. ~14 torch
  ops (passes over the block) become 3, with 16-column register tiles (csrc/vec16.h); CN, 1 thread: a CFCQL
  round 0.78x, PLCQL 0.78x, SPaCQL 0.78x of the torch form's (docs/algorithms/cfcql.md "Speed").

Building: `cc` (or $CC) compiles algorithms/common/csrc/NAME.c with -O3 -march=native into a cache
folder ($PLCQL_NATIVE_CACHE, else $XDG_CACHE_HOME/plcql-bench/native, else ~/.cache/plcql-bench/native;
where that cannot be written, $TMPDIR/plcql-bench-native-UID),
named by a hash of the source, the flags, the compiler's version and this CPU's flags, so a changed source
or another machine builds anew and concurrent processes never read a half-written file (the library is
written under a temporary name and renamed). Without a working compiler, or with PLCQL_NATIVE=0, every
caller takes the torch form: the same numbers up to float summation order (tests/test_native.py).

Which form ran is not part of a run's key, like the thread count and PLCQL_KERNELS.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Iterator

import torch

SOURCES = Path(__file__).with_name("csrc")
ENV = "PLCQL_NATIVE"  # "0", "off" or "false": never build or call the native kernels
FLAGS = ["-O3", "-march=native", "-fPIC", "-shared",
         # the reductions over the embedding may be reassociated (vectorised); infinities and NaNs keep
         # their meaning (the masked softmax uses -inf), unlike with -ffast-math
         "-fno-math-errno", "-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math",
         # the kernels' `omp parallel` loops run on the OpenMP runtime torch has loaded (the library's
         # libgomp.so.1 resolves to torch's own, already in the process), i.e. on torch's intra-op threads
         "-fopenmp"]
_LIBS: dict[str, ctypes.CDLL | None] = {}
_PATHS: dict[str, str] = {}  # kernel -> the library file loaded
_LOCK = threading.Lock()
_ON = True


def use_native(on: bool) -> None:
    """Whether callers may use the native kernels (tests switch it off to time or compare the torch form)."""
    global _ON
    _ON = bool(on)


@contextlib.contextmanager
def native_kernels(on: bool) -> Iterator[None]:
    """`use_native(on)` inside the block, the previous choice restored after it (`bench-speed
    --compare-native`, tests)."""
    old = _ON
    use_native(on)
    try:
        yield
    finally:
        use_native(old)


def enabled() -> bool:
    return _ON and os.environ.get(ENV, "1").strip().lower() not in ("0", "off", "false", "no")


def cache_dir() -> Path:
    if os.environ.get("PLCQL_NATIVE_CACHE"):
        return Path(os.environ["PLCQL_NATIVE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "plcql-bench" / "native"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def _compiler_version(cc: str) -> str:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _writable(folders: list[Path]) -> Path:
    """The first of the folders that exists or can be made and can be written (a read-only home, as in
    some containers, falls back to the temporary folder)."""
    for folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError:
            continue
        if os.access(folder, os.W_OK):
            return folder
    raise RuntimeError(f"no writable folder for the compiled kernels (tried {', '.join(map(str, folders))})")


def _build(name: str) -> Path:
    """The compiled library of csrc/NAME.c (compiled now unless the cache has it). Raises on failure."""
    src = SOURCES / f"{name}.c"
    cc = os.environ.get("CC", "cc")
    version = _compiler_version(cc)
    if not version:
        raise RuntimeError(f"no C compiler ({cc!r}; set CC)")
    headers = "".join(h.read_text() for h in sorted(SOURCES.glob("*.h")))  # what the sources include
    key = hashlib.sha256("\0".join([src.read_text(), headers, " ".join(FLAGS), version, _cpu_flags(),
                                    platform.machine()]).encode()).hexdigest()[:16]
    file = f"{name}-{key}.so"
    folders = [cache_dir(), Path(tempfile.gettempdir()) / f"plcql-bench-native-{os.getuid()}"]
    for folder in folders:
        if (folder / file).exists():
            return folder / file
    folder = _writable(folders)
    lib = folder / file
    fd, tmp = tempfile.mkstemp(prefix=f".{name}-", suffix=".so", dir=folder)
    os.close(fd)
    try:
        done = subprocess.run([cc, *FLAGS, "-o", tmp, str(src), "-lm"],
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"{cc} failed on {src.name}: {(done.stderr or done.stdout).strip()[:500]}")
        os.replace(tmp, lib)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib


def library(name: str) -> ctypes.CDLL | None:
    """csrc/NAME.c loaded (built on first use), or None when it cannot be built here (warned once)."""
    with _LOCK:
        if name not in _LIBS:
            try:
                _PATHS[name] = str(_build(name))
                _LIBS[name] = _declare(name, ctypes.CDLL(_PATHS[name]))
            except (OSError, RuntimeError, subprocess.SubprocessError) as err:
                warnings.warn(f"native kernel {name!r} unavailable, using the torch form: {err}", RuntimeWarning,
                              stacklevel=2)
                _LIBS[name] = None
        return _LIBS[name]


KERNELS = tuple(sorted(p.stem for p in SOURCES.glob("*.c")))  # csrc/NAME.c, one exported function NAME each


def build_all() -> dict[str, str]:
    """Build (or find in the cache) and load every native kernel now, before any training (`plcql-bench
    build-kernels`; `all` on a selection with discrete tasks): {kernel: the library's path, or why the torch
    form will be used instead}."""
    out = {}
    for name in KERNELS:
        lib = library(name) if enabled() else None
        out[name] = _PATHS[name] if lib is not None else _why_not(name)
    return out


def _why_not(name: str) -> str:
    if not enabled():
        return f"off ({ENV}=0): the torch form"
    return "unavailable here (no working C compiler with OpenMP; set CC): the torch form, same numbers"


def loaded() -> list[str]:
    """The native kernels loaded in this process (a run records them: runner `kernel_choice`)."""
    with _LOCK:
        return sorted(name for name, lib in _LIBS.items() if lib is not None)


def _declare(name: str, lib: ctypes.CDLL) -> ctypes.CDLL:
    """The argument and result types of csrc/NAME.c's function (tests/test_native.py checks them against the
    C prototype)."""
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    if name == "cf_negative":
        lib.cf_negative.argtypes = [p] * 7 + [ctypes.c_float] + [i64] * 5 + [p] * 7 + [ctypes.c_int]
        lib.cf_negative.restype = ctypes.c_int
    if name == "gru_backward_step":
        lib.gru_backward_step.argtypes = [p] * 6 + [i64] * 9 + [ctypes.c_int]
        lib.gru_backward_step.restype = ctypes.c_int
    if name == "gru_forward_step":
        lib.gru_forward_step.argtypes = [p] * 4 + [i64] * 7 + [ctypes.c_int]
        lib.gru_forward_step.restype = ctypes.c_int
    if name == "cql_block_layer1":
        lib.cql_block_layer1.argtypes = [p] * 4 + [i64] * 6 + [ctypes.c_int]
        lib.cql_block_layer1.restype = ctypes.c_int
    if name == "cql_block_head":
        lib.cql_block_head.argtypes = [p] * 7 + [ctypes.c_float] + [i64] * 7 + [ctypes.c_int] * 2
        lib.cql_block_head.restype = ctypes.c_int
    if name == "cql_block_tail":
        lib.cql_block_tail.argtypes = [p] * 5 + [i64] * 6 + [ctypes.c_int]
        lib.cql_block_tail.restype = ctypes.c_int
    return lib


def _usable(*tensors: torch.Tensor) -> bool:
    return all(t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() for t in tensors)


def cf_negative(pre: torch.Tensor, delta: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor,
                avail: torch.Tensor, logbeta: torch.Tensor | None, temp: float, members: int
                ) -> tuple[torch.Tensor, ...] | None:
    """kernels_discrete._CFNegative.forward's outputs (neg [R], λ [R, n]) and its per-row gradients
    (d pre, d delta, d w1, d w2, d b2) from the same inputs (contiguous float32 CPU tensors), or None when
    the native kernel is off or cannot be used here (the caller then takes the torch form)."""
    if not enabled():
        return None
    avail = avail.to(torch.float32).contiguous()
    inputs = [pre, delta, w1, w2, b2, avail] + ([] if logbeta is None else [logbeta])
    R, n, A = delta.shape
    if not _usable(*inputs) or n > 64 or R % members != 0:
        return None
    lib = library("cf_negative")
    if lib is None:
        return None
    Em = pre.shape[-1]
    outs = (delta.new_empty(R), delta.new_empty(R, n), torch.empty_like(pre), torch.empty_like(delta),
            torch.empty_like(w1), torch.empty_like(w2), torch.empty_like(b2))
    ptr = [ctypes.c_void_p(t.data_ptr()) for t in (pre, delta, w1, w2, b2, avail)]
    ptr.append(ctypes.c_void_p(None if logbeta is None else logbeta.data_ptr()))
    status = lib.cf_negative(*ptr, ctypes.c_float(temp), R, members, n, A, Em,
                             *[ctypes.c_void_p(t.data_ptr()) for t in outs], torch.get_num_threads())
    if status != 0:
        raise RuntimeError(f"native cf_negative failed (status {status}: 1 bad sizes, 2 out of memory)")
    return outs


def _rows_contiguous(t: torch.Tensor) -> bool:
    """[E, k, W] with each member's k rows of W floats back to back (a slice of rows of a contiguous tensor)."""
    return (t.device.type == "cpu" and t.dtype == torch.float32 and t.dim() == 3 and t.stride(2) == 1
            and (t.shape[1] <= 1 or t.stride(1) == t.shape[2]))


def _gru_step_kernel(name: str):
    """The C function `name` of csrc/NAME.c, which takes the step's [E, k, ·] operands (pointers, then E, k,
    H, then each operand's member stride, then the thread count), wrapped as ops -> bool; None when the
    native kernels are off or NAME cannot be built here. The wrapper returns False for operands it cannot
    take (not float32 rows on the CPU): the caller then runs the torch ops. H is the last operand's width."""
    if not enabled():
        return None
    lib = library(name)
    if lib is None:
        return None
    fn, threads = getattr(lib, name), torch.get_num_threads()

    def step(*ops: torch.Tensor) -> bool:
        if not all(_rows_contiguous(t) for t in ops):
            return False
        E, k, H = ops[-1].shape
        status = fn(*[ctypes.c_void_p(t.data_ptr()) for t in ops], E, k, H, *[t.stride(0) for t in ops], threads)
        if status != 0:
            raise RuntimeError(f"native {name} failed (status {status}: bad sizes)")
        return True

    return step


def gru_backward_step_kernel():
    """step(dhs, h_prev, gates, rec, dgi, dghn) -> bool: one step of the GRU backward's elementwise part,
    in place (csrc/gru_backward_step.c states the formulas); None where the native kernel is not used
    (`_gru_step_kernel`)."""
    return _gru_step_kernel("gru_backward_step")


def gru_forward_step_kernel():
    """step(gi, gates, h, h_out) -> bool: one step of the GRU recurrence's elementwise part (r, z and n into
    `gates`, the new hidden state into `h_out`; csrc/gru_forward_step.c states the formulas); None where
    the native kernel is not used (`_gru_step_kernel`)."""
    return _gru_step_kernel("gru_forward_step")


CQL_BLOCK_KERNELS = ("cql_block_layer1", "cql_block_head", "cql_block_tail")


def cql_block_kernels() -> tuple | None:
    """(layer1, head, tail): the C functions of csrc/cql_block_*.c, the native form of the elementwise work of
    one block of kernels._BlockedLSE (the continuous CF-CQL penalty; each source states its formulas), called
    with raw pointers by `_BlockedLSE`; None when the native kernels are off or cannot be built here (the
    caller then takes the torch form)."""
    if not enabled():
        return None
    libs = [library(name) for name in CQL_BLOCK_KERNELS]
    if any(lib is None for lib in libs):
        return None
    return tuple(getattr(lib, name) for lib, name in zip(libs, CQL_BLOCK_KERNELS))
