"""The one place gpunets gets CuPy from: the real module, or the fake GPU of :mod:`gpunets.devices.fakegpu`.

With ``GPUNETS_FAKE_GPU=N`` (N = 1 or 2) in the environment, :func:`cupy`
returns the strict NumPy-backed stand-in with N devices, and cuDF and cuML
count as absent (as on a GPU image without RAPIDS).  Without it, :func:`cupy`
imports CuPy.  Nothing here imports CuPy at import time.

>>> import os
>>> fake_gpu_count() == (int(os.environ["GPUNETS_FAKE_GPU"]) if os.environ.get("GPUNETS_FAKE_GPU") else 0)
True
"""

from __future__ import annotations

import os
import sys
from types import ModuleType
from typing import Any

__all__ = ["ENV", "fake_gpu_count", "cupy", "loaded_cupy", "hidden_by_fake"]

#: The environment variable that switches the fake GPU on.
ENV = "GPUNETS_FAKE_GPU"
_ALLOWED = ("1", "2")


def fake_gpu_count() -> int:
    """How many fake CUDA devices ``GPUNETS_FAKE_GPU`` asks for (0 when unset or empty).

    Raises
    ------
    ValueError
        When the variable holds anything but 1 or 2, naming the variable, its value and what is allowed.
    """
    raw = os.environ.get(ENV, "")
    if raw.strip() == "":
        return 0
    if raw.strip() not in _ALLOWED:
        msg = (f"{ENV}={raw!r} is not allowed: set it to 1 or 2 (the number of fake CUDA devices), "
               f"or unset it to use the real CuPy.")
        raise ValueError(msg)
    return int(raw.strip())


def cupy() -> ModuleType:
    """The CuPy module gpunets uses: the fake one under ``GPUNETS_FAKE_GPU``, else ``import cupy``.

    Raises
    ------
    ImportError
        When CuPy is not installed and no fake GPU is asked for.
    """
    if fake_gpu_count():
        from gpunets.devices import fakegpu  # noqa: PLC0415  # lazy: the fake GPU loads only under GPUNETS_FAKE_GPU

        return fakegpu.module()
    import cupy as real  # noqa: PLC0415 - optional, imported lazily

    return real


def loaded_cupy() -> Any:
    """The CuPy module if it is already loaded (fake or real), else None; never imports CuPy."""
    if os.environ.get(ENV):
        fake = sys.modules.get("gpunets.devices.fakegpu")
        return fake.module() if fake is not None and fake_gpu_count() else None
    return sys.modules.get("cupy")


def hidden_by_fake(name: str) -> bool:
    """Whether module ``name`` counts as absent because the fake GPU is on (cuDF and cuML).

    >>> hidden_by_fake("numpy")
    False
    """
    return name.split(".")[0] in ("cudf", "cuml", "cupy") and fake_gpu_count() > 0
