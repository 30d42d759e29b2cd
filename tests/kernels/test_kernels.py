"""gpunets.kernels against NumPy (CPU) and, under numba's CUDA simulator, CUDA against CPU and NumPy."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from gpunets import kernels as K

RNG = np.random.default_rng(12345)
DTYPES = [np.float64, np.float32, np.int64, np.bool_]
SHAPES = [(257,), (40, 3)]
KS = [1, 2, 5]


def make(k, shape, dtype, rng=RNG):
    if np.dtype(dtype) == np.bool_:
        return [rng.integers(0, 2, size=shape).astype(bool) for _ in range(k)]
    if np.dtype(dtype).kind == "f":
        return [rng.normal(size=shape).astype(dtype) for _ in range(k)]
    return [rng.integers(-50, 50, size=shape).astype(dtype) for _ in range(k)]


def tol(dtype):
    return {"rtol": 1e-5, "atol": 1e-6} if np.dtype(dtype) == np.float32 else {"rtol": 1e-12, "atol": 1e-12}


def numpy_ref(name, arrays, **kw):
    s = np.stack(arrays)
    if name == "mean":
        return np.mean(s, axis=0)
    if name == "sum":
        return np.sum(s, axis=0)
    if name == "min":
        return np.minimum.reduce(arrays)
    if name == "max":
        return np.maximum.reduce(arrays)
    if name == "var":
        return np.var(s, axis=0, **kw)
    raise AssertionError(name)


def expected_dtype(name, dtype):
    dtype = np.dtype(dtype)
    if name in ("mean", "var"):
        return np.dtype(np.float32) if dtype == np.float32 else np.dtype(np.float64)
    return numpy_ref(name, [np.zeros(1, dtype)]).dtype


# ---- CPU against NumPy ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["mean", "sum", "min", "max", "var"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("k", KS)
def test_reductions_match_numpy(name, dtype, shape, k):
    arrays = make(k, shape, dtype)
    got = getattr(K, name)(arrays)
    want = numpy_ref(name, arrays)
    assert got.shape == shape
    assert got.dtype == expected_dtype(name, dtype)
    np.testing.assert_allclose(got, want, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", KS)
def test_weighted_mean_and_sum(dtype, k):
    arrays = make(k, (50, 2), dtype)
    w = RNG.uniform(0.1, 2.0, size=k)
    np.testing.assert_allclose(K.mean(arrays, w), np.average(np.stack(arrays), axis=0, weights=w), **tol(dtype))
    want = np.tensordot(w, np.stack(arrays).astype(np.float64), axes=1)
    got = K.weighted_sum(arrays, list(w))
    assert got.dtype == (np.float32 if dtype == np.float32 else np.float64)
    np.testing.assert_allclose(got, want, **tol(dtype))


def test_weighted_sum_allows_zero_sum_and_negative_weights():
    a, b = np.array([1.0, 2.0]), np.array([3.0, 5.0])
    np.testing.assert_array_equal(K.weighted_sum([a, b], [1, -1]), a - b)


def test_var_ddof():
    arrays = make(5, (30,), np.float64)
    np.testing.assert_allclose(K.var(arrays, ddof=1), np.var(np.stack(arrays), axis=0, ddof=1), rtol=1e-12)


def test_large_inputs_take_the_parallel_kernels():
    from gpunets.kernels import _cpu

    n = _cpu.PARALLEL_MIN + 17
    arrays = make(3, (n,), np.float64)
    np.testing.assert_allclose(K.mean(arrays), np.mean(np.stack(arrays), axis=0), rtol=1e-12)
    np.testing.assert_array_equal(K.max(arrays), np.maximum.reduce(arrays))


def test_any_ndim_and_non_contiguous_inputs():
    base = make(3, (6, 8, 2), np.float64)
    arrays = [a[:, ::2] for a in base]  # 3-D, non-contiguous
    np.testing.assert_allclose(K.mean(arrays), np.mean(np.stack(arrays), axis=0), rtol=1e-12)
    fortran = [np.asfortranarray(a[:, :, 0]) for a in base]
    np.testing.assert_allclose(K.sum(fortran), np.sum(np.stack(fortran), axis=0), rtol=1e-12)
    ro = base[0].copy()
    ro.flags.writeable = False
    np.testing.assert_allclose(K.min([ro, base[1]]), np.minimum(ro, base[1]))


@pytest.mark.parametrize("name", ["mean", "sum", "min", "max", "var", "vote"])
def test_empty_arrays(name):
    arrays = [np.empty(0), np.empty(0)] if name != "vote" else [np.empty(0, np.int64)] * 2
    out = getattr(K, name)(arrays)
    assert out.shape == (0,)
    assert K.hstack([np.empty(0), np.empty((0, 2))]).shape == (0, 3)


@pytest.mark.parametrize("name", ["mean", "sum", "min", "max", "var"])
@pytest.mark.parametrize("where", [0, 1, 2])
def test_nan_propagates(name, where):
    arrays = [np.array([1.0, 2.0, 3.0]) + i for i in range(3)]
    arrays[where] = arrays[where].copy()
    arrays[where][1] = np.nan
    out = getattr(K, name)(arrays)
    assert np.isnan(out[1]) and not np.isnan(out[[0, 2]]).any()
    np.testing.assert_array_equal(np.isnan(out), np.isnan(numpy_ref(name, arrays)))


def test_nan_propagates_weighted():
    a, b = np.array([np.nan, 1.0]), np.array([1.0, 1.0])
    assert np.isnan(K.mean([a, b], [1, 1])[0]) and np.isnan(K.weighted_sum([a, b], [1, 0])[0])


def test_integer_mean_is_float64_and_float32_kept():
    ints = [np.array([1, 2], np.int32), np.array([2, 2], np.int32)]
    assert K.mean(ints).dtype == np.float64 and K.var(ints).dtype == np.float64
    assert K.sum(ints).dtype == np.sum(np.stack(ints), axis=0).dtype
    assert K.min(ints).dtype == np.int32
    f32 = [np.ones(3, np.float32)] * 2
    for f in (K.mean, K.sum, K.min, K.max, K.var):
        assert f(f32).dtype == np.float32
    assert K.mean([np.array([True, False]), np.array([True, True])]).tolist() == [1.0, 0.5]


# ---- vote and hstack -----------------------------------------------------------------------------------------

def test_vote_majority_and_ties_to_smallest():
    a = [np.array([3, 1, 2, 9]), np.array([3, 2, 1, 8]), np.array([1, 2, 0, 7])]
    np.testing.assert_array_equal(K.vote(a), [3, 2, 0, 7])
    assert K.vote(a).dtype == np.int64
    two = [np.array([5, 0], np.int8), np.array([4, 1], np.int8)]
    out = K.vote(two)
    np.testing.assert_array_equal(out, [4, 0])
    assert out.dtype == np.int8


@pytest.mark.parametrize("k", KS)
def test_vote_matches_reference(k):
    labels = [RNG.integers(0, 4, size=(60, 2)) for _ in range(k)]
    s = np.stack(labels).reshape(k, -1)
    counts = np.stack([(s == c).sum(axis=0) for c in range(4)])
    np.testing.assert_array_equal(K.vote(labels).ravel(), counts.argmax(axis=0))  # argmax: first = smallest


def test_vote_strings_floats_bools_objects():
    s = [np.array(["cat", "dog", "emu"]), np.array(["dog", "dog", "cat"]), np.array(["ant", "cat", "emu"])]
    out = K.vote(s)
    assert out.tolist() == ["ant", "dog", "emu"] and out.dtype == np.dtype("<U3")
    widths = [np.array(["a", "bbb"]), np.array(["bbb", "bbb"])]
    assert K.vote(widths).tolist() == ["a", "bbb"]
    f = [np.array([0.5, 1.5]), np.array([1.5, 1.5]), np.array([0.5, 2.5])]
    assert K.vote(f).tolist() == [0.5, 1.5] and K.vote(f).dtype == np.float64
    b = [np.array([True, False]), np.array([True, True])]
    assert K.vote(b).tolist() == [True, False] and K.vote(b).dtype == bool
    o = [np.array(["x", "y"], dtype=object), np.array(["y", "y"], dtype=object)]
    assert K.vote(o).tolist() == ["x", "y"] and K.vote(o).dtype == object


def test_hstack():
    a, b = np.arange(4.0), np.arange(8.0).reshape(4, 2)
    np.testing.assert_array_equal(K.hstack([a, b, a]), np.column_stack([a, b, a]))
    np.testing.assert_array_equal(K.hstack([b]), b)
    big = [np.ones(_big_rows()), np.zeros((_big_rows(), 2))]
    np.testing.assert_array_equal(K.hstack(big), np.column_stack(big))
    s = [np.array(["a", "b"]), np.array(["c", "d"])]
    np.testing.assert_array_equal(K.hstack(s), np.column_stack(s))


def _big_rows():
    from gpunets.kernels import _cpu

    return _cpu.PARALLEL_MIN // 2 + 3


def test_output_pool_reuses_memory_only_after_release():
    n = (2 << 20) // 8
    arrays = [np.ones(n), np.ones(n)]
    first = K.mean(arrays)
    view = first[10:]
    del first
    second = K.sum(arrays)  # must not get view's memory
    np.testing.assert_array_equal(view, 1.0)
    np.testing.assert_array_equal(second, 2.0)
    assert not np.shares_memory(view, second)
    info = K.output_pool()
    assert info["limit"] > 0
    with pytest.raises(ValueError, match="limit must be >= 0"):
        K.output_pool(-1)


# ---- errors --------------------------------------------------------------------------------------------------

def test_errors_name_position_expectation_and_hint():
    a = np.ones(3)
    with pytest.raises(ValueError, match=r"arrays\[1\] has shape \(4,\), expected \(3,\) like arrays\[0\]"):
        K.mean([a, np.ones(4)])
    with pytest.raises(TypeError, match=r"arrays\[2\] has dtype float32, expected float64.*astype\(np.float64\)"):
        K.sum([a, a, a.astype(np.float32)])
    with pytest.raises(TypeError, match=r"arrays\[0\] is a list; accepted are numpy.ndarray.*np.asarray"):
        K.max([[1.0, 2.0], [3.0, 4.0]])
    with pytest.raises(TypeError, match=r"takes a list or tuple of arrays, got numpy.ndarray.*list\(a\)"):
        K.min(np.ones((2, 3)))
    with pytest.raises(ValueError, match="needs at least one array"):
        K.var([])
    with pytest.raises(TypeError, match=r"dtype <U1 is not supported; accepted are bool, integer"):
        K.mean([np.array(["a"]), np.array(["b"])])
    with pytest.raises(ValueError, match=r"unknown target 'gpu'; valid targets are \['cpu', 'cuda'\]"):
        K.mean([a], target="gpu")
    with pytest.raises(TypeError, match=r"arrays\[1\] has dtype <U1, expected int64"):
        K.vote([np.array([1]), np.array(["a"])])


def test_weight_and_ddof_errors():
    a = np.ones(3)
    with pytest.raises(ValueError, match="weights must be a 1-D sequence of length 2"):
        K.mean([a, a], weights=[1.0])
    with pytest.raises(ValueError, match="weights must be finite"):
        K.mean([a, a], weights=[1.0, np.nan])
    with pytest.raises(ValueError, match="weights sum to zero"):
        K.mean([a, a], weights=[1.0, -1.0])
    with pytest.raises(TypeError, match="weights must be 2 real numbers"):
        K.weighted_sum([a, a], ["x", "y"])
    with pytest.raises(ValueError, match=r"ddof must satisfy 0 <= ddof < 2"):
        K.var([a, a], ddof=2)
    with pytest.raises(TypeError, match="ddof must be an integer"):
        K.var([a, a], ddof=0.5)


def test_hstack_errors():
    with pytest.raises(ValueError, match=r"arrays\[1\] has 3 rows, expected 2 like arrays\[0\]"):
        K.hstack([np.ones(2), np.ones(3)])
    with pytest.raises(ValueError, match=r"arrays\[0\] has 3 dimensions"):
        K.hstack([np.ones((2, 2, 2))])
    with pytest.raises(TypeError, match=r"arrays\[1\] has dtype int64, expected float64.*astype"):
        K.hstack([np.ones(2), np.ones(2, np.int64)])


def test_errors_raise_before_compiling(monkeypatch):
    from gpunets.kernels import _cpu

    def boom(*args):
        raise AssertionError("launched")

    monkeypatch.setattr(_cpu, "_launch", boom)
    with pytest.raises(ValueError, match="shape"):
        K.mean([np.ones(2), np.ones(3)])


def test_import_gpunets_does_not_import_numba_and_kernels_not_cuda():
    code = ("import sys, gpunets; assert 'numba' not in sys.modules; import gpunets.kernels; "
            "assert 'numba.cuda' not in sys.modules and 'cupy' not in sys.modules")
    env = dict(os.environ)
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


# ---- CUDA under the simulator (or a real GPU) ----------------------------------------------------------------

def _cudasim() -> bool:
    import numba

    return bool(numba.config.ENABLE_CUDASIM)


needs_sim = pytest.mark.skipif(not _cudasim(), reason="needs NUMBA_ENABLE_CUDASIM=1 (set by conftest without a GPU)")


@needs_sim
@pytest.mark.parametrize("name", ["mean", "sum", "min", "max", "var"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64, np.uint8, np.bool_])
@pytest.mark.parametrize("k", [1, 3])
def test_cuda_sim_matches_cpu_and_numpy(name, dtype, k):
    arrays = make(k, (150,) if k == 1 else (50, 3), dtype)
    arrays[0].flat[7] = np.nan if np.dtype(dtype).kind == "f" else arrays[0].flat[7]
    got = getattr(K, name)(arrays, target="cuda")
    cpu = getattr(K, name)(arrays)
    assert isinstance(got, np.ndarray) and got.dtype == cpu.dtype and got.shape == cpu.shape
    np.testing.assert_allclose(got, cpu, **tol(dtype))
    np.testing.assert_allclose(got, numpy_ref(name, arrays), **tol(dtype))


@needs_sim
@pytest.mark.parametrize("dtype", [np.bool_, np.int16, np.uint64, np.float32])
def test_cuda_sim_weighted_mean_sum_and_var_equal_cpu_and_numpy(dtype):
    # bool failed to compile for a GPU (float() of a bool); the PTX check covers typing, this the values
    arrays = make(4, (90,), dtype)
    w = [0.5, 2.0, 0.25, 1.0]
    s = np.stack(arrays).astype(np.float64)
    for got, cpu, want in [
            (K.mean(arrays, w, target="cuda"), K.mean(arrays, w), np.average(s, axis=0, weights=w)),
            (K.weighted_sum(arrays, w, target="cuda"), K.weighted_sum(arrays, w), np.tensordot(w, s, axes=1)),
            (K.mean(arrays, target="cuda"), K.mean(arrays), np.mean(s, axis=0)),
            (K.var(arrays, ddof=1, target="cuda"), K.var(arrays, ddof=1), np.var(s, axis=0, ddof=1))]:
        assert got.dtype == cpu.dtype == (np.float32 if dtype == np.float32 else np.float64)
        np.testing.assert_array_equal(got, cpu)
        np.testing.assert_allclose(got, want, **tol(dtype))


@needs_sim
def test_cuda_sim_weights_vote_hstack_and_stream_ignored():
    arrays = make(3, (120,), np.float32)
    w = [0.2, 0.3, 1.5]
    np.testing.assert_allclose(K.mean(arrays, w, target="cuda", stream=object()), K.mean(arrays, w), rtol=1e-5)
    np.testing.assert_allclose(K.weighted_sum(arrays, w, target="cuda"), K.weighted_sum(arrays, w), rtol=1e-5)
    np.testing.assert_allclose(K.var(arrays, ddof=1, target="cuda"), K.var(arrays, ddof=1), rtol=1e-5)
    labels = [RNG.integers(0, 3, size=200) for _ in range(5)]
    np.testing.assert_array_equal(K.vote(labels, target="cuda"), K.vote(labels))
    s = [np.array(["b", "a", "c"]), np.array(["a", "b", "c"])]
    assert K.vote(s, target="cuda").tolist() == ["a", "a", "c"]
    cols = [np.arange(100.0), np.arange(200.0).reshape(100, 2)]
    np.testing.assert_array_equal(K.hstack(cols, target="cuda"), np.column_stack(cols))
    assert K.mean([np.empty(0)], target="cuda").shape == (0,)
    with pytest.raises(ValueError, match=r"arrays\[1\] has shape"):
        K.mean([np.ones(3), np.ones(2)], target="cuda")


@needs_sim
@pytest.mark.parametrize("dtype", ["bool", "uint16", "int64", "float32"])
@pytest.mark.parametrize("k", [1, 3])
def test_ptx_check_signatures_are_what_the_entry_points_launch(monkeypatch, dtype, k):
    import numba

    from gpunets.kernels import _cuda

    launched = []
    def run(self, name, n, arrays, *args):
        launched.append((name, tuple(numba.typeof(x) for x in (arrays, *args))))
        args[-1][...] = 0   # the output: valid codes for vote's decoding

    monkeypatch.setattr(_cuda._Launch, "run", run)
    arrays = make(k, (7,), dtype)
    for call in (lambda: K.mean(arrays, target="cuda"), lambda: K.mean(arrays, [1.0] * k, target="cuda"),
                 lambda: K.sum(arrays, target="cuda"), lambda: K.min(arrays, target="cuda"),
                 lambda: K.max(arrays, target="cuda"), lambda: K.var(arrays, target="cuda"),
                 lambda: K.vote(arrays, target="cuda"), lambda: K.hstack(arrays, target="cuda")):
        call()
    names = [name for name, _ in launched]
    assert names == ["mean", "wmean", "sum", "min", "max", "var", "vote", "hstack"]
    for name, types in launched:
        want_dtype = np.dtype(dtype) if name != "vote" or np.dtype(dtype).kind in "iu" else np.dtype(np.int64)
        assert str(want_dtype) in _cuda.KERNEL_DTYPES[name]
        assert types == _cuda.launch_types(name, want_dtype, k), name


@needs_sim
@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.uint32, np.float32, np.float64])
def test_cuda_sim_hstack_mixed_widths_equals_cpu_and_numpy(dtype):
    # more output elements (130 x 13) than the simulator's 128 threads: the grid-stride loop is exercised
    cols = [make(1, shape, dtype)[0] for shape in [(130,), (130, 3), (130, 1), (130,), (130, 5), (130, 2)]]
    cols += [make(1, (130,), dtype)[0]]
    got = K.hstack(cols, target="cuda")
    np.testing.assert_array_equal(got, np.column_stack(cols))
    np.testing.assert_array_equal(got, K.hstack(cols))
    assert got.dtype == np.dtype(dtype)


@needs_sim
def test_cuda_sim_grid_is_small():
    from gpunets.kernels import _cuda

    assert _cuda.launch_config(10**6) == (2, 64) and _cuda.launch_config(10) == (1, 64)


# ---- real GPU ------------------------------------------------------------------------------------------------

def _cupy_or_skip():
    if _cudasim():
        pytest.skip("the CUDA simulator is on")
    cupy = pytest.importorskip("cupy")
    if not cupy.cuda.is_available():
        pytest.skip("no CUDA GPU")
    return cupy


@pytest.mark.gpu
def test_gpu_mean_on_a_cupy_stream_equals_cpu():
    cp = _cupy_or_skip()
    host = make(4, (100_000,), np.float32)
    dev = [cp.asarray(a) for a in host]
    stream = cp.cuda.Stream(non_blocking=True)
    out = K.mean(dev, target="cuda", stream=stream)
    stream.synchronize()
    assert isinstance(out, cp.ndarray) and out.dtype == np.float32
    np.testing.assert_allclose(cp.asnumpy(out), K.mean(host), rtol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["sum", "min", "max", "var", "vote", "hstack"])
def test_gpu_kernels_on_ptds_and_numba_streams_equal_cpu(name):
    cp = _cupy_or_skip()
    from numba import cuda

    host = make(3, (5000,), np.int64 if name == "vote" else np.float64)
    dev = [cp.asarray(a) for a in host]
    for stream in (None, cp.cuda.Stream.ptds, cuda.stream()):
        out = getattr(K, name)(dev, target="cuda", stream=stream)
        cp.cuda.runtime.deviceSynchronize()
        np.testing.assert_allclose(cp.asnumpy(out), getattr(K, name)(host), rtol=1e-12)


@pytest.mark.gpu
def test_gpu_rejects_numpy_inputs():
    _cupy_or_skip()
    with pytest.raises(TypeError, match="cupy.asarray"):
        K.mean([np.ones(3)], target="cuda")


@pytest.mark.gpu
def test_gpu_kernels_wait_for_inputs_made_on_the_current_stream():
    cp = _cupy_or_skip()
    from numba import cuda

    m = cp.random.default_rng(1).standard_normal((2048, 2048), dtype=cp.float32) / 45
    cp.cuda.runtime.deviceSynchronize()
    s1 = cp.cuda.Stream(non_blocking=True)
    for stream in (cp.cuda.Stream(non_blocking=True), None, cuda.stream()):
        with s1:   # the inputs are still being computed on s1 (CuPy's current stream) when the kernel is issued
            x = m
            for _ in range(8):
                x = cp.tanh(x @ m)
            arrays = [x[:, k] for k in range(4)]   # columns: not contiguous, copied on the kernel's stream
            got = K.mean(arrays, target="cuda", stream=stream)
            cp.cuda.runtime.deviceSynchronize()
            assert isinstance(got, cp.ndarray) and got.dtype == np.float32
            want = cp.asnumpy(x[:, :4]).mean(axis=1)
        np.testing.assert_allclose(cp.asnumpy(got), want, rtol=1e-5, atol=1e-6)
