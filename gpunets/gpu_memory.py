"""The GPU memory resource: one allocator shared by CuPy, numba, cuML and cuDF (``gpu_memory`` setting).

Without a memory resource cuML and cuDF allocate with RMM's default,
``cudaMalloc``/``cudaFree``, and a ``cudaFree`` synchronizes the device: it
serializes the lanes of the streams executor.  ``gn.set_config(gpu_memory=...)``
installs an RMM resource on every GPU, once per device and process, and makes
CuPy (``rmm.allocators.cupy.rmm_cupy_allocator``) and numba
(``rmm.allocators.numba.RMMNumbaManager``) allocate from it too:

``"default"``  nothing is changed: CuPy uses its own memory pool, cuML/cuDF RMM's default resource.
``"async"``    ``rmm.mr.CudaAsyncMemoryResource()``: ``cudaMallocAsync``, stream-ordered, no device-wide
               synchronization on free.  The recommended setting for concurrent GPU lanes.
``"pool"``     ``rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource())``: a pool that grows from
               ``cudaMalloc`` (half the GPU at first, RMM's default).

Set it at the start of the program, before anything allocates on the GPU
(memory allocated before keeps its old allocator).  Without a GPU the setting
is kept and applied to each GPU when the CUDA backend first uses it.

>>> GPU_MEMORY_CHOICES
('default', 'async', 'pool')
>>> check_gpu_memory("pool")
'pool'
"""

from __future__ import annotations

import importlib.util
import threading
from typing import Any

from . import devices

__all__ = ["GPU_MEMORY_CHOICES", "check_gpu_memory", "apply_gpu_memory", "ensure_gpu_memory", "gpu_memory_state"]

GPU_MEMORY_CHOICES = ("default", "async", "pool")

_LOCK = threading.Lock()
_STATE: dict[str, Any] = {"kind": "default", "devices": {}, "libraries": False}


def check_gpu_memory(value: Any) -> str:
    """Return ``value`` if it is a valid ``gpu_memory`` setting; else raise a ``ValueError`` listing them."""
    if value not in GPU_MEMORY_CHOICES:
        msg = (f"gpu_memory={value!r} is not a GPU memory setting; use one of {list(GPU_MEMORY_CHOICES)} "
               "('async' is RMM's cudaMallocAsync resource, recommended for concurrent GPU lanes).")
        raise ValueError(msg)
    return value


def gpu_memory_state() -> dict[str, Any]:
    """The setting and what was installed: ``{"kind", "devices": {ordinal: kind}, "libraries"}`` (a copy)."""
    with _LOCK:
        return {"kind": _STATE["kind"], "devices": dict(_STATE["devices"]), "libraries": _STATE["libraries"]}


def apply_gpu_memory(kind: str) -> None:
    """Set ``gpu_memory`` for the process (``gn.set_config`` calls this); install it on every GPU present.

    Raises ``ValueError`` for an unknown setting, ``ImportError`` when RMM is missing, and
    ``RuntimeError`` when another resource was already installed on a GPU (it is set once per device).
    """
    check_gpu_memory(kind)
    with _LOCK:
        clash = {o: k for o, k in _STATE["devices"].items() if k != kind}
        if clash:
            o, k = next(iter(clash.items()))
            msg = (f"gpu_memory={kind!r}: cuda:{o} already allocates with gpu_memory={k!r}, and the memory "
                   "resource of a GPU is set once per process (memory allocated from it may still be in use). "
                   "Set gpu_memory once, at the start of the program, before anything allocates on the GPU.")
            raise RuntimeError(msg)
        if kind != "default" and importlib.util.find_spec("rmm") is None:
            msg = (f"gpu_memory={kind!r} needs RMM (the RAPIDS memory manager), which is not installed. Install "
                   "it (pip install rmm-cu12), or keep gpu_memory='default' (CuPy's own pool; cuML and cuDF "
                   "then allocate with cudaMalloc, which synchronizes the device on free).")
            raise ImportError(msg)
        _STATE["kind"] = kind
    if kind != "default" and devices.gpu_available():
        import cupy

        ensure_gpu_memory(range(cupy.cuda.runtime.getDeviceCount()))


def ensure_gpu_memory(ordinals: Any) -> None:
    """Install the configured resource on the GPUs ``ordinals`` that do not have it yet (the CUDA backend
    calls this when a run starts).  A no-op for ``"default"``."""
    with _LOCK:
        kind = _STATE["kind"]
        todo = [o for o in ordinals if o not in _STATE["devices"]]
        if kind == "default" or not todo:
            return
        import cupy
        import rmm.mr
        from rmm.allocators.cupy import rmm_cupy_allocator

        for o in todo:
            with cupy.cuda.Device(o):   # a resource must be made while its device is current
                if kind == "async":
                    mr = rmm.mr.CudaAsyncMemoryResource()
                else:
                    mr = rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource())
                rmm.mr.set_per_device_resource(o, mr)
            _STATE["devices"][o] = kind
        if not _STATE["libraries"]:
            cupy.cuda.set_allocator(rmm_cupy_allocator)
            _set_numba_manager()
            _STATE["libraries"] = True


def _set_numba_manager() -> None:
    """numba-cuda allocates through RMM too (must happen before numba creates its CUDA context)."""
    try:
        import numba
        from numba import cuda
    except ImportError:
        return
    if getattr(numba.config, "ENABLE_CUDASIM", False):
        return   # the simulator allocates NumPy arrays: nothing to manage
    from rmm.allocators.numba import RMMNumbaManager

    cuda.set_memory_manager(RMMNumbaManager)
