"""gpunets: GPU-accelerated learning networks.

A model is a graph of sources, machines (a model bound to its training
inputs) and operation nodes.  ``fit`` trains every machine upstream of a node,
in dependency order, retraining only what changed; calling a node evaluates
the graph on the training data or on new data.  Independent branches run
concurrently (threads on a CPU, CUDA streams on a GPU, Dask beyond one
machine), and every network runs on the CPU too, with the same answers.

>>> import numpy as np, gpunets as gn
>>> from sklearn.linear_model import Ridge, LinearRegression
>>> rng = np.random.default_rng(0)
>>> X = gn.source(rng.normal(size=(50, 3)), name="X")
>>> y = gn.source(rng.normal(size=50), name="y")
>>> yhat = gn.mean(gn.machine(Ridge(), X, y).predict(X), gn.machine(LinearRegression(), X, y).predict(X))
>>> sorted(yhat.fit(executor="serial").actions.by_label().items())
[('LinearRegression', 'train'), ('Ridge', 'train')]
>>> yhat().shape
(50,)

``import gpunets`` imports none of cupy, cudf, cuml, numba or dask.
"""

from __future__ import annotations

import sys
from typing import Any

from gpunets.base import moved as _moved

_moved.install(sys.modules[__name__])   # old module paths (gpunets.plan, ...) are aliases of where the modules live now

from gpunets.api.network import Evaluation, evaluate, fit, last_trace
from gpunets.api.replace import replace
from gpunets.api.report import FitReport, fitted_params, report
from gpunets.base.config import config, get_config, set_config
from gpunets.base.exceptions import (
    CycleError,
    DeviceUnavailableError,
    EvaluationError,
    FitError,
    GpunetsError,
    NetworkError,
    NotFittedError,
    StreamOrderError,
)
from gpunets.base.trace import Trace
from gpunets.core.machines import Machine, machine
from gpunets.core.nodes import AbstractNode, Node, Source, node, source
from gpunets.core.ops import hstack, max, mean, min, sum, var, vote, weighted_sum
from gpunets.devices.cache import CacheInfo, cache_clear, cache_info
from gpunets.devices.placement import Device, DeviceFallbackWarning, device
from gpunets.devices.store import Store, StoreInfo, StoreWarning, store_clear, store_info
from gpunets.devices.store_keys import no_store
from gpunets.executors import Executor, SerialExecutor, StreamsExecutor, ThreadsExecutor


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpunets")
    except PackageNotFoundError:  # pragma: no cover - a source checkout that is not installed
        return "0+unknown"


__version__ = _version()

__all__ = [
    "source", "node", "machine", "fit", "evaluate", "report", "fitted_params", "last_trace", "replace",
    "mean", "weighted_sum", "vote", "hstack", "sum", "min", "max", "var",
    "config", "get_config", "set_config", "cache_info", "cache_clear", "CacheInfo",
    "Store", "StoreInfo", "StoreWarning", "store_info", "store_clear", "no_store", "device", "Device", "DeviceFallbackWarning",
    "AbstractNode", "Source", "Node", "Machine", "FitReport", "Trace", "Evaluation",
    "Executor", "SerialExecutor", "ThreadsExecutor", "StreamsExecutor", "DaskExecutor",
    "GpunetsError", "NotFittedError", "CycleError", "NetworkError", "DeviceUnavailableError", "FitError",
    "EvaluationError", "StreamOrderError",
    "save", "load", "PersistenceError", "UntrustedTypesError",
    "GridSearchCV", "RandomizedSearchCV", "HalvingGridSearchCV", "HalvingRandomSearchCV",
]

_LAZY = {
    "DaskExecutor": ("gpunets.executors.dask", "DaskExecutor"),
    "Composite": ("gpunets.compose.composite", "Composite"),
    "CompositeRegressor": ("gpunets.compose.composite", "CompositeRegressor"),
    "CompositeClassifier": ("gpunets.compose.composite", "CompositeClassifier"),
    "CompositeTransformer": ("gpunets.compose.composite", "CompositeTransformer"),
    "StackingRegressor": ("gpunets.compose.stacking", "StackingRegressor"),
    "StackingClassifier": ("gpunets.compose.stacking", "StackingClassifier"),
    "GridSearchCV": ("gpunets.tuning", "GridSearchCV"),
    "RandomizedSearchCV": ("gpunets.tuning", "RandomizedSearchCV"),
    "HalvingGridSearchCV": ("gpunets.tuning", "HalvingGridSearchCV"),
    "HalvingRandomSearchCV": ("gpunets.tuning", "HalvingRandomSearchCV"),
    "from_sklearn": ("gpunets.sklearn_import", "from_sklearn"),
    "save": ("gpunets.persistence.persist", "save"),
    "load": ("gpunets.persistence.persist", "load"),
    "PersistenceError": ("gpunets.persistence.persist", "PersistenceError"),
    "UntrustedTypesError": ("gpunets.persistence.persist", "UntrustedTypesError"),
}
_LAZY_MODULES = ("testing", "kernels", "data", "models", "plan", "scheduler", "graph")


def __dir__() -> list[str]:
    """Every public name, the lazy ones included (tab completion in IPython/Jupyter)."""
    return sorted(set(globals()) | set(_LAZY) | set(_LAZY_MODULES))


def __getattr__(name: str) -> Any:
    import importlib

    if name in _LAZY:
        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(mod), attr)
    if name in _LAZY_MODULES:
        return importlib.import_module(f"gpunets.{name}")
    msg = f"module 'gpunets' has no attribute {name!r}"
    raise AttributeError(msg)
