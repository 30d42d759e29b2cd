"""Where an estimator runs: cuML twins, scikit-learn array-API dispatch, logged CPU fallback.

:func:`resolve_estimator` turns (model, device) into a :class:`Resolved`: an
*unfitted* estimator to fit and the route it takes.  For a scikit-learn
estimator placed on a CUDA device, in this order:

1. ``"cuml"``: its cuML twin (``twin.from_sklearn(clone(model))`` where cuML
   offers it, else the parameters both accept), when cuML is installed and
   has one that accepts the model's parameters;
2. ``"array_api"``: the scikit-learn estimator itself, fitted on CuPy arrays
   under ``sklearn.config_context(array_api_dispatch=True)``, when the
   estimator (with these parameters) supports it and ``SCIPY_ARRAY_API=1``
   was set before scipy was imported;
3. ``"cpu_fallback"``: a clone on the CPU, with ONE logged line on the
   ``"gpunets"`` logger, e.g. ```Ridge.fit` falling back to CPU: cuML is not
   installed and Ridge(solver='lsqr') does not support array-API dispatch``;
   with ``fallback="raise"`` a :class:`~gpunets.base.exceptions.DeviceUnavailableError`.

A cuML estimator placed on the CPU runs as its scikit-learn twin (path
``"sklearn"``); an scikit-learn estimator on the CPU is cloned (path
``"sklearn"``).  Nothing here fits anything, and nothing imports cuML or CuPy
unless a GPU route is being built.

>>> from sklearn.linear_model import Ridge
>>> r = resolve_estimator(Ridge(alpha=2.0), "cpu", what="machine Ridge")
>>> r.path, r.device, r.estimator.alpha
('sklearn', Device('cpu'), 2.0)
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import inspect
import logging
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sklearn.base import clone

from gpunets.base.config import get_config
from gpunets.base.exceptions import DeviceUnavailableError
from gpunets.devices._gpulibs import loaded_cupy
from gpunets.devices.data import device_of, installed, is_cudf, is_cupy_array, to_device
from gpunets.devices.gpu_memory import note_gpu_estimator
from gpunets.devices.placement import CPU, Device, device_exists, local_ordinal, why_unavailable

__all__ = [
    "SKLEARN_TO_CUML",
    "CUML_TO_SKLEARN",
    "ARRAY_API_ESTIMATORS",
    "Resolved",
    "public_path",
    "is_cuml_estimator",
    "cuml_installed",
    "cuml_twin_class",
    "sklearn_twin_class",
    "to_cuml",
    "to_sklearn",
    "fitted_as_sklearn",
    "fitted_on_host",
    "scipy_array_api_enabled",
    "supports_array_api",
    "resolve_estimator",
    "cpu_fallback",
    "fit_context",
    "call_context",
    "prepare_inputs",
]

logger = logging.getLogger("gpunets")

#: scikit-learn estimator (public dotted path) -> its cuML twin.  A twin missing
#: from the installed cuML is treated as "no twin".
SKLEARN_TO_CUML: dict[str, str] = {
    f"sklearn.{mod}.{name}": f"cuml.{mod}.{name}"
    for mod, names in {
        "linear_model": ["LinearRegression", "Ridge", "RidgeCV", "Lasso", "ElasticNet",
                         "LogisticRegression"],
        "ensemble": ["RandomForestRegressor", "RandomForestClassifier"],
        "neighbors": ["KNeighborsRegressor", "KNeighborsClassifier", "NearestNeighbors"],
        "decomposition": ["PCA", "TruncatedSVD"],
        "preprocessing": ["StandardScaler", "MinMaxScaler", "MaxAbsScaler", "Normalizer"],
        "cluster": ["KMeans", "DBSCAN"],
        "svm": ["SVC", "SVR", "LinearSVC", "LinearSVR"],
        "manifold": ["TSNE"],
        "naive_bayes": ["GaussianNB", "MultinomialNB"],
    }.items()
    for name in names
}

#: cuML estimator -> its scikit-learn twin (cuML's own ``_cpu_class_path`` wins).
CUML_TO_SKLEARN: dict[str, str] = {v: k for k, v in SKLEARN_TO_CUML.items()}

#: Estimators documented to support array-API dispatch (scikit-learn 1.9), used
#: only when an estimator exposes no ``array_api_support`` tag.
ARRAY_API_ESTIMATORS: frozenset[str] = frozenset({
    "sklearn.decomposition.PCA", "sklearn.linear_model.Ridge", "sklearn.linear_model.RidgeCV",
    "sklearn.linear_model.RidgeClassifier", "sklearn.linear_model.RidgeClassifierCV",
    "sklearn.linear_model.LogisticRegression", "sklearn.discriminant_analysis.LinearDiscriminantAnalysis",
    "sklearn.preprocessing.Binarizer", "sklearn.preprocessing.KernelCenterer",
    "sklearn.preprocessing.LabelEncoder", "sklearn.preprocessing.MaxAbsScaler",
    "sklearn.preprocessing.MinMaxScaler", "sklearn.preprocessing.Normalizer",
    "sklearn.preprocessing.PolynomialFeatures", "sklearn.preprocessing.StandardScaler",
    "sklearn.mixture.GaussianMixture", "sklearn.naive_bayes.GaussianNB",
})

# cuML-only constructor arguments, not worth reporting as "dropped".
_CUML_INFRA = frozenset({"handle", "verbose", "output_type"})


def _ridge_ok(p: dict[str, Any]) -> str:
    if p.get("solver", "auto") not in ("auto", "svd"):
        return f"solver={p['solver']!r} (only 'svd' dispatches)"
    return "positive=True" if p.get("positive", False) else ""


# Parameter conditions that scikit-learn's tags do not encode (the tags of PCA,
# LogisticRegression and GaussianMixture already depend on their parameters).
_ARRAY_API_CONDITIONS: dict[str, Callable[[dict[str, Any]], str]] = {
    "sklearn.linear_model.Ridge": _ridge_ok,
    "sklearn.linear_model.RidgeClassifier": _ridge_ok,
    "sklearn.linear_model.RidgeCV": _ridge_ok,
    "sklearn.linear_model.RidgeClassifierCV": _ridge_ok,
    "sklearn.discriminant_analysis.LinearDiscriminantAnalysis":
        lambda p: "" if p.get("solver", "svd") == "svd" else f"solver={p['solver']!r} (only 'svd' dispatches)",
}


@dataclass(frozen=True)
class Resolved:
    """How an estimator will run.

    Attributes
    ----------
    estimator : estimator
        An unfitted estimator to fit: a cuML twin, a scikit-learn twin, or a clone of the model.
    device : Device
        Where it actually runs.
    path : {"sklearn", "cuml", "array_api", "cpu_fallback"}
    reason : str
        Why it does not run where it was placed (or why a twin was used); ``""`` otherwise.
    dropped : tuple of str
        Parameters of the model that the twin does not take.
    """

    estimator: Any
    device: Device
    path: str
    reason: str = ""
    dropped: tuple[str, ...] = ()


# ----------------------------------------------------------------- classes and twins


def public_path(obj: Any) -> str:
    """The public dotted path of an estimator's class (``sklearn.linear_model.Ridge``).

    >>> from sklearn.linear_model import Ridge
    >>> public_path(Ridge())
    'sklearn.linear_model.Ridge'
    """
    cls = obj if isinstance(obj, type) else type(obj)
    parts = cls.__module__.split(".")
    if parts[0] in ("sklearn", "cuml") and len(parts) > 1:
        return f"{parts[0]}.{parts[1].lstrip('_')}.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def is_cuml_estimator(model: Any) -> bool:
    """Whether ``model`` is a cuML estimator (by its module; cuML is not imported).

    >>> from sklearn.linear_model import Ridge
    >>> is_cuml_estimator(Ridge())
    False
    """
    return type(model).__module__.split(".")[0] == "cuml"


def cuml_installed() -> bool:
    """Whether cuML can be imported here (found on the path; not imported).

    >>> isinstance(cuml_installed(), bool)
    True
    """
    return installed("cuml")


def _import_path(path: str) -> type | None:
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None


def cuml_twin_class(model: Any) -> type | None:
    """The cuML class twinned with ``model``'s class, or None (imports cuML only if installed)."""
    path = SKLEARN_TO_CUML.get(public_path(model))
    return _import_path(path) if path and cuml_installed() else None


def sklearn_twin_class(model: Any) -> type | None:
    """The scikit-learn class twinned with a cuML estimator, or None."""
    cls = type(model)
    path = getattr(cls, "_cpu_class_path", None) or CUML_TO_SKLEARN.get(public_path(model))
    if not isinstance(path, str):  # defined in a private module (e.g. cuml._thirdparty...): match by identity
        path = next((sk for cu, sk in CUML_TO_SKLEARN.items()
                     if cu.rpartition(".")[2] == cls.__name__
                     and getattr(sys.modules.get(cu.rpartition(".")[0]), cls.__name__, None) is cls), None)
    return _import_path(path) if isinstance(path, str) else None


def _common_params(params: dict[str, Any], cls: type) -> tuple[dict[str, Any], tuple[str, ...]]:
    sig = inspect.signature(cls)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        return dict(params), ()
    keep = {k: v for k, v in params.items() if k in sig.parameters}
    return keep, tuple(sorted(k for k in params if k not in keep and k not in _CUML_INFRA))


class _NoTwin(Exception):
    pass


def to_cuml(model: Any) -> tuple[Any, tuple[str, ...]]:
    """An unfitted cuML twin of a scikit-learn estimator, and the parameters it dropped.

    Uses ``twin.from_sklearn(clone(model))`` where cuML offers it (it raises
    for hyperparameters the GPU cannot honour), else the parameters both
    classes accept.

    Raises
    ------
    LookupError
        When cuML is not installed, has no twin, or rejects the parameters.
    """
    name = type(model).__name__
    if not cuml_installed():
        raise LookupError("cuML is not installed")
    twin = cuml_twin_class(model)
    if twin is None:
        raise LookupError(f"cuML has no twin of {name}")
    base = clone(model)
    if hasattr(twin, "from_sklearn"):
        try:
            est = twin.from_sklearn(base)
        except (TypeError, ValueError, NotImplementedError) as exc:  # cuML's UnsupportedOnGPU is a ValueError
            raise LookupError(f"cuML's {twin.__name__} cannot run {model!r} ({exc})") from exc
        # from_sklearn sets output_type="numpy" (it cannot infer it from training inputs), so every
        # predict/transform would copy its result to the host; cuML's own default mirrors the input
        # (CuPy in, CuPy out; cuDF in, cuDF out), which keeps results on the GPU.
        if getattr(est, "output_type", None) == "numpy" and "output_type" in est.get_params(deep=False):
            est.set_params(output_type="input")
        return est, ()
    params, dropped = _common_params(base.get_params(deep=False), twin)
    return twin(**params), dropped


def to_sklearn(model: Any) -> tuple[Any, tuple[str, ...]]:
    """An unfitted scikit-learn twin of a cuML estimator, and the parameters it dropped.

    Uses ``model.as_sklearn()`` where cuML offers it, else the parameters both accept.

    Raises
    ------
    LookupError
        When there is no scikit-learn twin.
    """
    if hasattr(model, "as_sklearn"):
        try:
            return clone(model.as_sklearn()), ()
        except (TypeError, ValueError, NotImplementedError) as exc:  # UnsupportedOnCPU is a ValueError
            raise LookupError(f"{type(model).__name__}.as_sklearn() failed ({exc})") from exc
    twin = sklearn_twin_class(model)
    if twin is None:
        raise LookupError(f"{type(model).__name__} has no scikit-learn twin")
    params, dropped = _common_params(model.get_params(deep=False), twin)
    return twin(**params), dropped


def fitted_as_sklearn(est: Any) -> Any:
    """A fitted cuML estimator's fitted scikit-learn twin (cuML's ``as_sklearn()``), or None where cuML
    offers none (no ``as_sklearn``, or cuML's ``UnsupportedOnCPU`` for these settings)."""
    as_sklearn = getattr(est, "as_sklearn", None)
    if not callable(as_sklearn):
        return None
    try:
        return as_sklearn()
    except Exception as exc:
        if type(exc).__name__ != "UnsupportedOnCPU":   # cuML's "no CPU twin for these settings"
            raise
        return None


def fitted_on_host(est: Any) -> tuple[Any, str]:
    """A state fitted on a GPU as one that runs on the CPU, and how it was made: a cuML estimator's fitted
    scikit-learn twin (:func:`fitted_as_sklearn`; LookupError where cuML offers none), or a scikit-learn estimator
    fitted on CuPy (array API) copied with its arrays (nested estimators' too) on the host.  ``est`` is kept."""
    if is_cuml_estimator(est):
        twin = fitted_as_sklearn(est)
        if twin is None:
            raise LookupError(f"cuML offers no scikit-learn twin of the fitted {type(est).__name__}")
        return twin, "cuML's as_sklearn()"
    return _on_host(est, 0), "its arrays copied to the host"


def _on_host(x: Any, depth: int) -> Any:
    if is_cupy_array(x) or is_cudf(x):
        return to_device(x, CPU)
    if depth > 8:
        return x
    if type(x) in (list, tuple):
        items = [_on_host(v, depth + 1) for v in x]
        return x if all(a is b for a, b in zip(items, x)) else type(x)(items)
    if type(x) is dict:
        moved = {k: _on_host(v, depth + 1) for k, v in x.items()}
        return x if all(moved[k] is v for k, v in x.items()) else moved
    attrs = getattr(x, "__dict__", None)
    if not callable(getattr(x, "get_params", None)) or not isinstance(attrs, dict):
        return x
    moved = {k: _on_host(v, depth + 1) for k, v in attrs.items()}
    if all(moved[k] is v for k, v in attrs.items()):
        return x
    out = copy.copy(x)
    out.__dict__.update(moved)
    return out


# ----------------------------------------------------------------- array API


def scipy_array_api_enabled() -> bool:
    """Whether SciPy's array-API support is on: ``SCIPY_ARRAY_API=1`` before scipy was imported.

    SciPy reads the variable once, when it is imported, so setting it later has
    no effect on SciPy (scikit-learn checks it again and would be fooled);
    gpunets therefore never sets it.

    >>> isinstance(scipy_array_api_enabled(), bool)
    True
    """
    env = os.environ.get("SCIPY_ARRAY_API") == "1"
    for name in ("scipy._lib._array_api_override", "scipy._lib._array_api"):
        mod = sys.modules.get(name)
        if mod is not None and hasattr(mod, "SCIPY_ARRAY_API"):
            return env and bool(mod.SCIPY_ARRAY_API)
    return env


def supports_array_api(model: Any) -> tuple[bool, str]:
    """Whether ``model``, with its parameters, supports scikit-learn's array-API dispatch.

    Uses the estimator's ``array_api_support`` tag (falling back to
    :data:`ARRAY_API_ESTIMATORS`), plus the parameter conditions the tags do
    not encode (Ridge's ``solver``, LDA's ``solver``, and an output set to
    data frames with ``set_output``, which are built on the host).

    Returns
    -------
    (bool, str)
        The answer and, when False, why.

    Examples
    --------
    >>> from sklearn.linear_model import Ridge
    >>> supports_array_api(Ridge(solver="svd"))
    (True, '')
    >>> supports_array_api(Ridge(solver="lsqr"))
    (False, "Ridge(solver='lsqr') does not support array-API dispatch (solver='lsqr' (only 'svd' dispatches))")
    """
    path = public_path(model)
    try:
        tag = bool(model.__sklearn_tags__().array_api_support)
    except AttributeError:
        tag = path in ARRAY_API_ESTIMATORS
    if not tag:
        return False, f"{model!r} does not support array-API dispatch"
    check = _ARRAY_API_CONDITIONS.get(path)
    problem = check(model.get_params(deep=False)) if check else ""
    # scikit-learn's rule (sklearn.utils._set_output._get_output_config): the estimator's own set_output, else the
    # global transform_output (sklearn.set_config / config_context in this thread, where the plan is made)
    frames = (getattr(model, "_sklearn_output_config", None) or {}).get("transform")
    if frames is None:
        import sklearn

        frames = sklearn.get_config()["transform_output"]
    if not problem and frames not in ("default", None):
        # set_output(transform="pandas"/"polars") builds host frames from the transform's (GPU) array
        problem = f"set_output(transform={frames!r}) builds host data frames"
    if problem:
        return False, f"{model!r} does not support array-API dispatch ({problem})"
    return True, ""


# ----------------------------------------------------------------- resolution


def _fall_back(model: Any, dev: Device, reason: str, *, what: str, policy: str) -> None:
    name = type(model).__name__
    if policy not in ("warn", "raise", "silent", "cpu"):
        raise ValueError(f"fallback={policy!r} is not a fallback policy; use 'warn', 'raise', 'silent' or 'cpu'.")
    if policy == "raise":
        fix = ("run where a GPU is present" if not device_exists(dev)
               else "install cuML, or choose parameters that support array-API dispatch")
        raise DeviceUnavailableError(
            f"{what}: `{name}` cannot run on {dev}: {reason}. Place it on 'cpu', or {fix}; "
            f"gn.config(fallback='warn') runs it on the CPU with a logged line.")
    level = logging.WARNING if policy in ("warn", "cpu") else logging.INFO
    logger.log(level, "`%s.fit` falling back to CPU (%s on %s): %s", name, what, dev, reason)


def cpu_fallback(model: Any, device: str | Device, reason: str, *, what: str,
                 fallback: str | None = None) -> Resolved:
    """Run ``model`` on the CPU instead of ``device`` for ``reason``, as the fallback policy says.

    >>> from sklearn.linear_model import Ridge
    >>> cpu_fallback(Ridge(), "cuda:0", "no GPU here", what="machine Ridge", fallback="silent").path
    'cpu_fallback'
    """
    _fall_back(model, Device.parse(device), reason, what=what, policy=fallback or get_config()["fallback"])
    return Resolved(clone(model, safe=False), CPU, "cpu_fallback", reason)


def resolve_estimator(model: Any, device: str | Device, *, what: str,
                      fallback: str | None = None) -> Resolved:
    """Decide how ``model`` runs when placed on ``device``; return an unfitted estimator and its route.

    Parameters
    ----------
    model : estimator
        A scikit-learn (or compatible) estimator, or a cuML estimator.  Not modified.
    device : str or Device
        Where the model is placed.
    what : str
        The culprit for messages, e.g. ``"machine Ridge"``.
    fallback : {"warn", "raise", "silent"}, optional
        Default ``get_config()["fallback"]``: log a WARNING, raise
        :class:`~gpunets.base.exceptions.DeviceUnavailableError`, or log at INFO.

    Returns
    -------
    Resolved

    Examples
    --------
    >>> from sklearn.linear_model import Ridge
    >>> import gpunets.devices.placement as gd
    >>> r = resolve_estimator(Ridge(), "cuda:0", what="machine Ridge", fallback="silent")
    >>> (r.path, r.device) if not gd.gpu_available() else ("cpu_fallback", gd.CPU)
    ('cpu_fallback', Device('cpu'))
    """
    dev = Device.parse(device)
    policy = fallback or get_config()["fallback"]
    if is_cuml_estimator(model):
        return _resolve_cuml(model, dev, what=what, policy=policy)
    if dev.is_cpu:
        return Resolved(clone(model, safe=False), CPU, "sklearn")
    reasons = []
    if not device_exists(dev):
        reasons.append(why_unavailable(dev))
    else:
        try:
            twin, dropped = to_cuml(model)
        except LookupError as exc:
            reasons.append(str(exc))
        else:
            if dropped:
                logger.info("%s: cuML's %s does not take %s; they were dropped",
                            what, type(twin).__name__, list(dropped))
            return Resolved(twin, dev, "cuml", dropped=dropped)
        ok, why = supports_array_api(model)
        if ok and not scipy_array_api_enabled():
            ok, why = False, (f"{type(model).__name__} could use array-API dispatch, but SCIPY_ARRAY_API=1 was "
                              f"not set before scipy was imported (set it in the environment before "
                              f"starting Python; gpunets cannot set it late)")
        if ok:
            return Resolved(clone(model), dev, "array_api")
        reasons.append(why)
    reason = " and ".join(reasons)
    _fall_back(model, dev, reason, what=what, policy=policy)
    return Resolved(clone(model, safe=False), CPU, "cpu_fallback", reason)


def _resolve_cuml(model: Any, dev: Device, *, what: str, policy: str) -> Resolved:
    if dev.is_cuda and device_exists(dev):
        return Resolved(clone(model), dev, "cuml")
    reason = "cuML model placed on the CPU" if dev.is_cpu else why_unavailable(dev)
    try:
        est, dropped = to_sklearn(model)
    except LookupError as exc:
        raise DeviceUnavailableError(
            f"{what}: `{type(model).__name__}` cannot run on the CPU ({reason}): {exc}. Place it on a "
            f"CUDA device where a GPU is present, or use a scikit-learn estimator.") from exc
    if dev.is_cpu:
        return Resolved(est, CPU, "sklearn", reason, dropped)
    _fall_back(model, dev, reason, what=what, policy=policy)
    return Resolved(est, CPU, "cpu_fallback", reason, dropped)


# ----------------------------------------------------------------- running


@contextlib.contextmanager
def fit_context(resolved: Resolved | str, device: str | Device | None = None) -> Iterator[None]:
    """Wrap the estimator's ``fit``/``predict``/``transform`` calls for its route.

    ``resolved`` is a :class:`Resolved`, or just its route (``"array_api"``,
    ``"cuml"``, ...) with the ``device`` it runs on (as a fitted machine
    records them); without a device a GPU route leaves CuPy's current device as it is.

    ``"array_api"``: ``sklearn.config_context(array_api_dispatch=True)`` (which
    requires ``SCIPY_ARRAY_API=1`` set before scipy was imported), and the
    target GPU made current; ``"cuml"``: the target GPU made current (cuML runs
    on CuPy's current device); CPU routes: nothing.  On a GPU route the GPU's memory
    resource is settled first (:func:`gpunets.devices.gpu_memory.note_gpu_estimator`).

    Examples
    --------
    >>> from sklearn.linear_model import Ridge
    >>> r = resolve_estimator(Ridge(), "cpu", what="machine Ridge")
    >>> with fit_context(r):
    ...     _ = r.estimator.fit([[0.0], [1.0]], [0.0, 1.0])
    """
    if isinstance(resolved, str):
        path, dev = resolved, (Device.parse(device) if device is not None else None)
    else:
        path, dev = resolved.path, (Device.parse(device) if device is not None else resolved.device)
    with contextlib.ExitStack() as stack:
        if path == "array_api":
            import sklearn  # noqa: PLC0415

            stack.enter_context(sklearn.config_context(array_api_dispatch=True))
        cp = loaded_cupy()
        if path in ("array_api", "cuml") and dev is not None and dev.is_cuda and cp is not None:
            assert dev.index is not None   # a CUDA device always has an index
            ordinal = local_ordinal(dev.index)
            note_gpu_estimator(ordinal, path)   # its memory resource settled first (gpu_memory="auto")
            stack.enter_context(cp.cuda.Device(ordinal))
        yield


call_context = fit_context


def prepare_inputs(resolved: Resolved, *values: Any, what: str = "the estimator",
                   fallback: str | None = None) -> tuple[Any, ...]:
    """Move ``values`` to where ``resolved`` runs, in the form its route takes.

    * GPU routes: values move to the GPU; for ``"array_api"`` frames become
      CuPy arrays (scikit-learn dispatches on arrays); for ``"cuml"`` pandas
      become cuDF when cuDF is installed, else CuPy arrays.  Logged at DEBUG.
    * CPU routes: values on a GPU come back to the host; that loses the GPU,
      so it follows the fallback policy: ``"raise"`` raises
      :class:`~gpunets.base.exceptions.DeviceUnavailableError`, ``"warn"`` logs a
      WARNING, ``"silent"`` logs at INFO.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.linear_model import Ridge
    >>> r = resolve_estimator(Ridge(), "cpu", what="machine Ridge")
    >>> X = np.ones((2, 1)); prepare_inputs(r, X, None)[0] is X
    True
    """
    target = resolved.device
    policy = fallback or get_config()["fallback"]
    if target.is_cuda:
        frames = "array" if resolved.path == "array_api" or not installed("cudf") else "cudf"
        out = []
        for v in values:
            moved = to_device(v, target, frames=frames)
            if moved is not v:
                logger.debug("%s: moved a %s to %s", what, type(v).__name__, target)
            out.append(moved)
        return tuple(out)
    out = []
    for v in values:
        here = device_of(v)
        if here.is_cuda or is_cudf(v):
            if policy == "raise":
                raise DeviceUnavailableError(
                    f"{what}: runs on the CPU ({resolved.path}), but was given a {type(v).__name__} on "
                    f"{here}. Place the estimator on {here}, move the data with gn.to_device(value, 'cpu'), "
                    f"or use gn.config(fallback='warn') to copy it with a logged line.")
            logger.log(logging.WARNING if policy in ("warn", "cpu") else logging.INFO,
                       "%s: copying a %s from %s to the CPU (the estimator runs on the CPU)",
                       what, type(v).__name__, here)
        out.append(to_device(v, CPU))
    return tuple(out)
