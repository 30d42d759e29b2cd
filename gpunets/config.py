"""Settings that apply to a block of code: executor, workers, device, fallback.

Settings live in a :mod:`contextvars` variable, so a ``with gn.config(...)``
block applies to the code inside it, in this thread, and executors copy the
caller's context into the tasks they run.

>>> import gpunets as gn
>>> with gn.config(executor="serial"):
...     gn.get_config()["executor"]
'serial'
>>> gn.get_config()["executor"]
'auto'
"""

from __future__ import annotations

import contextvars
from typing import Any

__all__ = ["config", "get_config", "set_config", "FALLBACK_POLICIES"]

FALLBACK_POLICIES = ("warn", "raise", "silent")

_DEFAULTS: dict[str, Any] = {
    "executor": "auto",   # "auto" | "serial" | "threads" | "streams" | "dask" | an Executor
    "workers": None,      # worker threads for "threads" / lanes for "streams"; None: the cores
    "device": "auto",     # default placement of machines and nodes
    "fallback": "warn",   # what a GPU->CPU fallback does: "warn", "raise" or "silent"
    "progress": False,    # show a tqdm progress bar while fitting
    "output": "auto",     # what a call returns: "auto" | "device" | "numpy" | "pandas" (like cuML's output_type)
}
OUTPUT_TYPES = ("auto", "device", "numpy", "pandas")

_GLOBAL: dict[str, Any] = dict(_DEFAULTS)
_LOCAL: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("gpunets_config", default=None)


def get_config() -> dict[str, Any]:
    """Return a copy of the settings in force here.

    >>> sorted(get_config())
    ['device', 'executor', 'fallback', 'output', 'progress', 'workers']
    """
    local = _LOCAL.get()
    return dict(local if local is not None else _GLOBAL)


def _validate(changes: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(changes) - set(_DEFAULTS))
    if unknown:
        msg = (f"Unknown gpunets setting(s) {unknown}. Valid settings are: {sorted(_DEFAULTS)}.")
        raise TypeError(msg)
    if "fallback" in changes and changes["fallback"] not in FALLBACK_POLICIES:
        msg = (f"fallback={changes['fallback']!r} is not a fallback policy; "
               f"use one of {list(FALLBACK_POLICIES)}.")
        raise ValueError(msg)
    workers = changes.get("workers")
    if workers is not None and (not isinstance(workers, int) or isinstance(workers, bool) or workers < 1):
        msg = f"workers={workers!r} must be a positive integer or None (the number of cores)."
        raise ValueError(msg)
    if "executor" in changes:
        from .executors import check_executor_spec

        check_executor_spec(changes["executor"])
    if "output" in changes and changes["output"] not in OUTPUT_TYPES:
        msg = f"output={changes['output']!r} is not an output type; use one of {list(OUTPUT_TYPES)}."
        raise ValueError(msg)
    if "progress" in changes and not isinstance(changes["progress"], bool):
        msg = f"progress={changes['progress']!r} must be True or False."
        raise TypeError(msg)
    if "device" in changes and changes["device"] not in (None, "auto"):
        from .devices import Device

        Device.parse(changes["device"])  # raises a ValueError listing the valid forms
    return changes


def set_config(**changes: Any) -> None:
    """Change the process-wide defaults (outside any ``config`` block).

    >>> set_config(fallback="raise"); get_config()["fallback"]
    'raise'
    >>> set_config(fallback="warn")
    """
    _GLOBAL.update(_validate(changes))


class config:
    """Context manager that changes settings for the code inside it.

    Parameters
    ----------
    executor : str or Executor, optional
        ``"auto"``, ``"serial"``, ``"threads"``, ``"streams"``, ``"dask"`` or an executor object.
    workers : int, optional
        Worker threads (``threads``) or lanes (``streams``).
    device : str, optional
        Default placement, e.g. ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"auto"``.
    fallback : {"warn", "raise", "silent"}, optional
        What happens when work placed on a GPU has to run on the CPU.
    output : {"auto", "device", "numpy", "pandas"}, optional
        What calling a node returns (cuML's ``output_type``): ``"auto"`` the type family and device
        of the data given, ``"device"`` the value where it was computed, ``"numpy"`` a NumPy array on
        the host, ``"pandas"`` a pandas object on the host (the input's index where it had one).

    Examples
    --------
    >>> with config(workers=2, fallback="raise"):
    ...     (get_config()["workers"], get_config()["fallback"])
    (2, 'raise')
    """

    def __init__(self, **changes: Any) -> None:
        self._changes = _validate(changes)
        self._tokens: list[contextvars.Token] = []

    def __enter__(self) -> "config":
        merged = get_config()
        merged.update(self._changes)
        self._tokens.append(_LOCAL.set(merged))
        return self

    def __exit__(self, *exc: object) -> None:
        _LOCAL.reset(self._tokens.pop())
