"""Devices and data: where a value lives, moving it, its rows, its fingerprint, GPU memory, the fake GPU.

Owns the :class:`~gpunets.devices.placement.Device` value, GPU detection and placement blocks (``device``),
recognising values (``value_types``), moving them between devices (``data``), selecting rows (``rows``),
content fingerprints (``fingerprint``), the cache of node outputs (``cache``), the process-wide GPU memory
resource (``gpu_memory``), and the one place CuPy comes from (``_gpulibs``: the real module, or the strict fake
GPU of ``fakegpu``).  May import :mod:`gpunets.base` only; CuPy, cuDF and RMM are imported lazily, here only.
"""

# What the module gpunets.devices held before it became this package (deep imports, saved files)
from gpunets.devices.placement import *  # noqa: E402, F403
from gpunets.devices.placement import __all__  # noqa: E402, F401
