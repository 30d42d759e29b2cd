"""The cached launch path of the CUDA kernels (``gpunets.kernels._cached``), checked without a GPU.

- the parameter layout against numba-cuda itself: the PTX entry of every kernel (compiled by NVVM, no GPU) and
  the dispatcher's own argument flattening (``_Kernel._prepare_args``), in a process without the simulator;
- the packing into the parameter buffer, read back through the pointers the kernel is given;
- the whole path of ``kernels.*(target="cuda")`` on a stand-in for CuPy whose "launch" decodes the parameter
  buffer back into arrays and runs the CPU kernel on them: equal to the CPU kernels to the bit;
- the fallback to numba's dispatcher, and the launch-path setting.

On a real GPU, ``test_both_launch_paths_agree_bitwise_on_a_gpu`` compares the two paths and the CPU kernels.
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
import subprocess
import sys
import threading
import types
from pathlib import Path

import numpy as np
import pytest

from gpunets import kernels as K

ROOT = Path(__file__).resolve().parents[2]

_LAYOUT = r"""
import json, sys
import numpy as np
from numba import cuda
from numba.cuda.dispatcher import _Kernel
from gpunets.kernels import _cached, _cuda
from gpunets.kernels import _validate as V

try:
    cuda.compile_ptx(lambda a: None, "(float32[:],)", cc=(8, 0))
except Exception as e:
    print(json.dumps({"no_nvvm": str(e)[:200]})); sys.exit(0)


class Hint:   # numba's ArgHint protocol: to_device gives the "device array" the dispatcher flattens
    def __init__(self, a):
        self.a = a
    def to_device(self, retr, stream=0):
        a = self.a
        return type("Dev", (), {"size": a.size, "dtype": a.dtype, "ptr": a.ctypes.data, "shape": a.shape,
                                "_layout": type("L", (), {"strides_in_bytes": a.strides})()})()


from numba.cuda.args import ArgHint
Hint = type("Hint", (ArgHint,), dict(Hint.__dict__))
stub = type("K", (), {"extensions": [], "_prepare_args": _Kernel._prepare_args})()


def host_args(name, dtype, k):
    dtype = np.dtype(dtype)
    arrays = tuple(np.arange(2 * 3, dtype=np.float64).astype(dtype).reshape((2, 3) if name == "hstack" else -1)
                   for _ in range(k))
    if name == "mean":
        rest = (float(k), np.zeros(6, V.mean_dtype(dtype)))
    elif name == "wmean":
        rest = (tuple(0.5 + j for j in range(k)), 2.0, np.zeros(6, V.mean_dtype(dtype)))
    elif name == "sum":
        rest = (V.sum_zero(dtype), np.zeros(6, V.sum_dtype(dtype)))
    elif name == "var":
        rest = (1.0, np.zeros(6, V.mean_dtype(dtype)))
    elif name == "hstack":
        rest = (tuple(3 * j for j in range(k)), np.zeros((2, 3 * k), dtype))
    else:
        rest = (np.zeros(6, dtype),)
    return (arrays, *rest)


def numba_values(sig, args):
    out = []
    for t, v in zip(sig, args):
        wrapped = tuple(Hint(a) for a in v) if isinstance(v, tuple) and isinstance(v[0], np.ndarray) else (
            Hint(v) if isinstance(v, np.ndarray) else v)
        stub._prepare_args(t, wrapped, 0, [], out)
    return [x.value if hasattr(x, "value") else x for x in out]


rows = []
for name in _cuda._KERNELS:
    for dt in ("bool", "uint8", "int32", "uint64", "float32", "float64"):
        if dt not in _cuda.KERNEL_DTYPES[name]:
            continue
        for k in (1, 3):
            sig = _cuda.launch_types(name, dt, k)
            ptx, _ = cuda.compile_ptx(_cuda._KERNELS[name].py_func, sig, cc=(9, 0))
            entry, params = _cached.ptx_entry(ptx)
            fmt = _cached.param_format(sig)
            try:
                _cached.check_abi(fmt, _cached.ptx_param_sizes(params))
                abi = "ok"
            except _cached.AbiMismatch as e:
                abi = str(e)
            args = host_args(name, dt, k)
            mine = [float(x) if isinstance(x, (float, np.floating)) else int(x)
                    for x in _cached.param_values(sig, args)]
            theirs = [float(x) if isinstance(x, (float, np.floating)) else int(x) for x in numba_values(sig, args)]
            rows.append([name, dt, k, abi, mine == theirs, len(mine), len(_cached.ptx_param_sizes(params))])

# compile_kernel end to end but for the GPU: numba's PTX written, "loaded" by a stand-in for CuPy, the file removed
import os, types
seen = {}


class RawModule:
    def __init__(self, path):
        seen["path"], seen["ptx"] = path, open(path).read()

    def get_function(self, name):
        seen["entry"] = name
        return types.SimpleNamespace(kernel=lambda *a: seen.setdefault("launches", []).append(a))


standin = types.SimpleNamespace(RawModule=RawModule,
                                cuda=types.SimpleNamespace(function=types.SimpleNamespace(CPointer=lambda a: a)))
ck = _cached.compile_kernel("mean", _cuda._KERNELS["mean"].py_func, _cuda.launch_types("mean", "float32", 2), (9, 0),
                            standin)
loaded = {"entry_in_ptx": ".entry " + seen["entry"] in seen["ptx"], "file_removed": not os.path.exists(seen["path"]),
          "params": len(ck.args), "entry": seen["entry"][:30]}
print(json.dumps({"rows": rows, "loaded": loaded}))
"""


@pytest.mark.slow   # 15-30 s: NVVM compiles each kernel
def test_the_packed_layout_is_numbas_ptx_and_dispatcher_layout():
    """For each kernel, dtype and K: the PTX entry takes exactly the parameters packed here (count and widths),
    and numba-cuda's dispatcher flattens the same host arguments to the same values, in the same order."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("numba-cuda")
    except PackageNotFoundError:   # numba's own CUDA target (deprecated) is not what the gpu/ptx extras install
        pytest.skip("numba-cuda is not installed (pip install -e '.[ptx]'): the layout checked is its dispatcher's")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", _LAYOUT], env=env, capture_output=True, text=True, timeout=600,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    if "no_nvvm" in res:
        pytest.skip(f"libNVVM is not installed: {res['no_nvvm']}")
    rows = res["rows"]
    assert {r[0] for r in rows} == {"mean", "wmean", "sum", "min", "max", "var", "vote", "hstack"}
    bad = [r for r in rows if r[3] != "ok" or not r[4] or r[5] != r[6]]
    assert not bad, bad
    assert len(rows) >= 80
    assert res["loaded"] == {"entry_in_ptx": True, "file_removed": True, "params": 2 * 7 + 1 + 7,
                             "entry": "_ZN7gpunets7kernels5_cuda7_k_m"}, res["loaded"]


# ---- packing, read back through the kernel's pointers ---------------------------------------------------------

def _sig(*values):
    import numba

    return tuple(numba.typeof(v) for v in values)


def test_cached_kernel_packs_each_parameter_into_its_own_slot():
    launched = []

    def function(grid, block, args, shared_mem, stream):
        # what the driver reads: each parameter's bytes at the address it is given
        launched.append((grid, block, [ctypes.string_at(p, 8) for p in args], shared_mem, stream))

    a = np.arange(5, dtype=np.float32)
    out = np.zeros(5, dtype=np.float32)
    sig = _sig((a, a), (1.5, -2.0), np.float64(3.0), out)
    from gpunets.kernels import _cached

    ck = _cached.CachedKernel("t", sig, function, pointer=lambda addr: addr)
    ck.launch(7, 64, "stream", ((a, a), (1.5, -2.0), np.float64(3.0), out))
    (grid, block, raw, shm, stream), = launched
    assert (grid, block, shm, stream) == ((7,), (64,), 0, "stream")
    assert len(raw) == 2 * 7 + 2 + 1 + 7
    q = [struct.unpack("<q", b)[0] for b in raw]
    d = [struct.unpack("<d", b)[0] for b in raw]
    assert q[:7] == [0, 0, 5, 4, a.ctypes.data, 5, 4] and q[7:14] == q[:7]
    assert d[14:17] == [1.5, -2.0, 3.0]
    assert q[17:] == [0, 0, 5, 4, out.ctypes.data, 5, 4]
    assert ck.launches == 1


def test_narrow_parameters_sit_in_the_low_bytes_of_their_slot():
    from numba.core import types

    from gpunets.kernels import _cached

    seen = []
    sig = (types.int32, types.float32, types.uint8, types.boolean, types.int64)
    ck = _cached.CachedKernel("t", sig, lambda g, b, args, s, st: seen.extend(ctypes.string_at(p, 8) for p in args),
                              pointer=lambda addr: addr)
    ck.launch(1, 1, None, (-3, 0.25, 200, True, -1))
    assert struct.unpack("<i", seen[0][:4])[0] == -3 and struct.unpack("<f", seen[1][:4])[0] == 0.25
    assert seen[2][0] == 200 and seen[3][0] == 1 and struct.unpack("<q", seen[4])[0] == -1
    assert _cached.param_format(sig) == "<i4xf4xB7x?7xq"


def test_abi_check_refuses_a_layout_that_is_not_the_ptx_entrys():
    from gpunets.kernels import _cached

    fmt = _cached.param_format(_sig(np.zeros(3), 1.0))
    _cached.check_abi(fmt, [8] * 7 + [8])
    with pytest.raises(_cached.AbiMismatch, match="8 parameters of widths"):
        _cached.check_abi(fmt, [8] * 7 + [4])
    with pytest.raises(_cached.AbiMismatch, match="takes 9 parameters"):
        _cached.check_abi(fmt, [8] * 9)
    ptx = ".visible .entry _Z1f(\n\t.param .u64 _Z1f_param_0,\n\t.param .f32 _Z1f_param_1\n)\n{"
    name, params = _cached.ptx_entry(ptx)
    assert name == "_Z1f" and _cached.ptx_param_sizes(params) == [8, 4]
    with pytest.raises(_cached.AbiMismatch, match="one kernel entry"):
        _cached.ptx_entry(ptx + ptx)


def test_param_values_refuse_a_shape_the_kernel_was_not_compiled_for():
    from gpunets.kernels import _cached

    sig = _sig((np.zeros(2), np.zeros(2)))
    with pytest.raises(ValueError, match="tuple of 3"):
        _cached.param_values(sig, ((np.zeros(2),) * 3,))
    with pytest.raises(ValueError, match="2 dimensions"):
        _cached.param_values(sig, ((np.zeros((2, 2)), np.zeros((2, 2))),))


# ---- the whole path on a stand-in GPU ---------------------------------------------------------------------------

class _Dev(np.ndarray):
    """A "device array": host memory behind a CUDA array interface (its address is a real pointer)."""

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ctypes.data, False), "version": 3,
                "strides": None if self.flags.c_contiguous else self.strides}


class _Stream:
    __module__ = "cupy.cuda.stream"   # what the backend recognises as a CuPy stream

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def wait_event(self, ev) -> None:
        pass


def _standin_cupy():
    current = _Stream(7)
    dev = lambda f: (lambda *a, **kw: np.asarray(f(*a, **kw)).view(_Dev))   # noqa: E731
    runtime = types.SimpleNamespace(getDevice=lambda: 0, deviceGetAttribute=lambda attr, d: 4,
                                    cudaDevAttrMultiProcessorCount=16)
    cuda = types.SimpleNamespace(get_current_stream=lambda: current, Stream=_Stream, runtime=runtime,
                                 Event=lambda disable_timing=True: types.SimpleNamespace(record=lambda s=None: None),
                                 Device=lambda d=0: types.SimpleNamespace(compute_capability="90"))
    return types.SimpleNamespace(ndarray=_Dev, cuda=cuda, asarray=dev(np.asarray),
                                 ascontiguousarray=dev(np.ascontiguousarray), empty=dev(np.empty),
                                 concatenate=dev(np.concatenate), reshape=dev(np.reshape), unique=dev(np.unique),
                                 int64=np.int64)


def _decode(sig, raw: list[bytes], arrays_by_ptr: dict[int, np.ndarray]) -> list:
    """The kernel's arguments rebuilt from its parameter bytes (the inverse of ``_cached.param_values``)."""
    from numba.core import types

    pos = [0]

    def take(code: str):
        v = struct.unpack("<" + code, raw[pos[0]][:struct.calcsize("<" + code)])[0]
        pos[0] += 1
        return v

    def one(ty):
        if isinstance(ty, types.Array):
            meminfo, parent, size, itemsize, ptr = (take("q") for _ in range(5))
            shape = tuple(take("q") for _ in range(ty.ndim))
            strides = tuple(take("q") for _ in range(ty.ndim))
            assert meminfo == parent == 0
            base = arrays_by_ptr[ptr]   # the memory at that address (a view of it may have another shape)
            dtype = np.dtype(str(ty.dtype))
            assert itemsize == dtype.itemsize and size == int(np.prod(shape)) and size * itemsize <= base.nbytes
            return np.ndarray(shape, dtype, buffer=base, strides=strides)
        if isinstance(ty, types.BaseTuple):
            return tuple(one(t) for t in ty)
        from gpunets.kernels import _cached

        return take(_cached._scalar_code(ty)[0])

    args = [one(t) for t in sig]
    assert pos[0] == len(raw), "every parameter read"
    return args


@pytest.fixture
def standin_gpu(monkeypatch):
    """The CUDA backend as on a GPU (no simulator), on the stand-in CuPy; a cached kernel's "launch" decodes
    its parameter buffer and runs the CPU kernel on the arrays the pointers name."""
    from gpunets.kernels import _cached, _cpu, _cuda

    cp = _standin_cupy()
    live: dict[int, np.ndarray] = {}
    real_empty, real_contig = cp.empty, cp.ascontiguousarray

    def track(f):
        def make(*a, **kw):
            x = f(*a, **kw)
            live[x.ctypes.data] = x.view(np.ndarray)
            return x
        return make

    cp.empty, cp.ascontiguousarray = track(real_empty), track(real_contig)
    compiled: list[tuple] = []

    def compile_cached(name, dtype, k, cupy):
        sig = _cuda.launch_types(name, dtype, k)
        compiled.append((name, str(dtype), k))

        def function(grid, block, args, shared_mem, stream):
            assert stream is cp.cuda.get_current_stream() or isinstance(stream, _Stream)
            vals = _decode(sig, [ctypes.string_at(p, 8) for p in args], live)
            out = vals[-1]
            _cpu._launch(name, int(out.size), *vals)

        return _cached.CachedKernel(name, sig, function, pointer=lambda addr: addr)

    monkeypatch.setattr(_cuda, "SIMULATOR", False)
    monkeypatch.setattr(_cuda, "check_available", lambda: None)
    monkeypatch.setattr(_cuda, "_cupy", lambda: cp)
    monkeypatch.setattr(_cuda, "numba_stream", lambda s: ("numba", s))
    monkeypatch.setattr(_cuda, "_compile_cached", compile_cached)
    monkeypatch.setattr(_cached, "_REGISTRY", {})
    monkeypatch.setitem(_cached.LAUNCHES, "cached", 0)
    monkeypatch.setitem(_cached.LAUNCHES, "dispatcher", 0)
    monkeypatch.setitem(_cached.LAUNCH, "path", "auto")

    def to_dev(a):
        x = np.ascontiguousarray(a).view(_Dev)
        live[x.ctypes.data] = x.view(np.ndarray)
        return x

    return types.SimpleNamespace(cp=cp, to_dev=to_dev, compiled=compiled, cuda=_cuda)


CALLS = [
    ("mean", lambda a, t: K.mean(a, target=t)),
    ("wmean", lambda a, t: K.mean(a, weights=[0.25 * (j + 1) for j in range(len(a))], target=t)),
    ("weighted_sum", lambda a, t: K.weighted_sum(a, [(-1.0) ** j for j in range(len(a))], target=t)),
    ("sum", lambda a, t: K.sum(a, target=t)),
    ("min", lambda a, t: K.min(a, target=t)),
    ("max", lambda a, t: K.max(a, target=t)),
    ("var", lambda a, t: K.var(a, ddof=1, target=t)),
    ("hstack", lambda a, t: K.hstack(a, target=t)),
]


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "uint8", "bool"])
@pytest.mark.parametrize("call", CALLS, ids=[c[0] for c in CALLS])
def test_the_cached_path_gives_the_cpu_kernels_bits(standin_gpu, dtype, call):
    rng = np.random.default_rng(3)
    host = [(rng.standard_normal((40, 3)) * 50).astype(dtype) for _ in range(3)]
    if call[0] == "hstack":
        host[1] = host[1][:, 0].copy()   # a column beside matrices
    else:
        host[0] = host[0][:, ::-1]   # a strided view: made contiguous on the kernel's stream first
    dev = [standin_gpu.to_dev(h) for h in host]
    want = call[1](host, "cpu")
    got = call[1](dev, "cuda")
    assert np.asarray(got).dtype == want.dtype and np.asarray(got).shape == want.shape
    np.testing.assert_array_equal(np.asarray(got).view(np.uint8), want.view(np.uint8))   # the same bits
    assert standin_gpu.cuda.LAUNCHES == {"cached": 1, "dispatcher": 0}


def test_vote_runs_on_the_cached_path_and_each_signature_compiles_once(standin_gpu):
    to_dev = standin_gpu.to_dev
    labels = [np.array([3, 1, 2, 2]), np.array([1, 1, 2, 0]), np.array([3, 2, 0, 0])]
    for _ in range(3):
        got = K.vote([to_dev(a) for a in labels], target="cuda")
        np.testing.assert_array_equal(np.asarray(got), K.vote(labels))
    K.mean([to_dev(np.ones(4)), to_dev(np.ones(4))], target="cuda")
    K.mean([to_dev(np.ones(9)), to_dev(np.zeros(9))], target="cuda")   # another size: the same signature
    assert standin_gpu.compiled == [("vote", "int64", 3), ("mean", "float64", 2)]
    assert standin_gpu.cuda.LAUNCHES == {"cached": 5, "dispatcher": 0}
    info = standin_gpu.cuda.launch_info()
    assert info["path"] == "auto" and set(info["kernels"].values()) == {"ok"}


def test_a_kernel_that_cannot_be_cached_falls_back_to_the_dispatcher(standin_gpu, monkeypatch):
    import numba

    from gpunets.kernels import _cuda

    monkeypatch.setattr(_cuda, "_compile_cached", lambda name, dtype, k, cp: "AbiMismatch: another layout")
    launched = []

    class Dispatcher:
        def __getitem__(self, config):
            return lambda *args: launched.append(config)

    monkeypatch.setitem(_cuda._KERNELS, "mean", Dispatcher())
    monkeypatch.setattr(numba.cuda, "as_cuda_array", lambda a, sync=False: a, raising=False)
    dev = [standin_gpu.to_dev(np.ones(4)) for _ in range(2)]
    K.mean(dev, target="cuda")
    assert len(launched) == 1 and _cuda.LAUNCHES == {"cached": 0, "dispatcher": 1}
    assert list(_cuda.launch_info()["kernels"].values()) == ["AbiMismatch: another layout"]
    _cuda.set_launch_path("cached")
    with pytest.raises(RuntimeError, match="has no cached launch: AbiMismatch: another layout"):
        K.mean(dev, target="cuda")
    _cuda.set_launch_path("dispatcher")
    K.mean(dev, target="cuda")
    assert _cuda.LAUNCHES == {"cached": 0, "dispatcher": 2}
    with pytest.raises(ValueError, match="is not one of"):
        _cuda.set_launch_path("fast")


def test_the_launch_path_comes_from_the_environment(monkeypatch):
    from gpunets.kernels import _cached

    monkeypatch.setitem(_cached.LAUNCH, "path", "auto")
    monkeypatch.setenv("GPUNETS_KERNEL_LAUNCH", " Dispatcher ")
    _cached._launch_from_env()
    assert _cached.LAUNCH["path"] == "dispatcher"
    monkeypatch.setenv("GPUNETS_KERNEL_LAUNCH", "fast")
    with pytest.raises(ValueError, match=r"GPUNETS_KERNEL_LAUNCH='fast' is not a launch path: set it to one of"):
        _cached._launch_from_env()
    assert _cached.LAUNCH["path"] == "dispatcher"


def test_concurrent_launches_never_share_a_half_packed_buffer(standin_gpu):
    """Threads launching one cached kernel at once: each launch reads its own arguments (the buffer is packed
    and launched under the kernel's lock)."""
    to_dev = standin_gpu.to_dev
    errors = []

    def work(j):
        try:
            for i in range(30):
                a = [to_dev(np.full(8, float(j * 100 + i))), to_dev(np.full(8, float(j * 100 + i + 2)))]
                got = np.asarray(K.mean(a, target="cuda"))
                if not (got == j * 100 + i + 1).all():
                    errors.append((j, i, got))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(j,)) for j in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert standin_gpu.cuda.LAUNCHES["cached"] == 120


# ---- on a real GPU ------------------------------------------------------------------------------------------------

#: kernels whose PTX has fused multiply-adds (NVVM's default contraction; numba's CPU kernels round twice)
FUSED = ("wmean", "weighted_sum", "var")


@pytest.mark.gpu
def test_both_launch_paths_agree_bitwise_on_a_gpu():
    """The cached handle and numba's dispatcher launch the same kernels: the same bits, equal to the CPU's."""
    cp = pytest.importorskip("cupy")
    if not cp.cuda.is_available():
        pytest.skip("no CUDA GPU")
    from gpunets.kernels import _cuda

    if _cuda.SIMULATOR:
        pytest.skip("numba's CUDA simulator is on")
    rng = np.random.default_rng(0)
    old = _cuda.LAUNCH["path"]
    try:
        for dtype in ("float32", "float64", "int32"):   # each (kernel, dtype) compiles twice: kept short
            host = [(rng.standard_normal((1000, 3)) * 50).astype(dtype) for _ in range(5)]
            dev = [cp.asarray(h) for h in host]
            labels = [cp.asarray(h.astype(np.int64)) for h in host]
            for name, call in [*CALLS, ("vote", None)]:
                results = {}
                for path in ("cached", "dispatcher"):
                    _cuda.set_launch_path(path)
                    before = dict(_cuda.LAUNCHES)
                    got = K.vote(labels, target="cuda") if call is None else call(dev, "cuda")
                    results[path] = cp.asnumpy(got)
                    assert _cuda.LAUNCHES[path] > before[path], (name, dtype, path)
                want = K.vote([h.astype(np.int64) for h in host]) if call is None else call(host, "cpu")
                np.testing.assert_array_equal(results["cached"].view(np.uint8), results["dispatcher"].view(np.uint8),
                                              err_msg=f"{name} {dtype}: the two launch paths differ")
                got = results["cached"]
                assert got.dtype == want.dtype, (name, dtype)
                if name in FUSED:   # NVVM contracts w * a + acc to one FMA (one rounding): within an ulp or two
                    np.testing.assert_allclose(got, want, rtol=4 * np.finfo(want.dtype).eps, err_msg=name)
                else:
                    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8), err_msg=f"{name} {dtype}")
        assert all(v == "ok" for v in _cuda.launch_info()["kernels"].values()), _cuda.launch_info()
    finally:
        _cuda.set_launch_path(old)
