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
from collections.abc import Mapping
from typing import Any

from gpunets.base import verbs

__all__ = ["config", "get_config", "set_config", "check_run_options", "check_warm_params", "check_crossover",
           "check_graphs", "FALLBACK_POLICIES"]

FALLBACK_POLICIES = ("warn", "raise", "silent", "cpu")

_DEFAULTS: dict[str, Any] = {
    "executor": "auto",   # "auto" | "serial" | "threads" | "streams" | "dask" | an Executor
    "workers": None,      # worker threads for "threads" / lanes for "streams"; None: the cores
    "device": "auto",     # default placement of machines and nodes
    "fallback": "warn",   # what a GPU->CPU fallback does: "warn", "raise", "silent" or "cpu" ("warn", and a GPU fit
                          # that runs out of memory is fitted again on the CPU)
    "progress": False,    # show a tqdm progress bar while fitting
    "gpu_memory": "auto",  # GPU memory resource, process-wide, set once: "auto", "default", "async" or "pool"
    "thread_unsafe": (),  # estimator classes (or dotted names) fitted and called one at a time
    "output": "auto",     # what a call returns: "auto" | "device" | "numpy" | "pandas" (like cuML's output_type)
    # iteration-like hyperparameters whose growth a machine may continue from its fitted state ("update (warm)")
    "warm_params": ("n_estimators", "max_iter", "n_iter"),
    "cache": False,       # machines keep their outputs on the training data (a machine's own cache= wins)
    "cache_bytes": 1 << 30,  # the byte budget of that cache (least recently used entries are evicted)
    "store": None,        # a gpunets.devices.store.Store of fitted states on disk (a path is made one); None: off
    # device="auto": {estimator class name or "default": rows} from which a machine trains on the GPU (updates
    # the table shipped in gpunets.planning.crossover); None: the shipped table alone
    "gpu_crossover": None,
    # searches of linear pipelines fitted and scored from per-fold moments (docs/tuning.md, "One-pass searches"),
    # equal to scikit-learn's to 1e-9 relative: "auto" from 20,000 rows on (below, the network: bit for bit
    # scikit-learn's, and cheap), True at any size, False never
    "one_pass": "auto",
    # a fitted network called again with inputs of the same shapes replays captured CUDA graphs (docs/devices.md,
    # "Graph mode"); False: every call issues its tasks one by one
    "graphs": False,
}
OUTPUT_TYPES = ("auto", "device", "numpy", "pandas")

_GLOBAL: dict[str, Any] = dict(_DEFAULTS)
_LOCAL: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("gpunets_config", default=None)


def get_config() -> dict[str, Any]:
    """Return a copy of the settings in force here.

    >>> sorted(get_config())  # doctest: +NORMALIZE_WHITESPACE
    ['cache', 'cache_bytes', 'device', 'executor', 'fallback', 'gpu_crossover', 'gpu_memory', 'graphs', 'one_pass',
     'output', 'progress', 'store', 'thread_unsafe', 'warm_params', 'workers']
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
    check_run_options(**{k: v for k, v in changes.items()
                         if k in ("workers", "executor", "progress", "output", "graphs")})
    if "gpu_memory" in changes:
        verbs.get("check_gpu_memory")(changes["gpu_memory"])
    _check_cache(changes)
    if "thread_unsafe" in changes:
        changes = {**changes, "thread_unsafe": verbs.get("check_thread_unsafe")(changes["thread_unsafe"])}
    if "warm_params" in changes:
        changes = {**changes, "warm_params": check_warm_params(changes["warm_params"])}
    if "store" in changes:   # a path becomes a Store (its folder checked now, not at the first fit)
        changes = {**changes, "store": verbs.get("check_store")(changes["store"])}
    if "gpu_crossover" in changes:
        changes = {**changes, "gpu_crossover": check_crossover(changes["gpu_crossover"])}
    if "one_pass" in changes and not (isinstance(changes["one_pass"], bool) or changes["one_pass"] == "auto"):
        msg = (f"one_pass={changes['one_pass']!r} of type {type(changes['one_pass']).__name__} is not a setting: "
               "expected True (searches of linear pipelines fitted from per-fold moments wherever that applies, "
               "equal to scikit-learn's to 1e-9), False (every search builds its network, bit for bit "
               "scikit-learn's) or 'auto' (the default: the moments from 20,000 rows on). "
               "Hint: gn.config(one_pass=True).")
        raise TypeError(msg)
    if "graphs" in changes:   # the setting itself is a bool (None is only a call's "the default")
        check_graphs(changes["graphs"])
    if "device" in changes and changes["device"] not in (None, "auto"):
        verbs.get("check_device")(changes["device"])  # Device.parse: raises a ValueError listing the valid forms
    return changes


def check_warm_params(value: Any) -> tuple[str, ...]:
    """``warm_params`` as a tuple of hyperparameter names, or a TypeError naming what is wrong.

    >>> check_warm_params(["n_estimators"])
    ('n_estimators',)
    >>> check_warm_params("max_iter")
    Traceback (most recent call last):
    ...
    TypeError: warm_params='max_iter' must be a list or tuple of hyperparameter names, e.g. ('max_iter',) ...
    """
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) and v for v in value):
        return tuple(value)
    example = f"({value!r},)" if isinstance(value, str) else "('n_estimators', 'max_iter')"
    msg = (f"warm_params={value!r} must be a list or tuple of hyperparameter names, e.g. {example} (the "
           "iteration-like hyperparameters whose growth a machine continues from its fitted state); use () to "
           "turn warm updates off everywhere.")
    raise TypeError(msg)
def check_crossover(value: Any) -> dict[str, int] | None:
    """``gpu_crossover`` as a dict of estimator kind -> rows (an int >= 0), or None (the shipped table alone).

    >>> check_crossover({"Ridge": 10_000})
    {'Ridge': 10000}
    >>> check_crossover({"Ridge": -1})
    Traceback (most recent call last):
    ...
    ValueError: gpu_crossover={'Ridge': -1}: each entry maps an estimator class name (or 'default') to a row count >= 0 ...
    """
    if value is None:
        return None
    ok = isinstance(value, Mapping) and all(
        isinstance(k, str) and k and isinstance(v, int) and not isinstance(v, bool) and v >= 0
        for k, v in value.items())
    if not ok:
        msg = (f"gpu_crossover={value!r}: each entry maps an estimator class name (or 'default') to a row count "
               ">= 0, e.g. {'Ridge': 50_000, 'default': 100_000}; a machine placed on 'auto' trains on the GPU "
               "from that many rows. None uses the table shipped with gpunets (gpunets.planning.crossover).")
        raise ValueError(msg)
    return dict(value)


def _check_cache(changes: dict[str, Any]) -> None:
    if "cache" in changes and not isinstance(changes["cache"], bool):
        msg = (f"cache={changes['cache']!r} must be True or False: whether machines keep their outputs on the "
               "training data (a machine's own cache= argument wins).")
        raise TypeError(msg)
    if "cache_bytes" in changes:
        v = changes["cache_bytes"]
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            msg = (f"cache_bytes={v!r} must be a non-negative integer: the byte budget of the cache of node "
                   "outputs, e.g. cache_bytes=2**30 for 1 GiB (0 keeps nothing).")
            raise ValueError(msg)


def check_run_options(**options: Any) -> None:
    """Check the arguments shared by ``gn.config``, ``fit`` and calls: one rule for each, one message.

    ``None`` means "the configured default" and is always accepted.

    >>> check_run_options(workers=0)
    Traceback (most recent call last):
    ...
    ValueError: workers=0 must be a positive integer or None (the number of cores).
    """
    for name, value in options.items():
        if value is None:
            continue
        if name == "workers":
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                msg = f"workers={value!r} must be a positive integer or None (the number of cores)."
                raise ValueError(msg)
        elif name == "executor":
            verbs.get("check_executor")(value)   # the executors live above config
        elif name in ("progress", "force", "trace", "only"):
            if not isinstance(value, bool):
                msg = f"{name}={value!r} must be True or False."
                raise TypeError(msg)
        elif name == "graphs":
            check_graphs(value)
        elif name == "output":
            if value not in OUTPUT_TYPES:
                msg = (f"output={value!r} is not an output type: use 'auto' (the type family given), "
                       "'device' (where it was computed), 'numpy' or 'pandas'; gn.set_config(output=...) sets "
                       "the default.")
                raise ValueError(msg)
        else:  # pragma: no cover - a programming error
            raise TypeError(f"unknown run option {name!r}")


def check_graphs(value: Any) -> None:
    """``graphs`` must be True, False or ``"auto"``.

    >>> check_graphs("yes")
    Traceback (most recent call last):
    ...
    TypeError: graphs='yes' of type str is not a setting: expected True (a fitted network called again ...
    """
    if not (isinstance(value, bool) or value == "auto"):
        msg = (f"graphs={value!r} of type {type(value).__name__} is not a setting: expected True (a fitted "
               "network called again with inputs of the same shapes replays captured CUDA graphs), "
               "False (the default: each call issues its tasks one by one) or 'auto' (replay where earlier "
               "calls were measured host-bound). Hint: gn.config(graphs=True), or node(X, graphs=True) for "
               "one call.")
        raise TypeError(msg)


def set_config(**changes: Any) -> None:
    """Change the process-wide defaults (outside any ``config`` block).

    ``gpu_memory`` (``"auto"``, the default, ``"default"``, ``"async"``, ``"pool"``) chooses the RMM
    memory resource of every GPU, shared by CuPy, numba, cuML and cuDF (see :mod:`gpunets.devices.gpu_memory`;
    ``"auto"`` is RMM's asynchronous pool where RMM is importable); it is set once per process, before
    anything allocates on a GPU.

    >>> set_config(fallback="raise"); get_config()["fallback"]
    'raise'
    >>> set_config(fallback="warn")
    """
    changes = _validate(changes)
    if "gpu_memory" in changes:
        verbs.get("apply_gpu_memory")(changes["gpu_memory"])   # raises (RMM missing, already set) before any change
    _GLOBAL.update(changes)


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
    fallback : {"warn", "raise", "silent", "cpu"}, optional
        What happens when work placed on a GPU has to run on the CPU; ``"cpu"`` is ``"warn"``, and
        also fits again on the CPU an array-API fit that runs out of GPU memory (its report shows the
        route ``cpu_fallback`` and why).
    thread_unsafe : list of classes or dotted names, optional
        Estimators that are not thread-safe (beyond the built-in registry of
        :mod:`gpunets.compute.threadsafety`): their fits and calls run one at a time.
    output : {"auto", "device", "numpy", "pandas"}, optional
        What calling a node returns (cuML's ``output_type``): ``"auto"`` the type family and device
        of the data given, ``"device"`` the value where it was computed, ``"numpy"`` a NumPy array on
        the host, ``"pandas"`` a pandas object on the host (the input's index where it had one).
    warm_params : tuple of str, optional
        The iteration-like hyperparameters (default ``("n_estimators", "max_iter", "n_iter")``) whose growth
        a machine continues from its fitted state instead of refitting (see :class:`gpunets.Machine`'s
        ``warm``); ``()`` turns warm updates off.
    cache : bool, optional
        Whether machines without their own ``cache=`` keep their outputs on the training data
        (:mod:`gpunets.devices.cache`); default False.
    cache_bytes : int, optional
        The byte budget of that cache (least recently used entries are evicted); default 1 GiB.
    gpu_crossover : dict or None, optional
        ``{estimator class name or "default": rows}``: a machine placed on ``"auto"`` trains on the GPU only
        from that many training rows (it updates the table shipped in :mod:`gpunets.planning.crossover`,
        measured by the ``gpu_vs_cpu`` benchmark); None (default): the shipped table alone.
    store : str, os.PathLike, gpunets.Store or None, optional
        A folder of fitted states (:mod:`gpunets.devices.store`, docs/store.md): every fit loads a state
        stored under the same key instead of fitting it again; ``gn.Store(path, max_bytes=...)`` bounds its
        size (default 8 GiB). Default None: no store.

    Examples
    --------
    >>> with config(workers=2, fallback="raise"):
    ...     (get_config()["workers"], get_config()["fallback"])
    (2, 'raise')
    """

    def __init__(self, **changes: Any) -> None:
        if "gpu_memory" in changes:
            msg = ("gpu_memory cannot be set for a block of code: the GPU memory resource is process-wide and "
                   "set once. Use gn.set_config(gpu_memory=...) at the start of the program.")
            raise ValueError(msg)
        self._changes = _validate(changes)
        self._tokens: list[contextvars.Token] = []

    def __enter__(self) -> config:
        merged = get_config()
        merged.update(self._changes)
        self._tokens.append(_LOCAL.set(merged))
        return self

    def __exit__(self, *exc: object) -> None:
        _LOCAL.reset(self._tokens.pop())
