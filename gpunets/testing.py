"""Checking that results do not depend on the executor or the device.

* :func:`assert_same_results` fits and evaluates one network under every
  requested (device, executor) pair and compares each with the first pair's.
* As a pytest plugin (``pytest_plugins = ["gpunets.testing"]`` in a
  ``conftest.py``) it provides the fixtures ``gn_executor`` and ``gn_device``,
  parametrized over every executor and device present here (MLJ's
  ``@testset_accelerated``), and the ``gpu`` marker, skipped where no GPU is.
* :func:`fake_gpu` (and ``GPUNETS_FAKE_GPU=1`` or ``2`` in the environment)
  makes gpunets see one or two CUDA devices on a machine without one: a
  strict CuPy stand-in (:mod:`gpunets.devices.fakegpu`) that refuses implicit moves to
  the host and checks stream order, so a network's GPU placement can be tested
  on a laptop (docs/testing.md, "The fake-GPU lane").
* :func:`no_gpu` makes gpunets see no GPU on a machine with one, to test the
  CPU fallback on a GPU workstation.

>>> import numpy as np, gpunets as gn
>>> from sklearn.linear_model import Ridge
>>> X, y = gn.source(np.eye(4), name="X"), gn.source(np.arange(4.0), name="y")
>>> yhat = gn.machine(Ridge(), X, y).predict(X)
>>> results = assert_same_results(yhat, devices=["cpu"], executors=["serial", "threads", "streams"])
>>> sorted(results)
[('cpu', 'serial'), ('cpu', 'streams'), ('cpu', 'threads')]
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Sequence
from typing import Any

from gpunets.base.config import config
from gpunets.devices import placement as _devices
from gpunets.devices._gpulibs import fake_gpu_count
from gpunets.devices.data import is_cupy_array
from gpunets.devices.placement import Device, _gpu_probe, device_exists, override_placement
from gpunets.executors import SerialExecutor, StreamsExecutor, ThreadsExecutor

__all__ = ["assert_same_results", "executors_present", "devices_present", "assert_allclose_any", "fake_gpu",
           "no_gpu"]


def executors_present() -> list[str]:
    """Executor names usable here: serial, threads, streams, and dask when distributed is installed."""
    names = ["serial", "threads", "streams"]
    if importlib.util.find_spec("distributed") is not None:
        names.append("dask")
    return names


def devices_present() -> list[str]:
    """``["cpu"]``, plus ``"cuda"`` where a GPU is available."""
    return ["cpu", "cuda"] if _devices.gpu_available() else ["cpu"]


class fake_gpu:  # noqa: N801 - a context manager used like a function
    """Context manager: inside, gpunets sees ``n`` fake CUDA devices (``GPUNETS_FAKE_GPU=n``).

    Yields the fake ``cupy`` module (:mod:`gpunets.devices.fakegpu`) with its logs
    reset; on exit the environment and GPU detection are restored.  The
    variables CuPy reads when CUDA starts cannot be changed here: set
    ``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1`` in the environment (or
    ``per_thread_default_stream=True``) for per-thread default streams.

    >>> import numpy as np
    >>> from gpunets.devices.data import device_of, to_device
    >>> from gpunets.devices.placement import resolve
    >>> with fake_gpu(1) as cp:
    ...     x = to_device(np.ones(3), "cuda")
    ...     (str(device_of(x)), str(resolve("auto")), cp.implicit_conversions())
    ('cuda:0', 'cuda:0', [])
    """

    def __init__(self, n: int = 1, *, per_thread_default_stream: bool = True) -> None:
        if n not in (1, 2):
            msg = f"fake_gpu(n={n!r}): the fake GPU has 1 or 2 devices."
            raise ValueError(msg)
        self.n = n
        self.ptds = per_thread_default_stream
        self._saved: dict[str, Any] = {}
        self._hidden = 0

    def __enter__(self) -> Any:
        import os

        from gpunets.devices import fakegpu  # lazy: the fake GPU loads only when a test asks for it

        for var, value in (("GPUNETS_FAKE_GPU", str(self.n)),
                           ("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM", "1" if self.ptds else "0")):
            self._saved[var] = os.environ.get(var)
            os.environ[var] = value
        self._hidden, _devices._HIDDEN[0] = _devices._HIDDEN[0], 0   # inside a no_gpu() block: the inner one wins
        _gpu_probe.cache_clear()
        cp = fakegpu.module(self.n)
        cp.reset_log()
        return cp

    def __exit__(self, *exc: object) -> None:
        import os

        for var, value in self._saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
        _devices._HIDDEN[0] = self._hidden
        _gpu_probe.cache_clear()


class no_gpu:  # noqa: N801 - a context manager used like a function
    """Context manager: inside, gpunets sees no GPU, even on a machine with one (and with the fake GPU off).

    For testing the CPU fallback on a GPU workstation: ``device="auto"`` resolves to the CPU, a machine
    placed on ``"cuda"`` follows the ``fallback`` policy, and a state fitted on a GPU loads as where none is.
    Only gpunets' GPU detection is hidden (process-wide, for every thread); CUDA, and CuPy arrays made before,
    are untouched. ``CUDA_VISIBLE_DEVICES=""`` hides the GPUs from a new process instead.

    >>> import numpy as np, gpunets as gn
    >>> from gpunets.devices.placement import gpu_available, resolve
    >>> with no_gpu():
    ...     (gpu_available(), str(resolve("auto")))
    (False, 'cpu')
    """

    def __init__(self) -> None:
        self._fake: str | None = None

    def __enter__(self) -> None:
        import os

        self._fake = os.environ.pop("GPUNETS_FAKE_GPU", None)
        _devices._HIDDEN[0] += 1
        _gpu_probe.cache_clear()

    def __exit__(self, *exc: object) -> None:
        import os

        _devices._HIDDEN[0] -= 1
        if self._fake is not None:
            os.environ["GPUNETS_FAKE_GPU"] = self._fake
        _gpu_probe.cache_clear()


def _to_numpy(x: Any) -> Any:
    import numpy as np

    mod = type(x).__module__.split(".")[0]
    if mod == "cudf":
        x = x.to_pandas()
    if is_cupy_array(x):   # CuPy, or the fake GPU's arrays
        return x.get()
    if hasattr(x, "to_numpy"):
        return x.to_numpy()
    return np.asarray(x)


def assert_allclose_any(actual: Any, expected: Any, *, rtol: float = 1e-7, atol: float = 0.0,
                        err_msg: str = "") -> None:
    """``numpy.testing.assert_allclose`` for NumPy, pandas, CuPy and cuDF values alike."""
    import numpy as np

    a, e = _to_numpy(actual), _to_numpy(expected)
    if a.dtype.kind in "fc" or e.dtype.kind in "fc":
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=err_msg)
    else:
        np.testing.assert_array_equal(a, e, err_msg=err_msg)


def assert_same_results(node: Any, *, devices: Sequence[str] | None = None,
                        executors: Iterable[Any] | None = None, rtol: float = 1e-7, atol: float = 0.0,
                        data: Sequence[Any] = (), rows: Any = None, skip_missing: bool = True) -> dict[tuple[str, str], Any]:
    """Fit and evaluate ``node`` under every (device, executor) pair; assert the results agree.

    Parameters
    ----------
    node : Node
        The network's output node.
    devices : list of str, optional
        Default: every device present. A CUDA device where none exists is
        skipped when ``skip_missing`` (else the fit raises).
    executors : list, optional
        Executor names or objects; default: every executor present.
    rtol, atol : float
        Tolerances against the first pair's result (the reference: put
        ``"cpu"`` and ``"serial"`` first).
    data : sequence, optional
        New data to evaluate on (``node(*data)``); default the training data.

    Returns
    -------
    dict
        ``{(device, executor_name): value}``.
    """
    devices = list(devices) if devices is not None else devices_present()
    executors = list(executors) if executors is not None else executors_present()
    results: dict[tuple[str, str], Any] = {}
    ref_key = None
    for dev in devices:
        if skip_missing and Device.parse(dev).is_cuda and not device_exists(dev):
            continue
        for ex in executors:
            name = ex if isinstance(ex, str) else getattr(ex, "name", type(ex).__name__)
            node.fit(force=True, executor=ex, device=dev)
            with _placement(dev):
                value = node(*data, rows=rows, executor=ex)
            key = (str(dev), str(name))
            if ref_key is None:
                ref_key = key
            else:
                assert_allclose_any(value, results[ref_key], rtol=rtol, atol=atol,
                                    err_msg=f"{key} differs from {ref_key}")
            results[key] = value
    if ref_key is None:
        msg = f"assert_same_results ran nothing: none of the devices {devices} is present here."
        raise AssertionError(msg)
    return results


def _placement(dev: str) -> Any:
    return override_placement(dev)


# --- pytest plugin ------------------------------------------------------------------------

def _make_executor(name: str, request: Any) -> Any:
    if name == "serial":
        return SerialExecutor()
    if name == "threads":
        return ThreadsExecutor(workers=2)
    if name == "streams":
        # Emulated streams with random delays and the ordering checker: a missing
        # dependency in a plan shows up as a StreamOrderError.
        return StreamsExecutor(workers=2, delays=(0.0, 0.002), seed=0, check=True)
    if name == "dask":
        from gpunets.executors.dask import DaskExecutor  # lazy: imports dask

        client = request.getfixturevalue("gn_dask_client")
        return DaskExecutor(client)
    msg = f"unknown executor {name!r}"
    raise ValueError(msg)


try:  # the plugin part needs pytest; the helpers above do not
    import pytest
except ImportError:  # pragma: no cover
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    def pytest_configure(config: Any) -> None:
        config.addinivalue_line("markers", "gpu: needs a real NVIDIA GPU with CuPy (skipped where none is present)")

    def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
        gpu = "cuda" in devices_present() and not fake_gpu_count()   # the fake GPU is no real GPU
        skip = pytest.mark.skip(reason="needs a real NVIDIA GPU with CuPy (none present, or the CUDA simulator is on)")
        for item in items:
            if "gpu" in item.keywords and (not gpu or _cudasim()):
                item.add_marker(skip)

    @pytest.fixture(scope="session")
    def gn_dask_client() -> Any:
        distributed = pytest.importorskip("distributed")
        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                           dashboard_address="127.0.0.1:0")
        client = distributed.Client(cluster)
        yield client
        client.close()
        cluster.close()

    @pytest.fixture(params=executors_present())
    def gn_executor(request: Any) -> Any:
        """Every executor present here; also the default executor inside the test."""
        ex = _make_executor(request.param, request)
        with config(executor=ex, workers=2):
            yield ex

    @pytest.fixture(params=devices_present())
    def gn_device(request: Any) -> Any:
        """Every device present here; also the default placement inside the test."""
        with config(device=request.param):
            yield request.param


def _cudasim() -> bool:
    import os

    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"
