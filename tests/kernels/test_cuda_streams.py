"""The CUDA backend's stream discipline, checked without a GPU on a recording stand-in for CuPy.

The stand-in logs, for every array it makes (views apart), CuPy's current stream at that moment, and for every kernel launch the stream it runs on.  ``kernels.vote`` with an explicit
stream must do all its work on that stream, after one GPU-side wait on the stream the inputs
were made on.
"""

from __future__ import annotations

import threading
import types

import numpy as np
import pytest

from gpunets import kernels as K


class _Recorder:
    def __init__(self) -> None:
        rec = self
        self.log: list[tuple] = []
        self.tls = threading.local()

        class Stream:
            __module__ = "cupy.cuda.stream"   # what the backend recognises as a CuPy stream
            _count = 0

            def __init__(self, name: str) -> None:
                Stream._count += 1
                self.name, self.ptr, self.waited = name, 1000 + Stream._count, []

            def __enter__(self):
                rec.stack().append(self)
                return self

            def __exit__(self, *exc):
                rec.stack().pop()

            def wait_event(self, ev) -> None:
                rec.log.append(("wait", self.name, ev.stream.name))
                self.waited.append(ev)

            def __repr__(self) -> str:
                return f"<stream {self.name}>"

        class Event:
            def __init__(self, disable_timing: bool = False) -> None:
                self.stream = None

            def record(self, stream=None) -> None:
                self.stream = stream if stream is not None else rec.current()
                rec.log.append(("record", self.stream.name))

        class Dev(np.ndarray):
            __module__ = "cupy"

            def __array_finalize__(self, obj) -> None:
                # a view of a device array (reshape, indexing a row) does no GPU work; anything else does
                view = isinstance(obj, Dev) and np.may_share_memory(self.view(np.ndarray), obj.view(np.ndarray))
                kind = "view" if view else "array"
                rec.log.append((kind, rec.current().name))

            @property
            def __cuda_array_interface__(self) -> dict:
                return {"shape": self.shape, "typestr": self.dtype.str, "data": (0, False), "version": 3}

        self.Stream, self.Event, self.Dev = Stream, Event, Dev
        self.default = Stream("current")

        def wrap(f):
            return lambda *a, **kw: _dev(f(*a, **kw))

        def _dev(x):
            if isinstance(x, tuple):
                return tuple(_dev(v) for v in x)
            return np.asarray(x).view(Dev) if isinstance(x, np.ndarray) else x

        self.cupy = types.SimpleNamespace(
            cuda=types.SimpleNamespace(Stream=Stream, Event=Event, get_current_stream=self.current),
            asarray=wrap(np.asarray), ascontiguousarray=wrap(np.ascontiguousarray), empty=wrap(np.empty),
            concatenate=wrap(np.concatenate), reshape=wrap(np.reshape), unique=wrap(np.unique), int64=np.int64)

    def stack(self) -> list:
        if not hasattr(self.tls, "stack"):
            self.tls.stack = []
        return self.tls.stack

    def current(self):
        return self.stack()[-1] if self.stack() else self.default


@pytest.fixture
def fake_gpu(monkeypatch):
    """The CUDA backend as on a GPU, with the recording stand-in for CuPy and kernels run by the CPU kernels."""
    from gpunets.kernels import _cpu, _cuda

    rec = _Recorder()

    def run(self, name, n, arrays, *args):
        rec.log.append(("kernel", self.cupy_stream.name))   # the stream the kernel is launched on
        if n:
            host = tuple(np.asarray(a) for a in arrays)
            _cpu._launch(name, n, host, *[np.asarray(x) if isinstance(x, np.ndarray) else x for x in args])

    monkeypatch.setattr(_cuda, "SIMULATOR", False)
    monkeypatch.setattr(_cuda, "check_available", lambda: None)
    monkeypatch.setattr(_cuda, "_cupy", lambda: rec.cupy)
    monkeypatch.setattr(_cuda, "numba_stream", lambda s: ("numba", s))
    monkeypatch.setattr(_cuda._Launch, "run", run)
    return rec


@pytest.mark.parametrize("labels", [
    [np.array([0.5, 1.5, 2.5]), np.array([1.5, 1.5, 0.5]), np.array([0.5, 2.5, 2.5])],   # encoded
    [np.array([True, False, True]), np.array([True, True, False]), np.array([False, True, False])],  # encoded
    [np.array([3, 1, 2]), np.array([1, 1, 2]), np.array([3, 2, 0])],   # voted directly
])
def test_vote_on_an_explicit_stream_does_all_its_work_there(fake_gpu, labels):
    rec = fake_gpu
    dev = [rec.cupy.asarray(a) for a in labels]   # made on the current stream
    side = rec.Stream("side")
    rec.log.clear()
    out = K.vote(dev, target="cuda", stream=side)
    np.testing.assert_array_equal(np.asarray(out), K.vote(labels))
    assert rec.log[:2] == [("record", "current"), ("wait", "side", "current")], rec.log
    work = rec.log[2:]
    assert ("kernel", "side") in work
    off_stream = [e for e in work if e[0] in ("array", "kernel") and e[-1] != "side"]
    assert not off_stream, f"vote worked on another stream than the one given: {off_stream}"
    assert rec.current() is rec.default   # the stream context was left


def test_vote_on_the_current_stream_needs_no_wait(fake_gpu):
    rec = fake_gpu
    dev = [rec.cupy.asarray(np.array([0.5, 1.5])), rec.cupy.asarray(np.array([1.5, 1.5]))]
    rec.log.clear()
    out = K.vote(dev, target="cuda")
    np.testing.assert_array_equal(np.asarray(out), [0.5, 1.5])
    assert not [e for e in rec.log if e[0] in ("record", "wait")]
    assert {e[-1] for e in rec.log} == {"current"}


# ---- launch configuration and hstack's store pattern -----------------------------------------------------------

def test_launch_config_fills_every_sm_and_reads_the_sm_count_once_per_device(fake_gpu, monkeypatch):
    from gpunets.kernels import _cuda

    sms = {0: 132, 1: 20}
    asked: list[int] = []
    current = [0]

    def attribute(attr, dev):
        assert attr == "MultiProcessorCount"
        asked.append(dev)
        return sms[dev]

    fake_gpu.cupy.cuda.runtime = types.SimpleNamespace(getDevice=lambda: current[0], deviceGetAttribute=attribute,
                                                       cudaDevAttrMultiProcessorCount="MultiProcessorCount")
    monkeypatch.setattr(_cuda, "_SMS", {})
    assert _cuda.launch_config(10**9) == (132 * 32, 256)   # 32 blocks of 256 per SM: occupancy is not capped
    assert _cuda.launch_config(1000) == (4, 256) and _cuda.launch_config(0) == (1, 256)
    current[0] = 1
    assert _cuda.launch_config(10**9) == (20 * 32, 256)    # the second GPU's own SM count
    current[0] = 0
    assert _cuda.launch_config(10**8) == (132 * 32, 256)
    assert asked == [0, 1]


class _Stores:
    """An output that records the flat address of every store, per simulated thread."""

    def __init__(self, shape, log):
        self.shape, self.log = shape, log

    def __setitem__(self, idx, value):
        i, c = idx
        self.log.append(i * self.shape[1] + c)


@pytest.mark.parametrize("widths", [(1, 1, 1), (1, 3, 2), (4,)])
def test_hstack_kernel_stores_are_coalesced(monkeypatch, widths):
    # Run the CUDA kernel's Python function for each thread of one warp: thread t's first store must go
    # to flat address t of the output (consecutive threads, consecutive addresses)
    from gpunets.kernels import _cuda

    kernel = getattr(_cuda._k_hstack, "py_func", None) or _cuda._k_hstack.fn
    rows = 50
    arrays = tuple(np.ones((rows, w)) for w in widths)
    offsets = tuple(int(x) for x in np.concatenate([[0], np.cumsum(widths)[:-1]]))
    warp, grid = 32, 32 * 4
    first = []
    for t in range(warp):
        fake_cuda = types.SimpleNamespace(grid=lambda dim, t=t: t, gridsize=lambda dim: grid)
        monkeypatch.setattr(_cuda, "cuda", fake_cuda)
        log: list[int] = []
        kernel(arrays, offsets, _Stores((rows, sum(widths)), log))
        first.append(log[0])
        assert log == sorted(log) and all(b - a == grid for a, b in zip(log, log[1:]))   # grid-stride
    assert first == list(range(warp))
