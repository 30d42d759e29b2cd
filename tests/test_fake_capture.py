"""The fake GPU captures CUDA graphs as CuPy 14 does (gpunets.devices._fakegraph): replay, refusals, pools.

These tests switch the fake on themselves (``gn.testing.fake_gpu``), so they run in every lane.
"""

import gc

import numpy as np
import pytest

from gpunets import StreamOrderError
from gpunets.devices._fakecuda import _CAPTURES
from gpunets.devices._fakegraph import PoisonedBufferError
from gpunets.testing import fake_gpu


@pytest.fixture
def cp():
    with fake_gpu(1) as mod:
        yield mod


@pytest.fixture
def stream(cp):
    s = cp.cuda.Stream(non_blocking=True)
    yield s
    if s.key in _CAPTURES:
        try:   # a test that failed midway: leave no capture behind for the next one
            s.end_capture()
        except Exception:   # noqa: BLE001, S110 - an invalidated capture raises here, as it should
            pass


def test_capture_records_without_running_and_launch_replays_on_current_contents(cp, stream):
    # a private pool: the capture's temporaries (tanh(x), ... * 2) stay the graph's (see the poisoning test)
    with stream, cp.cuda.using_allocator(cp.cuda.MemoryPool().malloc):
        x = cp.asarray(np.arange(4.0))
        acc = cp.zeros(4)
        stream.begin_capture()
        assert stream.is_capturing()
        y = cp.tanh(x) * 2 + 1
        acc += y                            # in place: not applied by the capture
        g = stream.end_capture()
        assert not stream.is_capturing()
        assert isinstance(g, cp.cuda.graph.Graph)
        assert not np.allclose(y.get(), np.tanh(np.arange(4.0)) * 2 + 1)   # not run yet: garbage
        assert acc.get().tolist() == [0.0] * 4                              # the old contents
        g.launch()
        expect = np.tanh(np.arange(4.0)) * 2 + 1
        assert np.array_equal(y.get(), expect) and np.array_equal(acc.get(), expect)
        x[...] = cp.ones(4)                 # new inputs in the same buffer
        g.upload()
        g.launch(stream=stream)
        assert np.array_equal(y.get(), np.tanh(np.ones(4)) * 2 + 1)
        assert np.array_equal(acc.get(), expect + np.tanh(np.ones(4)) * 2 + 1)


def test_capture_is_refused_on_the_legacy_stream_and_twice(cp, stream):
    with pytest.raises(RuntimeError, match="cannot capture on the default"):
        cp.cuda.Stream.null.begin_capture()
    stream.begin_capture()
    with pytest.raises(cp.cuda.CUDARuntimeError, match="already capturing"):
        stream.begin_capture()
    stream.end_capture()
    with pytest.raises(cp.cuda.CUDARuntimeError, match="not capturing"):
        stream.end_capture()


@pytest.mark.parametrize("call", ["matmul", "dot", "linalg", "random"])
def test_library_calls_raise_not_implemented_and_keep_the_capture(cp, stream, call):
    with stream:
        a = cp.ones((3, 3))
        stream.begin_capture()
        b = a + 1
        with pytest.raises(NotImplementedError, match="during stream capture is currently unsupported"):
            {"matmul": lambda: a @ a, "dot": lambda: a.dot(a), "linalg": lambda: cp.linalg.svd(a),
             "random": lambda: cp.random.random(3)}[call]()
        assert stream.is_capturing()        # CuPy raises before any CUDA call: the capture is still valid
        g = stream.end_capture()
        g.launch()
        assert b.get().tolist() == [[2.0] * 3] * 3


@pytest.mark.parametrize("read", ["get", "float", "item", "asnumpy", "bool", "mask", "host_copy", "sync",
                                  "device_sync", "event_sync", "legacy"])
def test_host_reads_syncs_and_legacy_work_invalidate_the_capture(cp, stream, read):
    with stream:
        a = cp.ones(3)
        s = a.sum()
        stream.begin_capture()
        b = a * 2
        ev = stream.record()
        actions = {"get": lambda: b.get(), "float": lambda: float(s), "item": lambda: s.item(),
                   "asnumpy": lambda: cp.asnumpy(b), "bool": lambda: bool(s > 0), "mask": lambda: a[a > 0],
                   "host_copy": lambda: cp.asarray(np.ones(3)), "sync": stream.synchronize,
                   "device_sync": lambda: cp.cuda.Device(0).synchronize(), "event_sync": ev.synchronize}
        if read == "legacy":
            with cp.cuda.Stream.null, pytest.raises(cp.cuda.CUDARuntimeError, match="StreamCaptureImplicit"):
                a + 1
        else:
            with pytest.raises(cp.cuda.CUDARuntimeError, match="operation not permitted when stream is capturing"):
                actions[read]()
        with pytest.raises(RuntimeError, match="invalidated the capture"):
            stream.is_capturing()
        with pytest.raises(cp.cuda.CUDARuntimeError, match="cudaErrorStreamCaptureInvalidated"):
            stream.end_capture()
        assert not stream.is_capturing()
        assert (a * 3).get().tolist() == [3.0] * 3   # the stream works again after the failed capture


def test_side_streams_fork_and_join_the_capture(cp, stream):
    side = cp.cuda.Stream(non_blocking=True)
    with stream:
        x = cp.ones(4)
        stream.begin_capture()
        fork = stream.record()
    side.wait_event(fork)                  # joins the capture
    assert side.is_capturing()
    with side:
        y = x * 5
        join = side.record()
    with stream:
        z = x + 1
        stream.wait_event(join)
        w = y + z
        g = stream.end_capture()
    assert not side.is_capturing()
    with stream:
        g.launch()
        assert w.get().tolist() == [7.0] * 4
    # a fork never joined back: the capture is refused
    with stream:
        stream.begin_capture()
        fork = stream.record()
    side.wait_event(fork)
    with side:
        x * 2
    with pytest.raises(cp.cuda.CUDARuntimeError, match="cudaErrorStreamCaptureUnjoined"):
        stream.end_capture()


def test_waiting_on_an_event_outside_the_capture_is_refused(cp, stream):
    other = cp.cuda.Stream(non_blocking=True)
    with other:
        ev = other.record()
    stream.begin_capture()
    with pytest.raises(cp.cuda.CUDARuntimeError, match="StreamCaptureIsolation"):
        stream.wait_event(ev)
    with pytest.raises(cp.cuda.CUDARuntimeError, match="Invalidated"):
        stream.end_capture()


def test_a_replay_orders_its_outputs_on_the_launch_stream(cp, stream):
    with stream:
        x = cp.ones(3)
        stream.begin_capture()
        y = x + 1
        g = stream.end_capture()
    other, third = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    other.wait_event(stream.record())
    g.launch(stream=other)
    with third, pytest.raises(StreamOrderError):
        y * 2                               # read on a third stream without waiting for the launch
    third.wait_event(other.record())
    with third:
        assert (y * 2).get().tolist() == [4.0] * 3


def test_default_pool_hands_a_live_graphs_buffer_out_again_and_poisons_it(cp, stream):
    with stream:
        a = cp.ones(1000)
        stream.begin_capture()
        b = a * 3
        g = stream.end_capture()
        del b
        gc.collect()
        c = cp.zeros(1000)                  # the pool hands b's memory out again
        with pytest.raises(PoisonedBufferError, match="still reads or writes.*private pool"):
            c.get()
        with pytest.raises(PoisonedBufferError):
            c + 1
        d = cp.zeros(999)                   # another size: other memory
        assert d.sum().get() == 0
        del g, c
        gc.collect()
        e = cp.zeros(1000)                  # the graph is gone: its memory is free for good
        assert e.get().sum() == 0


def test_a_private_pool_keeps_the_graphs_buffers_from_other_arrays(cp, stream):
    pool = cp.cuda.MemoryPool()
    with stream:
        with cp.cuda.using_allocator(pool.malloc):
            a = cp.ones(1000)
            stream.begin_capture()
            b = a * 3
            g = stream.end_capture()
        assert pool.used_bytes() == 2 * 8000 and pool.total_bytes() == 2 * 8000
        del b
        gc.collect()
        assert pool.used_bytes() == 8000 and pool.total_bytes() == 16000
        c = cp.zeros(1000)                  # the default pool: other memory, not poisoned
        assert c.get().sum() == 0
        g.launch()
        assert c.get().sum() == 0
        pool.free_all_blocks()
        assert pool.total_bytes() == 8000


def test_an_operation_handing_back_its_input_leaves_the_input_intact(cp, stream):
    with stream, cp.cuda.using_allocator(cp.cuda.MemoryPool().malloc):
        x = cp.asarray(np.arange(4.0))
        stream.begin_capture()
        same = cp.ascontiguousarray(x)      # CuPy returns x itself: nothing is written
        y = same + 1
        g = stream.end_capture()
        assert x.get().tolist() == [0.0, 1.0, 2.0, 3.0]
        g.launch()
        assert y.get().tolist() == [1.0, 2.0, 3.0, 4.0]
