"""The GPU memory resource: one allocator shared by CuPy, numba, cuML and cuDF (``gpu_memory`` setting).

Without a memory resource cuML and cuDF allocate with RMM's default,
``cudaMalloc``/``cudaFree``, and a ``cudaFree`` synchronizes the device: it
serializes the lanes of the streams executor.  ``gn.set_config(gpu_memory=...)``
installs an RMM resource on every GPU, once per device and process, and makes
CuPy (``rmm.allocators.cupy.rmm_cupy_allocator``) and numba
(``rmm.allocators.numba.RMMNumbaManager``) allocate from it too:

``"auto"``     the default: where RMM is importable, ``"async"`` on every GPU whose resource is still RMM's
               own default (a resource the user, dask-cuda or ``rmm.reinitialize`` set is left alone, and so is
               a CuPy allocator other than CuPy's default pool); without RMM nothing changes, and the first
               cuML fit or call of the process warns once that cuML and cuDF allocate with the synchronous
               ``cudaMalloc``/``cudaFree``, which serialises concurrent GPU lanes.
``"default"``  nothing is changed, and nothing is said: CuPy uses its own memory pool, cuML/cuDF RMM's default
               resource.  Set it to keep a resource installed elsewhere, or to silence the warning.
``"async"``    ``rmm.mr.CudaAsyncMemoryResource()``: ``cudaMallocAsync``, stream-ordered, no device-wide
               synchronization on free.  The recommended setting for concurrent GPU lanes.
``"pool"``     ``rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource())``: a pool that grows from
               ``cudaMalloc`` (half the GPU at first, RMM's default).

Set it at the start of the program, before anything allocates on the GPU
(memory allocated before keeps its old allocator).  Without a GPU the setting
is kept and applied to each GPU when the CUDA backend first uses it: when the
streams executor starts a run on it, or a GPU estimator (cuML, scikit-learn's
array API) first fits or predicts on it, on any executor.

>>> GPU_MEMORY_CHOICES
('auto', 'default', 'async', 'pool')
>>> check_gpu_memory("pool")
'pool'
"""

from __future__ import annotations

import importlib.util
import threading
from typing import Any

from gpunets.base._warn import warn_user
from gpunets.devices import placement as devices

__all__ = ["GPU_MEMORY_CHOICES", "check_gpu_memory", "apply_gpu_memory", "ensure_gpu_memory", "gpu_memory_state",
           "note_gpu_estimator", "SYNC_CUML_WARNING"]

GPU_MEMORY_CHOICES = ("auto", "default", "async", "pool")

_LOCK = threading.Lock()
# kind: the setting; devices: ordinal -> what was done there ("async", "pool", "none": left as it was);
# libraries: CuPy and numba allocate through RMM; warned: the synchronous-cuML warning was given
_STATE: dict[str, Any] = {"kind": "auto", "devices": {}, "libraries": False, "warned": False}

SYNC_CUML_WARNING = (
    "cuML runs on RMM's synchronous default memory resource (cudaMalloc/cudaFree): every free synchronises the "
    "whole GPU, so concurrent GPU lanes (the streams executor) serialise on it, and RMM is not importable here "
    "to install an asynchronous pool. Install RMM (it comes with cuML: pip install rmm-cu12, or the RAPIDS "
    "conda environment) and gpunets uses rmm.mr.CudaAsyncMemoryResource by default; or say "
    "gn.set_config(gpu_memory='default') to keep the synchronous resource without this warning.")


def check_gpu_memory(value: Any) -> str:
    """Return ``value`` if it is a valid ``gpu_memory`` setting; else raise a ``ValueError`` listing them."""
    if value not in GPU_MEMORY_CHOICES:
        msg = (f"gpu_memory={value!r} is not a GPU memory setting; use one of {list(GPU_MEMORY_CHOICES)} "
               "('async' is RMM's cudaMallocAsync resource, recommended for concurrent GPU lanes).")
        raise ValueError(msg)
    return value


def gpu_memory_state() -> dict[str, Any]:
    """The setting and what was done: ``{"kind", "devices": {ordinal: kind}, "libraries"}`` (a copy).

    ``devices`` maps each GPU seen to the resource gpunets installed there (``"async"``, ``"pool"``) or
    ``"none"`` where it left the resource as it was (``"auto"`` without RMM, or a resource set by someone else).
    """
    with _LOCK:
        return {"kind": _STATE["kind"], "devices": dict(_STATE["devices"]), "libraries": _STATE["libraries"]}


def _rmm_importable() -> bool:
    return importlib.util.find_spec("rmm") is not None


def apply_gpu_memory(kind: str) -> None:
    """Set ``gpu_memory`` for the process (``gn.set_config`` calls this); install it on every GPU present.

    Raises ``ValueError`` for an unknown setting, ``ImportError`` when RMM is missing, and
    ``RuntimeError`` when another resource was already installed on a GPU (it is set once per device).
    """
    check_gpu_memory(kind)
    with _LOCK:
        clash = {o: k for o, k in _STATE["devices"].items() if _clashes(kind, k)}
        if clash:
            o, k = next(iter(clash.items()))
            msg = (f"gpu_memory={kind!r}: cuda:{o} already allocates with gpu_memory={k!r}, and the memory "
                   "resource of a GPU is set once per process (memory allocated from it may still be in use). "
                   "Set gpu_memory once, at the start of the program, before anything allocates on the GPU.")
            raise RuntimeError(msg)
        if kind in ("async", "pool") and not _rmm_importable():
            msg = (f"gpu_memory={kind!r} needs RMM (the RAPIDS memory manager), which is not installed. Install "
                   "it (pip install rmm-cu12), or keep gpu_memory='default' (CuPy's own pool; cuML and cuDF "
                   "then allocate with cudaMalloc, which synchronizes the device on free).")
            raise ImportError(msg)
        _STATE["kind"] = kind
        if kind in ("async", "pool"):   # asked for by name: GPUs left as they were get it now
            _STATE["devices"] = {o: k for o, k in _STATE["devices"].items() if k != "none"}
    if kind in ("async", "pool") or (kind == "auto" and _rmm_importable()):
        if devices.gpu_available():
            ensure_gpu_memory(range(devices.gpu_count()))


def _clashes(asked: str, done: str) -> bool:
    """Whether setting ``asked`` conflicts with ``done`` on a GPU (an installed resource stays for the process)."""
    if asked == "auto":
        return False   # auto takes a GPU as it finds it
    if asked == "default":
        return done != "none"
    return done not in (asked, "none")


def ensure_gpu_memory(ordinals: Any) -> None:
    """Install the configured resource on the GPUs ``ordinals`` that do not have it yet (the CUDA backend
    calls this when a run starts, and a GPU estimator before it runs).  A no-op for ``"default"``."""
    seen = _STATE["devices"]
    if all(o in seen for o in ordinals):   # the common case, without the lock: each GPU is settled once
        return
    with _LOCK:
        kind = _STATE["kind"]
        todo = [o for o in ordinals if o not in _STATE["devices"]]
        if not todo:
            return
        if kind == "default" or (kind == "auto" and not _rmm_importable()):
            for o in todo:
                _STATE["devices"][o] = "none"
            return
        import cupy
        import rmm.mr
        from rmm.allocators.cupy import rmm_cupy_allocator

        installed = False
        for o in todo:
            with cupy.cuda.Device(o):   # a resource must be made while its device is current
                if kind == "auto" and not _untouched(rmm.mr, o):
                    _STATE["devices"][o] = "none"   # someone chose this GPU's resource: theirs stays
                    continue
                if kind in ("auto", "async"):
                    mr = rmm.mr.CudaAsyncMemoryResource()
                else:
                    mr = rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource())
                rmm.mr.set_per_device_resource(o, mr)
            _STATE["devices"][o] = "pool" if kind == "pool" else "async"
            installed = True
        if installed and not _STATE["libraries"]:
            if kind != "auto" or _cupy_allocator_untouched(cupy):
                cupy.cuda.set_allocator(rmm_cupy_allocator)
            _set_numba_manager()
            _STATE["libraries"] = True


def _untouched(mr: Any, ordinal: int) -> bool:
    """True when GPU ``ordinal`` still has RMM's own default resource (plain ``cudaMalloc``)."""
    get = getattr(mr, "get_per_device_resource", None)
    if get is None:   # pragma: no cover - an RMM without it: assume nobody chose one
        return True
    return type(get(ordinal)) is mr.CudaMemoryResource


def _cupy_allocator_untouched(cupy: Any) -> bool:
    """True when CuPy allocates from its default memory pool (nobody called ``cupy.cuda.set_allocator``)."""
    get = getattr(cupy.cuda, "get_allocator", None)
    if get is None:
        return True
    alloc = get()
    return getattr(alloc, "__self__", None) is cupy.get_default_memory_pool()


def note_gpu_estimator(ordinal: int, library: str) -> None:
    """A GPU estimator is about to run on GPU ``ordinal``: settle its memory resource; for cuML on the
    synchronous default under ``"auto"``, warn once per process (:data:`SYNC_CUML_WARNING`)."""
    ensure_gpu_memory((ordinal,))
    if library != "cuml" or _STATE["warned"] or _STATE["kind"] != "auto" or _STATE["devices"].get(ordinal) != "none":
        return
    if _rmm_importable():
        return   # a resource someone else installed on purpose: nothing to say
    with _LOCK:
        if _STATE["warned"]:
            return
        _STATE["warned"] = True
    warn_user(SYNC_CUML_WARNING, RuntimeWarning)


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
