"""Tests of gpunets.devices.data: device_of, to_device, to_host_like, check_placeable, rows, same_data.

CPU behaviour is tested on NumPy, pandas and scipy.sparse.  The GPU branches'
logic is tested against a tiny NumPy-backed stand-in for CuPy injected into
``sys.modules``; the tests marked ``gpu`` run the same moves on real CuPy/cuDF
and are skipped without a GPU.
"""

import sys
import types
from collections import namedtuple

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

import gpunets.devices.placement as gd
from gpunets.devices.data import (array_namespace, check_placeable, device_of, installed, n_rows, same_data,
                          take_rows, to_device, to_host_like)
from gpunets.devices.placement import CPU, Device
from gpunets.base.exceptions import DeviceUnavailableError


def _require_gpu():
    try:
        import cupy
    except Exception:
        pytest.skip("needs CuPy and a CUDA GPU")
    if not cupy.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return cupy


# ----------------------------------------------------------------- a NumPy-backed fake CuPy


class _FakeDev:
    def __init__(self, i):
        self.id = i


class FakeCupyArray:
    """Just enough of cupy.ndarray for gpunets.devices.data's code paths."""

    def __init__(self, a, dev):
        self._a, self._dev = np.asarray(a), dev

    device = property(lambda self: _FakeDev(self._dev))
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)

    def __len__(self):
        return len(self._a)

    def __getitem__(self, idx):
        if isinstance(idx, FakeCupyArray):
            assert idx._dev == self._dev, "index on another GPU"
            idx = idx._a
        return FakeCupyArray(self._a[idx], self._dev)

    def copy(self):
        return FakeCupyArray(self._a.copy(), _FAKE_STATE["current"][-1])

    def __array_namespace__(self):
        return sys.modules["cupy"]


_FAKE_STATE = {"current": [0], "streams": []}


def make_fake_cupy():
    cp = types.ModuleType("cupy")
    cp.ndarray = FakeCupyArray
    cuda = types.ModuleType("cupy.cuda")

    class Device:
        def __init__(self, i=None):
            self.id = _FAKE_STATE["current"][-1] if i is None else i

        def __enter__(self):
            _FAKE_STATE["current"].append(self.id)
            return self

        def __exit__(self, *exc):
            _FAKE_STATE["current"].pop()

    cuda.Device = Device
    cuda.is_available = lambda: True
    cuda.runtime = types.SimpleNamespace(getDeviceCount=lambda: 2)
    cp.cuda = cuda

    def asarray(x):
        cur = _FAKE_STATE["current"][-1]
        if isinstance(x, FakeCupyArray):
            return x if x._dev == cur else FakeCupyArray(x._a.copy(), cur)
        return FakeCupyArray(np.array(x), cur)

    def asnumpy(x, stream=None):
        _FAKE_STATE["streams"].append(stream)
        return x._a.copy()

    cp.asarray = asarray
    cp.asnumpy = asnumpy
    cp.array_equal = lambda a, b, equal_nan=False: np.array_equal(a._a, b._a, equal_nan=equal_nan)
    return cp


class FakeStream:
    def __init__(self):
        self.entered = 0

    def __enter__(self):
        self.entered += 1
        return self

    def __exit__(self, *exc):
        pass


@pytest.fixture
def fake_cupy(monkeypatch):
    cp = make_fake_cupy()
    monkeypatch.delenv("GPUNETS_FAKE_GPU", raising=False)  # this mock stands for the real CuPy module
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setitem(sys.modules, "cupy.cuda", cp.cuda)
    monkeypatch.setitem(sys.modules, "cudf", None)  # hide any real cuDF
    monkeypatch.setattr(gd, "gpu_available", lambda: True)
    monkeypatch.setattr(gd, "gpu_count", lambda: 2)
    _FAKE_STATE.update(current=[0], streams=[])
    return cp


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(gd, "gpu_available", lambda: False)
    monkeypatch.setattr(gd, "gpu_count", lambda: 0)


@pytest.fixture
def df():
    return pd.DataFrame({"a": [1, 2, 3], "b": [0.5, np.nan, 2.5], "c": [True, False, True]},
                        index=pd.Index([10, 20, 30], name="id"))


# ----------------------------------------------------------------- device_of


@pytest.mark.parametrize("value", [np.zeros(3), pd.Series([1.0]), pd.DataFrame({"a": [1]}), 3, 2.5,
                                   "s", None, np.float32(1), sp.eye(3, format="csr"), True])
def test_device_of_host_values(value):
    assert device_of(value) == CPU


def test_device_of_containers():
    assert device_of((np.ones(2), None, 3)) == CPU
    assert device_of({"X": np.ones(2), "y": pd.Series([1])}) == CPU
    assert device_of([]) == CPU


def test_device_of_fake_cupy(fake_cupy):
    x = FakeCupyArray(np.ones(2), 1)
    assert device_of(x) == Device("cuda", 1)
    assert device_of((x, None, 3)) == Device("cuda", 1)
    with pytest.raises(ValueError, match=r"different devices: \['cpu', 'cuda:1'\]"):
        device_of((x, np.ones(2)))
    with pytest.raises(ValueError, match="different devices"):
        device_of({"a": x, "b": FakeCupyArray(np.ones(2), 0)})


def test_device_of_array_api_strict():
    xp = pytest.importorskip("array_api_strict")
    assert device_of(xp.asarray([1.0, 2.0])) == CPU


# ----------------------------------------------------------------- to_device on the CPU


def test_to_device_same_device_returns_same_object(df):
    x = np.arange(3)
    assert to_device(x, "cpu") is x
    assert to_device(df, CPU) is df
    m = sp.eye(2, format="csr")
    assert to_device(m, "cpu") is m
    assert to_device(None, "cuda:3") is None and to_device(5, "cuda") == 5


def test_to_device_containers_keep_their_type(df):
    Pair = namedtuple("Pair", "X y")
    x = np.ones(2)
    p = to_device(Pair(x, df), "cpu")
    assert isinstance(p, Pair) and p.X is x and p.y is df
    lst = to_device([x, None], "cpu")
    assert isinstance(lst, list) and lst[0] is x
    d = to_device({"a": x}, "cpu")
    assert d == {"a": x}


def test_to_device_cuda_without_gpu_raises(no_gpu, df):
    for value in (np.ones(3), df):
        with pytest.raises(DeviceUnavailableError) as info:
            to_device(value, "cuda")
        msg = str(info.value)
        assert "to cuda:0" in msg and "no GPU is available here" in msg and "Place it on 'cpu'" in msg
        assert isinstance(info.value, RuntimeError)


def test_to_device_bad_arguments():
    with pytest.raises(ValueError, match="'cuda:N'"):
        to_device(np.ones(2), "gpu0")
    with pytest.raises(ValueError, match="frames="):
        to_device(np.ones(2), "cpu", frames="polars")


# ----------------------------------------------------------------- to_device through the fake CuPy


def test_numpy_fake_cupy_round_trip(fake_cupy):
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    g = to_device(x, "cuda:1")
    assert isinstance(g, FakeCupyArray) and g.device.id == 1 and g.dtype == np.float32
    assert _FAKE_STATE["current"] == [0]  # the device context was restored
    back = to_device(g, "cpu")
    assert isinstance(back, np.ndarray) and back.dtype == np.float32
    np.testing.assert_array_equal(back, x)
    assert to_device(g, "cuda:1") is g


def test_cupy_between_gpus(fake_cupy):
    g0 = to_device(np.arange(3), "cuda:0")
    g1 = to_device(g0, "cuda:1")
    assert g1.device.id == 1 and g0.device.id == 0
    np.testing.assert_array_equal(g1._a, g0._a)


def test_stream_is_used_for_copies(fake_cupy):
    s = FakeStream()
    g = to_device(np.ones(2), "cuda:0", stream=s)
    assert s.entered == 1
    to_device(g, "cpu", stream=s)
    assert _FAKE_STATE["streams"][-1] is s


def test_cuda_index_beyond_count_raises(fake_cupy):
    with pytest.raises(DeviceUnavailableError, match=r"2 GPU\(s\) \(cuda:0 to cuda:1\)"):
        to_device(np.ones(2), "cuda:2")


def test_pandas_to_gpu_without_cudf_is_an_import_error(fake_cupy, df):
    with pytest.raises(ImportError, match="cuDF is not installed.*frames='array'"):
        to_device(df, "cuda:0")


def test_pandas_to_gpu_as_array(fake_cupy, df):
    g = to_device(df[["a", "b"]], "cuda:0", frames="array")
    assert isinstance(g, FakeCupyArray) and g.shape == (3, 2)
    s = to_device(df["c"], "cuda:0", frames="array")
    assert s.shape == (3,)
    with pytest.raises(TypeError, match=r"non-numeric column\(s\) \['s'\]"):
        to_device(df.assign(s=["x", "y", "z"]), "cuda:0", frames="array")


def test_sparse_to_gpu_is_a_type_error(fake_cupy):
    with pytest.raises(TypeError, match=r"densify it with \.toarray\(\) or place it on 'cpu'"):
        to_device(sp.eye(2, format="csr"), "cuda:0")


def test_containers_move_element_wise(fake_cupy):
    out = to_device((np.ones(2), None, {"y": np.zeros(2)}), "cuda:1")
    assert out[0].device.id == 1 and out[1] is None and out[2]["y"].device.id == 1


def test_to_host_like(fake_cupy, df):
    g = to_device(np.arange(3.0), "cuda:0")
    back = to_host_like(g, np.zeros(3))
    assert isinstance(back, np.ndarray)
    np.testing.assert_array_equal(back, [0.0, 1.0, 2.0])
    # frame values asked for as an array; arrays never become frames
    assert isinstance(to_host_like(df[["a"]], np.zeros(3)), np.ndarray)
    arr = np.ones(3)
    assert to_host_like(arr, df) is arr
    # array to where a GPU array lives
    assert to_host_like(np.ones(2), g).device.id == 0


def test_to_host_like_array_api_strict_to_numpy():
    xp = pytest.importorskip("array_api_strict")
    out = to_host_like(xp.asarray([1.0, 2.0]), np.zeros(2))
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, [1.0, 2.0])


# ----------------------------------------------------------------- check_placeable


@pytest.mark.parametrize("value", [np.ones(2), pd.DataFrame({"a": [1]}), pd.Series([1]), 1.0, None,
                                   (np.ones(2), None)])
@pytest.mark.parametrize("dev", ["cpu", "cuda:0"])
def test_check_placeable_accepts(value, dev):
    check_placeable(value, what="source X", device=dev)


@pytest.mark.parametrize("value, hint", [
    ([[1, 2], [3, 4]], "numpy.asarray"), ({"a": [1]}, "pandas.DataFrame"),
    ((i for i in range(3)), "Materialise"), (object(), "Convert it"), ((np.ones(2), [1]), "numpy.asarray"),
])
def test_check_placeable_rejects(value, hint):
    with pytest.raises(TypeError) as info:
        check_placeable(value, what="source X", device="cpu")
    msg = str(info.value)
    assert msg.startswith("source X: cannot place a ")
    assert "NumPy arrays, pandas DataFrame/Series, CuPy arrays, cuDF DataFrame/Series" in msg
    assert hint in msg


def test_check_placeable_sparse():
    m = sp.random(4, 3, density=0.5, format="csr")
    check_placeable(m, what="source X", device="cpu")
    with pytest.raises(TypeError, match=r"source X: a scipy.sparse csr_matrix cannot be placed on cuda:0; densify"):
        check_placeable(m, what="source X", device="cuda")


# ----------------------------------------------------------------- rows


def test_n_rows():
    assert n_rows(np.zeros((4, 2))) == 4
    assert n_rows(pd.DataFrame({"a": range(5)})) == 5
    assert n_rows(pd.Series(range(2))) == 2
    assert n_rows(sp.eye(7)) == 7
    with pytest.raises(TypeError, match="0-dimensional"):
        n_rows(np.float64(1.0) * np.ones(()))
    with pytest.raises(TypeError, match="Cannot count the rows of a list"):
        n_rows([1, 2])


@pytest.mark.parametrize("rows", [[0, 2], np.array([0, 2]), np.array([True, False, True, False]),
                                  [True, False, True, False], range(0, 4, 2), slice(0, 4, 2), [-4, -2]])
def test_take_rows_numpy_pandas_sparse(rows):
    x = np.arange(8).reshape(4, 2)
    frame = pd.DataFrame(x, columns=["p", "q"], index=list("abcd"))
    np.testing.assert_array_equal(take_rows(x, rows), x[[0, 2]])
    got = take_rows(frame, rows)
    pd.testing.assert_frame_equal(got, frame.iloc[[0, 2]])
    assert list(got.index) == ["a", "c"] and list(got.columns) == ["p", "q"]
    pd.testing.assert_series_equal(take_rows(frame["q"], rows), frame["q"].iloc[[0, 2]])
    for fmt in ("csr", "coo", "csc"):
        m = sp.coo_matrix(x).asformat(fmt)
        np.testing.assert_array_equal(take_rows(m, rows).toarray(), x[[0, 2]])


def test_take_rows_out_of_range_names_rows_and_index():
    x = np.arange(5)
    with pytest.raises(IndexError, match=r"Row index 7 is out of range for data with 5 rows"):
        take_rows(x, [1, 7, 9])
    with pytest.raises(IndexError, match=r"Row index -6 is out of range for data with 5 rows"):
        take_rows(pd.Series(x), [-6])
    with pytest.raises(IndexError, match=r"mask has length 3, but the data have 5 rows"):
        take_rows(x, [True, False, True])


def test_take_rows_bad_rows():
    with pytest.raises(TypeError, match=r"for one row write \[2\]"):
        take_rows(np.arange(5), 2)
    with pytest.raises(TypeError, match="integers or a boolean mask"):
        take_rows(np.arange(5), [0.5])
    with pytest.raises(TypeError, match="one-dimensional"):
        take_rows(np.arange(5), [[0]])


def test_take_rows_none_tuple_and_empty():
    assert take_rows(None, [0]) is None
    X, y = take_rows((np.arange(6).reshape(3, 2), pd.Series([1, 2, 3])), [2])
    assert X.tolist() == [[4, 5]] and y.tolist() == [3]
    assert take_rows(np.arange(3), []).shape == (0,)


def test_take_rows_fake_cupy(fake_cupy):
    g = to_device(np.arange(5) * 10, "cuda:1")
    out = take_rows(g, [4, 0])
    assert out.device.id == 1 and out._a.tolist() == [40, 0]
    with pytest.raises(IndexError, match="5 rows"):
        take_rows(g, [5])


def test_take_rows_array_api_strict():
    xp = pytest.importorskip("array_api_strict")
    a = xp.asarray([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    assert np.from_dlpack(take_rows(a, [2, 0])).tolist() == [[5.0, 6.0], [1.0, 2.0]]
    assert np.from_dlpack(take_rows(a, slice(1, None))).tolist() == [[3.0, 4.0], [5.0, 6.0]]
    assert np.from_dlpack(take_rows(a, [False, True, False])).tolist() == [[3.0, 4.0]]


# ----------------------------------------------------------------- same_data


def test_same_data():
    x = np.array([1.0, np.nan, 3.0])
    assert same_data(x, x) and same_data(x, x.copy())
    assert not same_data(x, np.array([1.0, 2.0, 3.0]))
    assert not same_data(x, x.astype(np.float32))
    assert not same_data(x, x[:2])
    assert same_data(np.array(["a", None], dtype=object), np.array(["a", None], dtype=object))
    df = pd.DataFrame({"a": [1.0, np.nan]})
    assert same_data(df, df.copy())
    assert not same_data(df, df.set_axis([5, 6]))
    assert not same_data(df, df.rename(columns={"a": "b"}))
    assert not same_data(df, df["a"])
    m = sp.eye(3, format="csr")
    assert same_data(m, m.copy()) and not same_data(m, 2 * m)
    assert same_data((x, 1), (x.copy(), 1)) and not same_data((x, 1), (x, 2))
    assert same_data({"a": x}, {"a": x.copy()}) and not same_data({"a": x}, {"b": x})
    assert same_data(float("nan"), float("nan")) and same_data(3, 3) and not same_data(3, 4)
    assert same_data(None, None)


def test_same_data_fake_cupy(fake_cupy):
    g = to_device(np.array([1.0, np.nan]), "cuda:0")
    assert same_data(g, g.copy())
    assert not same_data(g, to_device(g, "cuda:1"))


def test_same_data_array_api_strict():
    xp = pytest.importorskip("array_api_strict")
    assert same_data(xp.asarray([1.0, 2.0]), xp.asarray([1.0, 2.0]))
    assert not same_data(xp.asarray([1.0, 2.0]), xp.asarray([1.0, 3.0]))


# ----------------------------------------------------------------- array_namespace


def test_array_namespace():
    assert array_namespace(np.zeros(2)) is np
    assert array_namespace(pd.Series([1.0])) is np
    xp = pytest.importorskip("array_api_strict")
    assert array_namespace(xp.asarray([1.0])) is xp
    with pytest.raises(TypeError, match="not an array-API array"):
        array_namespace([1, 2])


def test_array_namespace_fake_cupy(fake_cupy):
    assert array_namespace(to_device(np.ones(2), "cuda")) is fake_cupy


def test_installed():
    assert installed("numpy") and not installed("surely_not_a_module_gpunets")


def test_recognising_does_not_import(monkeypatch):
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    monkeypatch.delitem(sys.modules, "cudf", raising=False)
    device_of(np.ones(2))
    take_rows(pd.Series([1, 2]), [0])
    assert "cupy" not in sys.modules and "cudf" not in sys.modules


# ----------------------------------------------------------------- real GPU


@pytest.mark.gpu
def test_gpu_numpy_cupy_round_trip():
    cp = _require_gpu()
    x = np.random.default_rng(0).normal(size=(100, 3)).astype(np.float32)
    g = to_device(x, "cuda:0")
    assert isinstance(g, cp.ndarray) and device_of(g) == Device("cuda", 0) and g.dtype == cp.float32
    assert to_device(g, "cuda:0") is g
    stream = cp.cuda.Stream(non_blocking=True)
    g2 = to_device(x, "cuda:0", stream=stream)
    stream.synchronize()
    back = to_device(g2, "cpu")
    np.testing.assert_array_equal(back, x)
    np.testing.assert_array_equal(to_device(take_rows(g, [3, 1]), "cpu"), x[[3, 1]])
    assert same_data(g, g.copy())
    assert array_namespace(g).__name__.startswith("cupy")


@pytest.mark.gpu
def test_gpu_between_devices():
    cp = _require_gpu()
    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    g1 = to_device(to_device(np.arange(4.0), "cuda:0"), "cuda:1")
    assert device_of(g1) == Device("cuda", 1)
    np.testing.assert_array_equal(to_device(g1, "cpu"), np.arange(4.0))


@pytest.mark.gpu
def test_gpu_pandas_cudf_round_trip(df):
    _require_gpu()
    pytest.importorskip("cudf")
    g = to_device(df, "cuda:0")
    assert type(g).__module__.startswith("cudf") and device_of(g) == Device("cuda", 0)
    back = to_device(g, "cpu")
    pd.testing.assert_frame_equal(back, df)
    pd.testing.assert_frame_equal(to_device(take_rows(g, [2, 0]), "cpu"), df.iloc[[2, 0]])


# ----------------------------------------------------------------- CUDA_VISIBLE_DEVICES and a fake cuDF


def test_device_of_reports_the_physical_gpu(fake_cupy, monkeypatch):
    """Device indices are physical (as dask-cuda workers list them); CuPy reports ordinals."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    g = to_device(np.arange(3.0), "cuda:1")
    assert g.device.id == 0                        # ordinal 0 of this process is physical GPU 1
    assert device_of(g) == Device("cuda", 1)
    assert to_device(g, "cuda:1") is g             # no second copy
    assert device_of(to_device(g, "cuda:0")) == Device("cuda", 0)


class FakeCudfFrame:
    """Just enough of cudf.DataFrame for the frames='array' move."""

    def __init__(self, frame, dev):
        self._f, self._dev = frame, dev
        self.to_pandas_calls = 0

    columns = property(lambda self: self._f.columns)
    dtypes = property(lambda self: self._f.dtypes)

    def __getitem__(self, key):
        raise KeyError(key)  # device_of falls back to the current device

    def to_cupy(self, dtype=None, copy=False, na_value=None):
        return FakeCupyArray(self._f.to_numpy(dtype=dtype, na_value=na_value), self._dev)

    def to_pandas(self):
        self.to_pandas_calls += 1
        return self._f


@pytest.fixture
def fake_cudf(fake_cupy, monkeypatch):
    cudf = types.ModuleType("cudf")
    cudf.DataFrame = FakeCudfFrame
    monkeypatch.setitem(sys.modules, "cudf", cudf)
    return cudf


def test_cudf_to_cupy_array_stays_on_the_gpu(fake_cudf):
    g = FakeCudfFrame(pd.DataFrame({"a": [1.0, np.nan], "b": [True, False]}), 0)
    arr = to_device(g, "cuda:0", frames="array")
    assert isinstance(arr, FakeCupyArray) and arr.device.id == 0 and arr.dtype == np.float64
    assert g.to_pandas_calls == 0                  # no round trip through the host
    np.testing.assert_array_equal(arr._a, [[1.0, 1.0], [np.nan, 0.0]])
    other = to_device(g, "cuda:1", frames="array")
    assert other.device.id == 1 and g.to_pandas_calls == 0
    with pytest.raises(TypeError, match=r"cuDF FakeCudfFrame with non-numeric column\(s\) \['s'\]"):
        to_device(FakeCudfFrame(pd.DataFrame({"s": ["x"]}), 0), "cuda:0", frames="array")
