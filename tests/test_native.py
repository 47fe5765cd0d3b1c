"""The native (C) kernels (algorithms/common/native.py) against the torch forms they stand in for, and
their build: cached by content, written atomically, and replaced by the torch form (with one warning)
where they cannot be built or are switched off."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import warnings

import pytest
import torch
from click.testing import CliRunner

from plcql_bench.algorithms.common import kernels_discrete as fast
from plcql_bench.algorithms.common import native
from plcql_bench.suite.commands.main import cli

HAS_CC = shutil.which(os.environ.get("CC", "cc")) is not None
needs_cc = pytest.mark.skipif(not HAS_CC, reason="no C compiler on this machine")


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """A fresh build cache and no library loaded yet (restored afterwards)."""
    monkeypatch.setenv("PLCQL_NATIVE_CACHE", str(tmp_path))
    monkeypatch.setattr(native, "_LIBS", {})
    return tmp_path


def _inputs(seed: int, members: int = 3, M: int = 37, n: int = 4, A: int = 7, Em: int = 32, scale: float = 1.0):
    """cf_negative's inputs in float32: rows r = e·M + m; |W1|, |W2| >= 0 as QMIX's; one agent of state 0
    with no available action (it must drop out), the no-op always available elsewhere."""
    g = torch.Generator().manual_seed(seed)
    R = members * M
    pre = torch.randn(R, Em, generator=g)
    delta = torch.randn(R, n, A, generator=g) * scale
    w1 = torch.rand(R, n, Em, generator=g)
    w2 = torch.rand(R, Em, generator=g)
    b2 = torch.randn(R, 1, generator=g)
    avail = (torch.rand(M, n, A, generator=g) < 0.6).float()
    avail[..., 0] = 1.0
    avail[0, 1] = 0.0
    logbeta = (torch.softmax(torch.randn(M, n, A, generator=g), -1) + 1e-5).log()
    return [pre, delta, w1, w2, b2], avail, logbeta


def _run(parts, avail, logbeta, temp, members, up, use_native: bool):
    """neg, λ and the gradients of (neg · up).sum() with respect to the five differentiable inputs."""
    leaves = [p.clone().requires_grad_() for p in parts]
    native.use_native(use_native)
    try:
        neg, lam = fast.cf_negative(*leaves, avail, logbeta, temp, members)
    finally:
        native.use_native(True)
    grads = torch.autograd.grad((neg * up).sum(), leaves)
    return [neg.detach(), lam, *grads]


@needs_cc
@pytest.mark.parametrize("temp, with_beta, scale", [(0.0, False, 1.0), (5.0, True, 1.0), (100.0, True, 1.0),
                                                    (5.0, True, 60.0)])
def test_native_cf_negative_matches_the_torch_form(temp, with_beta, scale):
    """Values, λ and every gradient as the torch form's, for uniform λ, the KL-softmax λ, the hard argmax
    (temp >= 100), and pre-activations far below −87 (scale 60: the clamped exp)."""
    assert native.library("cf_negative") is not None  # a compiler is here: the kernel must build
    members, M = 3, 37
    parts, avail, logbeta = _inputs(1, members, M, scale=scale)
    if scale > 1:
        assert float((parts[0][:, None, None] + parts[1][..., None] * parts[2][:, :, None]).min()) < -200
    up = torch.randn(members * M, generator=torch.Generator().manual_seed(2))
    lb = logbeta if with_beta else None
    got = _run(parts, avail, lb, temp, members, up, use_native=True)
    exp = _run(parts, avail, lb, temp, members, up, use_native=False)
    for name, a, b in zip(["neg", "lam", "d pre", "d delta", "d w1", "d w2", "d b2"], got, exp):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5 * float(b.abs().max()), msg=name)
    # the agent without an available action contributes nothing: its λ·keep is 0 in every member
    assert float(got[3].view(members, M, 4, 7)[:, 0, 1].abs().max()) == 0.0


@needs_cc
def test_the_fused_path_calls_the_native_kernel(monkeypatch):
    """kernels_discrete.cf_negative takes the C form's outputs when it is available (float32 on CPU) and
    the torch form for float64, which the C form does not take."""
    calls = []
    real = native.cf_negative

    def spy(*a, **k):
        out = real(*a, **k)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(native, "cf_negative", spy)
    parts, avail, logbeta = _inputs(3)
    fast.cf_negative(*parts, avail, logbeta, 5.0, 3)
    fast.cf_negative(*[p.double() for p in parts], avail.double(), logbeta.double(), 5.0, 3)
    assert calls == [True, False]


def test_switched_off_or_without_a_compiler_the_torch_form_runs(own_cache, monkeypatch):
    parts, avail, logbeta = _inputs(4)
    monkeypatch.setenv("PLCQL_NATIVE", "0")
    assert native.cf_negative(*parts, avail, logbeta, 5.0, 3) is None
    assert list(own_cache.iterdir()) == []  # nothing built
    monkeypatch.delenv("PLCQL_NATIVE")
    monkeypatch.setenv("CC", str(own_cache / "no-such-compiler"))
    with pytest.warns(RuntimeWarning, match="native kernel 'cf_negative' unavailable.*no C compiler"):
        assert native.cf_negative(*parts, avail, logbeta, 5.0, 3) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once: the next call goes quietly to the torch form
        neg, lam = fast.cf_negative(*parts, avail, logbeta, 5.0, 3)
    assert neg.shape == (3 * 37,) and torch.isfinite(neg).all()


@needs_cc
def test_the_build_is_cached_by_content_and_leaves_no_partial_file(own_cache, monkeypatch):
    first = native._build("cf_negative")
    assert first.parent == own_cache and first.exists()
    assert [p.name for p in own_cache.iterdir()] == [first.name]  # no temporary file left behind

    def no_compiler_call(cmd, *a, **k):
        if "-o" in cmd:
            raise AssertionError("rebuilt a cached library")
        return real_run(cmd, *a, **k)

    real_run = native.subprocess.run
    monkeypatch.setattr(native.subprocess, "run", no_compiler_call)
    assert native._build("cf_negative") == first
    monkeypatch.setattr(native.subprocess, "run", real_run)
    monkeypatch.setattr(native, "FLAGS", [*native.FLAGS, "-DPLCQL_TEST_FLAG"])  # other flags: another file
    second = native._build("cf_negative")
    assert second != first and second.exists()


def test_a_failed_compile_names_the_source(own_cache, monkeypatch):
    monkeypatch.setattr(native, "FLAGS", [*native.FLAGS, "-DPLCQL_BROKEN", "--no-such-flag-for-any-compiler"])
    if not HAS_CC:
        pytest.skip("no C compiler on this machine")
    with pytest.raises(RuntimeError, match="failed on cf_negative.c"):
        native._build("cf_negative")
    assert list(own_cache.iterdir()) == []  # the partial output was removed


def test_the_c_sources_are_shipped_with_the_package():
    """A non-editable install (the images') must carry csrc/*.c, or the kernels silently fall back."""
    import tomllib
    from pathlib import Path

    conf = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "plcql_bench.algorithms.common.csrc" in conf["packages"]
    assert conf["package-data"]["plcql_bench.algorithms.common.csrc"] == ["*.c", "*.h"]
    assert sorted(p.name for p in native.SOURCES.glob("*.c")) == [
        "cf_negative.c", "cql_block_head.c", "cql_block_layer1.c", "cql_block_tail.c", "gru_backward_step.c",
        "gru_forward_step.c"]


@needs_cc
def test_an_unwritable_cache_builds_in_the_temporary_folder(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("PLCQL_NATIVE_CACHE", str(blocker / "cache"))  # cannot be created
    monkeypatch.setattr(native.tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    lib = native._build("cf_negative")
    assert lib.parent == tmp_path / "tmp" / f"plcql-bench-native-{os.getuid()}" and lib.exists()
    assert native._build("cf_negative") == lib  # found there next time


def _count_steps(monkeypatch, kernel: str) -> list[bool]:
    """Wrap native.KERNEL so that each call of the step function it returns appends whether the C form took
    the step (True) or left it to the torch ops (False)."""
    calls: list[bool] = []
    real = getattr(native, kernel)

    def spy():
        step = real()
        if step is None:
            return None

        def counted(*ops):
            calls.append(step(*ops))
            return calls[-1]
        return counted

    monkeypatch.setattr(native, kernel, spy)
    return calls


def _gru_grads(on: bool, packed: bool, dtype=torch.float32):
    """Every gradient of one fused GRU (3 members, ragged packed rows or the padded layout with h0), with the
    native backward step switched on or off."""
    g = torch.Generator().manual_seed(7)
    E, N, H, T, In = 3, 40, 16, 9, 12

    def param(*shape, scale=0.3):
        return (torch.randn(*shape, generator=g, dtype=dtype) * scale).requires_grad_()

    w_ih, b_ih, w_hh, b_hh = param(E, In, 3 * H), param(E, 1, 3 * H, scale=0.1), param(E, H, 3 * H), param(E, 1, 3 * H, scale=0.1)
    if packed:
        lengths = torch.randint(1, T, (N,), generator=g)
        pk = fast.Packing.of(lengths, T, 1)
        x = param(E, pk.offsets[-1] + pk.rows[-1], In, scale=1.0)
        inputs = (x, w_ih, b_ih, w_hh, b_hh)
        with native.native_kernels(on):
            hs = fast._gru(x, w_ih, b_ih, w_hh, b_hh, None, pk)
    else:
        x, h0 = param(E, T * N, In, scale=1.0), param(E, N, H, scale=1.0)
        inputs = (x, w_ih, b_ih, w_hh, b_hh, h0)
        with native.native_kernels(on):
            hs = fast.fused_gru(x, w_ih, b_ih, w_hh, b_hh, h0, T)
    out_grad = torch.randn(hs.shape, generator=g, dtype=dtype)
    with native.native_kernels(on):
        return torch.autograd.grad(hs, inputs, out_grad)


@needs_cc
@pytest.mark.parametrize("packed", [False, True])
def test_native_gru_backward_step_matches_the_torch_form(packed, monkeypatch):
    """The GRU backward with its per-step elementwise part in C gives the torch ops' gradients (x, both
    weights and biases, h0) up to float rounding, and is what runs for float32 on the CPU; float64 takes
    the torch ops."""
    calls = _count_steps(monkeypatch, "gru_backward_step_kernel")
    monkeypatch.setattr(native, "gru_forward_step_kernel", lambda: None)  # this test: the backward step alone
    plain, native_ = _gru_grads(False, packed), _gru_grads(True, packed)
    assert calls and all(calls)  # every step of the native run took the C form
    for a, b in zip(plain, native_, strict=True):
        # rounding relative to the gradient's scale: a weight gradient sums T x N terms, and where they cancel
        # the float32 error is the terms' (1e-6 of |grad|max), not the small sum's (3.8e-6 on an AVX2 EPYC)
        scale = float(a.abs().max())
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6 * max(1.0, scale)), (float((a - b).abs().max()), scale)
    calls.clear()
    wide = _gru_grads(True, packed, torch.float64)
    assert calls and not any(calls)  # float64: the torch ops
    for a, b in zip(wide, _gru_grads(False, packed, torch.float64), strict=True):
        assert torch.equal(a, b)


@needs_cc
@pytest.mark.parametrize("packed", [False, True])
def test_native_gru_forward_step_matches_the_torch_form(packed, monkeypatch):
    """The GRU recurrence with its per-step elementwise part in C gives the torch ops' hidden states (and,
    through the saved gates, their gradients) up to float rounding, with and without autograd; float64
    takes the torch ops."""
    calls = _count_steps(monkeypatch, "gru_forward_step_kernel")
    g = torch.Generator().manual_seed(11)
    E, N, H, T, In = 3, 40, 16, 9, 12
    x, w_ih, b_ih = torch.randn(E, T * N, In, generator=g) * 3, torch.randn(E, In, 3 * H, generator=g), torch.randn(E, 1, 3 * H, generator=g)
    w_hh, b_hh, h0 = torch.randn(E, H, 3 * H, generator=g), torch.randn(E, 1, 3 * H, generator=g), torch.randn(E, N, H, generator=g)
    pk = fast.Packing.of(torch.randint(1, T, (N,), generator=g), T, 1) if packed else fast.Packing.full(T, N)
    x = x[:, : pk.offsets[-1] + pk.rows[-1]]
    outs = {}
    for on in (False, True):
        with native.native_kernels(on), torch.no_grad():
            outs[on] = fast._gru(x, w_ih, b_ih, w_hh, b_hh, None if packed else h0, pk)
    assert calls and all(calls)
    assert torch.allclose(outs[False], outs[True], rtol=1e-5, atol=2e-6), float((outs[False] - outs[True]).abs().max())
    for a, b in zip(_gru_grads(False, packed), _gru_grads(True, packed), strict=True):  # with autograd
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5), float((a - b).abs().max())
    calls.clear()
    with native.native_kernels(True), torch.no_grad():
        fast._gru(x.double(), w_ih.double(), b_ih.double(), w_hh.double(), b_hh.double(), None, pk)
    assert calls and not any(calls)  # float64: the torch ops


@needs_cc
@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads the process's mapped libraries")
def test_the_openmp_kernel_shares_torchs_openmp_runtime():
    """The GRU step kernels are built with -fopenmp: they must run on the OpenMP runtime torch loaded (its
    threads), not load a second one (two pools of threads would compete for the cores)."""
    assert native.gru_backward_step_kernel() is not None and native.gru_forward_step_kernel() is not None
    with open("/proc/self/maps") as maps:
        runtimes = {line.split()[-1] for line in maps if "gomp" in line or "libiomp" in line or "libomp" in line}
    assert len(runtimes) <= 1, runtimes


# --------------------------------------------------------------------------------------------------------------
# The ctypes declarations against the C prototypes


_C_TO_CTYPES = {"float *": ctypes.c_void_p, "const float *": ctypes.c_void_p, "int64_t": ctypes.c_int64,
                "float": ctypes.c_float, "int": ctypes.c_int}


def _c_prototype(name: str) -> tuple[str, list[str]]:
    """(result type, parameter types) of the function NAME in csrc/NAME.c, read from its definition."""
    src = (native.SOURCES / f"{name}.c").read_text()
    match = re.search(rf"^(\w+)\s+{name}\s*\(([^)]*)\)\s*\{{", src, re.M)
    assert match, f"csrc/{name}.c: no definition of {name}"
    params = [" ".join(p.split()) for p in match.group(2).split(",")]
    types = [re.sub(r"\s*\w+$", "", p).replace("* ", "*").replace("*", " *").replace("  ", " ").strip()
             for p in params]
    return match.group(1), types


@pytest.mark.parametrize("name", native.KERNELS)
def test_ctypes_declarations_match_the_c_prototypes(name):
    """Every argument's ctypes type is the C parameter's (pointer, int64_t, float, int), in order and number:
    a parameter added to or moved in the C source without its declaration fails here, not as a crash."""
    class Lib:  # stands in for the loaded library: _declare only sets attributes
        pass

    lib = Lib()
    setattr(lib, name, type("Fn", (), {})())
    native._declare(name, lib)
    fn = getattr(lib, name)
    result, params = _c_prototype(name)
    assert list(fn.argtypes) == [_C_TO_CTYPES[p] for p in params], name
    assert fn.restype is _C_TO_CTYPES[result]


def test_the_prototype_reader_reads_each_parameter():
    result, params = _c_prototype("gru_forward_step")
    assert result == "int" and params[:4] == ["const float *", "float *", "const float *", "float *"]
    assert params[4:] == ["int64_t"] * 7 + ["int"]


def test_build_all_names_every_kernel_and_the_fallback(own_cache, monkeypatch):
    monkeypatch.setattr(native, "_LIBS", {})
    monkeypatch.setenv("CC", "no-such-compiler-xyz")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out = native.build_all()
    assert set(out) == set(native.KERNELS) == {"cf_negative", "gru_backward_step", "gru_forward_step",
                                               "cql_block_layer1", "cql_block_head", "cql_block_tail"}
    assert all("torch form" in why for why in out.values()) and native.loaded() == []
    monkeypatch.setenv(native.ENV, "0")
    assert all(why.startswith("off (PLCQL_NATIVE=0)") for why in native.build_all().values())


def test_build_kernels_command_prints_one_line_per_kernel(own_cache, monkeypatch):
    monkeypatch.setenv("CC", "no-such-compiler-xyz")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        res = CliRunner().invoke(cli, ["build-kernels"])
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == list(native.KERNELS)
    assert all("torch form" in line for line in lines)
