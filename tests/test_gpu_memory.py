"""gn.set_config(gpu_memory=...): one RMM resource per GPU, shared by CuPy and numba, set once."""

import os
import sys
import types
import warnings

import pytest

import gpunets as gn
from gpunets.devices import gpu_memory


@pytest.fixture
def fake_rmm(monkeypatch):
    """Fake rmm / cupy / numba modules that record what was installed, and where (two GPUs)."""
    log = {"per_device": {}, "allocator": None, "numba": None, "made_on": []}
    current = [0]

    class Device:
        def __init__(self, n):
            self.n = n

        def __enter__(self):
            self.prev, current[0] = current[0], self.n

        def __exit__(self, *a):
            current[0] = self.prev

    class Resource:
        def __init__(self, *a, **k):
            self.args = a
            log["made_on"].append((type(self).__name__, current[0]))

    CudaMemoryResource = type("CudaMemoryResource", (Resource,), {})
    mr = types.SimpleNamespace(
        CudaAsyncMemoryResource=type("CudaAsyncMemoryResource", (Resource,), {}),
        CudaMemoryResource=CudaMemoryResource,
        PoolMemoryResource=type("PoolMemoryResource", (Resource,), {}),
        set_per_device_resource=lambda o, r: log["per_device"].__setitem__(o, r),
        # RMM's own default until someone sets one (made outside the log)
        get_per_device_resource=lambda o: log["per_device"].get(o) or object.__new__(CudaMemoryResource))
    rmm = types.ModuleType("rmm")
    rmm.mr = mr
    rmm.__spec__ = types.SimpleNamespace(name="rmm")
    alloc_cupy = types.SimpleNamespace(rmm_cupy_allocator=object())
    alloc_numba = types.SimpleNamespace(RMMNumbaManager=object())
    pool = types.SimpleNamespace(malloc=None)
    pool.malloc = types.MethodType(lambda self, n: None, pool)
    cupy = types.SimpleNamespace(get_default_memory_pool=lambda: pool, cuda=types.SimpleNamespace(
        Device=Device, runtime=types.SimpleNamespace(getDeviceCount=lambda: 2),
        get_allocator=lambda: log["allocator"] or pool.malloc,
        set_allocator=lambda a: log.__setitem__("allocator", a)))
    numba = types.ModuleType("numba")
    numba.config = types.SimpleNamespace(ENABLE_CUDASIM=False)
    numba.cuda = types.SimpleNamespace(set_memory_manager=lambda m: log.__setitem__("numba", m))
    for name, mod in {"rmm": rmm, "rmm.mr": mr, "rmm.allocators": types.SimpleNamespace(),
                      "rmm.allocators.cupy": alloc_cupy, "rmm.allocators.numba": alloc_numba,
                      "cupy": cupy, "numba": numba, "numba.cuda": numba.cuda}.items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(gpu_memory.importlib.util, "find_spec", lambda n: object() if n == "rmm" else None)
    monkeypatch.setattr("gpunets.devices.placement.gpu_available", lambda: True)
    monkeypatch.setattr("gpunets.devices.placement.gpu_count", lambda: 2)
    monkeypatch.setattr(gpu_memory, "_STATE", {"kind": "auto", "devices": {}, "libraries": False, "warned": False})
    monkeypatch.setitem(sys.modules["gpunets.base.config"]._GLOBAL, "gpu_memory", "auto")   # restored after
    return log, alloc_cupy, alloc_numba


def test_async_installs_one_resource_per_gpu_shared_by_cupy_and_numba(fake_rmm):
    log, alloc_cupy, alloc_numba = fake_rmm
    gn.set_config(gpu_memory="async")
    assert gn.get_config()["gpu_memory"] == "async"
    assert sorted(log["per_device"]) == [0, 1]
    assert all(type(r).__name__ == "CudaAsyncMemoryResource" for r in log["per_device"].values())
    assert log["made_on"] == [("CudaAsyncMemoryResource", 0), ("CudaAsyncMemoryResource", 1)]  # on its GPU
    assert log["allocator"] is alloc_cupy.rmm_cupy_allocator
    assert log["numba"] is alloc_numba.RMMNumbaManager
    gn.set_config(gpu_memory="async")   # the same again: nothing changes
    assert len(log["made_on"]) == 2
    with pytest.raises(RuntimeError, match="set once per process"):
        gn.set_config(gpu_memory="pool")
    assert gn.get_config()["gpu_memory"] == "async"


def test_pool_is_a_pool_over_cuda_malloc(fake_rmm):
    log, _, _ = fake_rmm
    gn.set_config(gpu_memory="pool")
    pool = log["per_device"][0]
    assert type(pool).__name__ == "PoolMemoryResource" and type(pool.args[0]).__name__ == "CudaMemoryResource"


def test_bad_values_missing_rmm_and_blocks_are_clear_errors(fake_rmm, monkeypatch):
    with pytest.raises(ValueError, match=r"gpu_memory='fast'.*\['auto', 'default', 'async', 'pool'\]"):
        gn.set_config(gpu_memory="fast")
    with pytest.raises(ValueError, match="process-wide"):
        gn.config(gpu_memory="async")
    monkeypatch.setattr(gpu_memory.importlib.util, "find_spec", lambda n: None)
    with pytest.raises(ImportError, match="needs RMM.*pip install rmm-cu12"):
        gn.set_config(gpu_memory="async")
    assert gn.get_config()["gpu_memory"] == "auto" and gpu_memory.gpu_memory_state()["kind"] == "auto"


def test_without_a_gpu_the_setting_waits_for_the_cuda_backend(fake_rmm, monkeypatch):
    log, _, _ = fake_rmm
    monkeypatch.setattr("gpunets.devices.placement.gpu_available", lambda: False)
    gn.set_config(gpu_memory="async")
    assert log["per_device"] == {}
    gpu_memory.ensure_gpu_memory([1])   # what the CUDA backend does for the GPUs of a run
    assert list(log["per_device"]) == [1]


def test_auto_is_the_default_and_installs_an_async_pool_where_rmm_is_importable(fake_rmm):
    """Issue 24 item 12: with RMM importable, the first GPU use installs RMM's asynchronous pool on that
    GPU, shared by CuPy and numba, without any setting."""
    log, alloc_cupy, alloc_numba = fake_rmm
    assert gn.get_config()["gpu_memory"] == "auto"
    assert log["per_device"] == {}   # nothing at import or configuration time
    gpu_memory.ensure_gpu_memory([1])   # a run (or a GPU estimator) starts on cuda:1
    assert {o: type(r).__name__ for o, r in log["per_device"].items()} == {1: "CudaAsyncMemoryResource"}
    assert log["made_on"] == [("CudaAsyncMemoryResource", 1)]
    assert log["allocator"] is alloc_cupy.rmm_cupy_allocator and log["numba"] is alloc_numba.RMMNumbaManager
    assert gpu_memory.gpu_memory_state()["devices"] == {1: "async"}
    gn.set_config(gpu_memory="async")   # naming what auto installed is fine; another resource is not
    with pytest.raises(RuntimeError, match="set once per process"):
        gn.set_config(gpu_memory="pool")


def test_auto_leaves_a_resource_or_allocator_someone_else_chose(fake_rmm):
    log, _, _ = fake_rmm
    import rmm
    import cupy

    theirs = rmm.mr.PoolMemoryResource()
    log["per_device"][0] = theirs   # e.g. rmm.reinitialize(pool_allocator=True), or dask-cuda
    mine = object()
    log["allocator"] = mine         # cupy.cuda.set_allocator(...) by the user
    gpu_memory.ensure_gpu_memory([0, 1])
    assert log["per_device"][0] is theirs
    assert type(log["per_device"][1]).__name__ == "CudaAsyncMemoryResource"
    assert cupy.cuda.get_allocator() is mine   # CuPy's allocator stays the user's
    assert gpu_memory.gpu_memory_state()["devices"] == {0: "none", 1: "async"}


def test_auto_without_rmm_warns_once_when_cuml_runs(fake_rmm, monkeypatch):
    """Without RMM nothing is installed; the first cuML call warns once (scikit-learn's array-API route,
    and gpu_memory='default' said by name, do not)."""
    log, _, _ = fake_rmm
    monkeypatch.setattr(gpu_memory.importlib.util, "find_spec", lambda n: None)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        gpu_memory.note_gpu_estimator(0, "array_api")
        assert not w
        for o in (0, 1, 0):
            gpu_memory.note_gpu_estimator(o, "cuml")
    assert [str(x.message)[:60] for x in w] == [gpu_memory.SYNC_CUML_WARNING[:60]]
    assert w[0].category is RuntimeWarning and "gpu_memory='default'" in str(w[0].message)
    assert log["per_device"] == {} and log["allocator"] is None
    monkeypatch.setattr(gpu_memory, "_STATE", {"kind": "auto", "devices": {}, "libraries": False, "warned": False})
    gn.set_config(gpu_memory="default")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        gpu_memory.note_gpu_estimator(0, "cuml")
    assert not w


def test_a_gpu_estimator_settles_its_gpu_first_on_any_executor(fake_rmm, monkeypatch):
    """The fit context of a GPU route (every executor goes through it) installs the resource."""
    from gpunets.compute import models

    log, _, _ = fake_rmm
    monkeypatch.setattr(models, "loaded_cupy", lambda: sys.modules["cupy"])
    monkeypatch.setattr(models, "local_ordinal", lambda i: i)
    with models.fit_context("cuml", "cuda:1"):
        pass
    assert list(log["per_device"]) == [1]


def test_demo_sets_the_launch_environment_before_cuda_starts(monkeypatch):
    """Issue 24 item 13: ``python -m gpunets demo`` runs with per-thread default streams for CuPy and
    cuDF (set before any GPU library is imported), keeping a value the user set."""
    import gpunets.__main__ as cli

    monkeypatch.delenv("CUDF_PER_THREAD_STREAM", raising=False)
    monkeypatch.setenv("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM", "0")   # the user's choice wins
    seen = {}
    monkeypatch.setattr(cli, "demo", lambda **kw: seen.update(
        cudf=os.environ.get("CUDF_PER_THREAD_STREAM"), cupy=os.environ.get("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM")))
    assert cli.main(["demo", "--rows", "10"]) == 0
    assert seen == {"cudf": "1", "cupy": "0"}
    env: dict[str, str] = {}
    assert cli.set_launch_env(env) == cli.LAUNCH_ENV == env


def test_auto_without_rmm_on_the_fake_gpu_imports_nothing(monkeypatch):
    """gn.set_config(gpu_memory='auto') where a (fake) GPU is present and RMM is not: nothing to install, and
    no real CuPy is imported (the lane caught an `import cupy` here)."""
    from gpunets.testing import fake_gpu

    monkeypatch.setattr(gpu_memory, "_STATE", {"kind": "auto", "devices": {}, "libraries": False, "warned": False})
    monkeypatch.setitem(sys.modules["gpunets.base.config"]._GLOBAL, "gpu_memory", "auto")
    monkeypatch.setattr(gpu_memory, "_rmm_importable", lambda: False)
    with fake_gpu(1):
        gn.set_config(gpu_memory="auto")
        gpu_memory.ensure_gpu_memory([0])
    assert gpu_memory.gpu_memory_state()["devices"] == {0: "none"}
