"""Fitting and applying one machine's estimator: the single place models are called.

Placement (which estimator actually runs, on which device) is decided by
:func:`gpunets.compute.models.resolve_estimator` when the plan is compiled; this
module only clones, fits and applies.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from sklearn.base import clone
from sklearn.utils.validation import check_is_fitted

from gpunets.compute.models import call_context, fit_context
from gpunets.compute.threadsafety import serialized, unsafe_groups
from gpunets.devices.data import device_of

logger = logging.getLogger("gpunets")

__all__ = ["fresh_estimator", "fit_estimator", "fit_transform_estimator", "apply_estimator", "is_stateless",
           "static_estimator", "partial_fit_estimator", "is_frozen_estimator", "sklearn_config_delta",
           "sklearn_config", "under_sklearn_config", "training_output_differs", "transform_gives", "same_bits",
           "own_inputs", "writes_inputs"]


def fresh_estimator(model: Any) -> Any:
    """An unfitted copy of ``model`` (scikit-learn's ``clone``, deep copy for other objects)."""
    return clone(model, safe=False)


def writes_inputs(est: Any) -> bool:
    """Whether ``est`` may write into the arrays it is given: scikit-learn's ``copy=False`` or ``copy_X=False``
    (``Ridge`` centres its rows in place, ``StandardScaler`` scales them), on it or on a step of a ``Pipeline``
    or a meta-estimator's ``estimator``.

    >>> from sklearn.linear_model import Ridge
    >>> from sklearn.pipeline import make_pipeline
    >>> from sklearn.preprocessing import StandardScaler
    >>> writes_inputs(Ridge()), writes_inputs(make_pipeline(StandardScaler(copy=False), Ridge()))
    (False, True)
    """
    if getattr(est, "copy", None) is False or getattr(est, "copy_X", None) is False:
        return True
    inner = [s for _, s in getattr(est, "steps", None) or ()]
    inner += [getattr(est, "estimator", None), getattr(est, "base_estimator", None)]
    return any(writes_inputs(s) for s in inner if s is not None and s is not est and hasattr(s, "get_params"))


def own_inputs(est: Any, values: tuple[Any, ...]) -> tuple[Any, ...]:
    """``values``, each array copied where ``est`` may write into it (:func:`writes_inputs`).

    A node's value is shared: by the machines and operations it feeds, by the candidates of a search. A step
    that writes into its input in place would change what the others read, in an order that depends on the
    executor; with its own copy, every step sees the values scikit-learn's own fit would have given it.
    """
    if not writes_inputs(est):
        return values
    return tuple(v.copy() if hasattr(v, "shape") and callable(getattr(v, "copy", None)) else v for v in values)


def fit_estimator(est: Any, values: tuple[Any, ...], resolved: Any = None,
                  method: str = "fit", keywords: tuple[str, ...] = ()) -> tuple[Any, dict[str, Any]]:
    """Fit the fresh estimator ``est`` on ``values``; return it and where it ran.

    Pure apart from fitting ``est`` itself, so it can run on any thread or Dask worker.
    With ``method="fit_transform"`` the result of ``est.fit_transform`` is in ``info["output"]``.
    The last ``len(keywords)`` values are passed by those names (``sample_weight=w``).
    """
    kw = dict(zip(keywords, values[len(values) - len(keywords):])) if keywords else {}
    values = own_inputs(est, values[:len(values) - len(keywords)])
    start = time.perf_counter()
    info: dict[str, Any] = {"device": "cpu", "path": "sklearn"}
    groups = unsafe_groups(est)   # estimators with process-wide state fit one at a time
    call = getattr(est, method)
    if method == "fit" and is_frozen_estimator(est):
        # scikit-learn's FrozenEstimator: fitting is a no-op (its fit(X, y) signature would reject a
        # transformer's single training argument); it only checks that the wrapped estimator is fitted
        check_is_fitted(est.estimator)
        call = _frozen_fit(est)
    if resolved is not None:
        info = {"device": str(resolved.device), "path": resolved.path}
        if getattr(resolved, "reason", ""):
            info["reason"] = resolved.reason
        try:
            with fit_context(resolved), serialized(groups):
                result = call(*values, **kw)
        except MemoryError as exc:   # out of GPU memory: with gn.config(fallback="cpu"), fit again on the CPU
            rerun = _rerun_on_cpu(est, resolved, exc, values, kw, method)
            if rerun is None:
                raise
            est, result, info = rerun
    else:
        with serialized(groups):
            result = call(*values, **kw)
    if method != "fit":
        info["output"] = result
    info["seconds"] = time.perf_counter() - start
    shape = getattr(values[0], "shape", None) if values else None
    info["n_rows"] = int(shape[0]) if shape else None
    return est, info


def _rerun_on_cpu(est: Any, resolved: Any, exc: BaseException, values: tuple[Any, ...], kw: dict[str, Any],
                  method: str) -> tuple[Any, Any, dict[str, Any]] | None:
    """An array-API fit on a GPU that ran out of memory, fitted again on the CPU where ``fallback="cpu"``.

    Returns ``(estimator, result, info)`` with the route ``"cpu_fallback"`` and the reason, or None where
    the policy, the route or the device does not allow it (the error then stops the run as any failure).
    """
    from gpunets.base.config import get_config
    from gpunets.compute.models import Resolved, prepare_inputs
    from gpunets.devices.placement import CPU

    if get_config()["fallback"] != "cpu" or resolved.path != "array_api" or not resolved.device.is_cuda:
        return None
    name = type(est).__name__
    reason = (f"out of GPU memory on {resolved.device} ({type(exc).__name__}: {exc}); fitted again on the CPU "
              f"(fallback='cpu')")
    logger.warning("`%s.%s` falling back to CPU: %s", name, method, reason)
    cpu = Resolved(clone(est), CPU, "cpu_fallback", reason)
    moved = prepare_inputs(cpu, *values, what=f"`{name}` (out of GPU memory)", fallback="silent")
    kw = dict(zip(kw, prepare_inputs(cpu, *kw.values(), fallback="silent"))) if kw else kw
    result = getattr(cpu.estimator, method)(*moved, **kw)
    return cpu.estimator, result, {"device": "cpu", "path": "cpu_fallback", "reason": reason}


# scikit-learn classes that define their own ``fit_transform`` and whose result is ``fit(X, y).transform(X)``
# bit for bit (checked in tests/test_outputs.py): a fast path, a docstring, or a validation, not other values
_SAME_AS_TRANSFORM = frozenset({
    "_BaseKMeans", "KMeans", "MiniBatchKMeans", "BisectingKMeans", "KNeighborsTransformer", "RadiusNeighborsTransformer",
    "PowerTransformer", "RandomTreesEmbedding", "MissingIndicator", "LabelEncoder", "LabelBinarizer",
    "MultiLabelBinarizer", "DictVectorizer", "HashingVectorizer", "_BaseVoting", "VotingClassifier", "VotingRegressor",
    "StackingClassifier", "StackingRegressor"})


def training_output_differs(est: Any) -> bool:
    """Whether ``est.fit_transform(X)`` may differ from ``est.fit(X).transform(X)``.

    scikit-learn's ``TransformerMixin.fit_transform`` is ``fit(X, y).transform(X)``; a class that defines its
    own may give other values: cross-fitted encodings (``TargetEncoder``), the SVD's own factors (``PCA``,
    ``TruncatedSVD``: the last bits), an embedding of the training rows (``TSNE``, ``Isomap``).  Such a
    machine's training output cannot be recomputed from its fitted state, only by fitting again
    (docs/networks.md, "Training outputs").  Compositions differ when a part does; classes not known are
    taken to differ.

    >>> from sklearn.decomposition import PCA
    >>> from sklearn.pipeline import make_pipeline
    >>> from sklearn.preprocessing import StandardScaler, TargetEncoder
    >>> training_output_differs(StandardScaler()), training_output_differs(TargetEncoder())
    (False, True)
    >>> training_output_differs(make_pipeline(StandardScaler(), PCA(2)))
    True
    """
    cls = type(est)
    owner = next((k for k in cls.__mro__ if "fit_transform" in vars(k)), None)
    if owner is None:
        return False            # no fit_transform: fit then transform, as the planner does
    hook = getattr(est, "_gn_training_output_differs", None)
    if callable(hook):
        return bool(hook())     # a gpunets composite that knows its parts
    module = getattr(owner, "__module__", "")
    if module.startswith("sklearn."):
        if owner.__name__ == "TransformerMixin" or owner.__name__ in _SAME_AS_TRANSFORM:
            return False
        parts = _parts(est, owner.__name__)
        if parts is not None:
            return any(training_output_differs(p) for p in parts)
    return True


def _parts(est: Any, kind: str) -> list[Any] | None:
    """The estimators of a scikit-learn composition whose ``fit_transform`` is its parts' (None: not one)."""
    if kind == "Pipeline":
        return [s for _, s in est.steps if s is not None and s != "passthrough"]
    if kind == "ColumnTransformer":
        return [t for _, t, _ in est.transformers if not isinstance(t, str)]
    if kind == "FeatureUnion":
        return [t for _, t in est.transformer_list if not isinstance(t, str)]
    return None


def partial_fit_estimator(est: Any, values: tuple[Any, ...], resolved: Any = None,
                          times: int = 1, keywords: tuple[str, ...] = ()) -> tuple[Any, dict[str, Any]]:
    """Call ``est.partial_fit(*values)`` ``times`` times (a warm update's passes); return it and where it ran.

    ``est`` is a copy of a fitted estimator (never a committed state): like :func:`fit_estimator`,
    pure apart from training ``est`` itself.
    """
    seconds = 0.0
    info: dict[str, Any] = {}
    for _ in range(times):
        est, info = fit_estimator(est, values, resolved, method="partial_fit", keywords=keywords)
        info.pop("output", None)
        seconds += info["seconds"]
    info["seconds"] = seconds
    return est, info


def is_stateless(model: Any) -> bool:
    """Whether ``model`` may be applied without being fitted (a *static* model, as MLJ calls it).

    True when scikit-learn's ``requires_fit`` tag is False (``FunctionTransformer``, ``Normalizer``,
    ``Binarizer``), or when the model says it is fitted as it is (``__sklearn_is_fitted__()`` True).

    >>> from sklearn.preprocessing import FunctionTransformer, StandardScaler
    >>> is_stateless(FunctionTransformer()), is_stateless(StandardScaler())
    (True, False)
    """
    tags = getattr(model, "__sklearn_tags__", None)
    if callable(tags):
        try:
            if tags().requires_fit is False:
                return True
        except Exception:  # noqa: BLE001 - a model whose tags fail is simply not known to be stateless
            pass
    fitted = getattr(model, "__sklearn_is_fitted__", None)
    if callable(fitted):
        try:
            return bool(fitted())
        except Exception:  # noqa: BLE001 - as above
            return False
    return False


def static_estimator(est: Any, resolved: Any = None) -> tuple[Any, dict[str, Any]]:
    """A static machine's "fit": nothing is called; return the unfitted copy ``est`` and where it runs."""
    info: dict[str, Any] = {"device": "cpu", "path": "sklearn"}
    if resolved is not None:
        info = {"device": str(resolved.device), "path": resolved.path}
    info.update(seconds=0.0, n_rows=None)
    return est, info


def _frozen_fit(est: Any) -> Any:
    def fit(*values: Any, **kw: Any) -> Any:
        return est

    return fit


def is_frozen_estimator(est: Any) -> bool:
    """Whether ``est`` is scikit-learn's ``FrozenEstimator`` (``sklearn.frozen``, scikit-learn 1.6+)."""
    cls = type(est)
    return cls.__name__ == "FrozenEstimator" and cls.__module__.startswith("sklearn.")


def fit_transform_estimator(est: Any, values: tuple[Any, ...], resolved: Any = None, keywords: tuple[str, ...] = (),
                            check: bool = False) -> tuple[Any, dict[str, Any], Any]:
    """Like :func:`fit_estimator` with ``est.fit_transform``: the fitted estimator, where it ran, and the
    transform of its training input (scikit-learn's contract: ``fit(X, y).transform(X)``)."""
    est, info = fit_estimator(est, values, resolved, method="fit_transform", keywords=keywords)
    out = info.pop("output")
    if check and training_output_differs(est):   # info["same_output"]: whether its transform gives the output
        info["same_output"] = transform_gives(est, values[0], out, info.get("path", "sklearn"))
    return est, info, out


def transform_gives(est: Any, X: Any, out: Any, path: str = "sklearn") -> bool:
    """Whether the fitted ``est``'s ``transform(X)`` gives ``out`` (its ``fit_transform``'s) bit for bit.

    Checked once, where the fit ran, for the estimators whose ``fit_transform`` may differ
    (:func:`training_output_differs`): where it does not (``PCA`` by its covariance solver), a state fitted
    before or loaded from the store passes on its ``transform`` without fitting again
    (:mod:`gpunets.planning.outputs`).  Anything that cannot be compared counts as different.

    >>> import numpy as np
    >>> from sklearn.decomposition import PCA
    >>> X = np.random.default_rng(0).normal(size=(50, 4))
    >>> pca = PCA(2, svd_solver="covariance_eigh")
    >>> transform_gives(pca, X, pca.fit_transform(X))
    True
    """
    try:
        again = apply_estimator(est, "transform", (X,), path)
        return same_bits(out, again)
    except Exception:  # noqa: BLE001 - a transform that fails or differs in kind: not the same
        return False


def same_bits(a: Any, b: Any) -> bool:
    """``a`` and ``b`` equal element for element, of one type, shape and dtype (NumPy, CuPy, SciPy sparse,
    pandas); NaNs count as different.

    >>> import numpy as np
    >>> same_bits(np.ones(3), np.ones(3)), same_bits(np.ones(3), np.nextafter(np.ones(3), 2))
    (True, False)
    """
    if type(a) is not type(b):
        return False
    if callable(getattr(a, "equals", None)) and hasattr(a, "index"):
        return bool(a.equals(b))                                  # pandas / cuDF
    if getattr(a, "shape", None) != getattr(b, "shape", None) or getattr(a, "dtype", None) != getattr(b, "dtype", None):
        return False
    if hasattr(a, "nnz"):                                         # SciPy / CuPy sparse
        return bool((a != b).nnz == 0)
    return bool((a == b).all())


def apply_estimator(est: Any, op: str, values: tuple[Any, ...], path: str = "sklearn",
                    params: dict[str, Any] | None = None) -> Any:
    """Call operation ``op`` of the fitted estimator ``est`` on ``values`` (and keyword ``params``)."""
    method = getattr(est, op, None)
    if method is None:
        msg = f"The fitted {type(est).__name__} has no method {op!r}."
        raise AttributeError(msg)
    if params:
        method = functools.partial(method, **params)
    values = own_inputs(est, values)
    groups = unsafe_groups(est, calls=True)
    if groups:   # declared not thread-safe by the user: its calls run one at a time too
        with serialized(groups):
            return _apply(method, values, path)
    return _apply(method, values, path)


def _apply(method: Any, values: tuple[Any, ...], path: str) -> Any:
    if path in ("array_api", "cuml"):
        try:  # the GPU the inputs were moved to is the one the estimator runs on
            dev = next((d for d in map(device_of, values) if d.is_cuda), None)
        except ValueError:  # inputs on several devices: let the estimator report it
            dev = None
        with call_context(path, dev):
            return method(*values)
    return method(*values)


def sklearn_config_delta() -> dict[str, Any] | None:
    """scikit-learn's configuration in this thread where it differs from a new thread's (None: it does not).

    ``sklearn.set_config`` and ``config_context`` are per thread, so a task run on a worker thread (or a Dask
    worker) would not see the caller's ``transform_output``, ``enable_metadata_routing``... A run captures the
    difference where it is planned, and :func:`sklearn_config` applies it around its tasks, as scikit-learn's own
    ``Parallel`` does.
    """
    import sklearn

    try:
        from sklearn._config import _global_config as defaults  # what a new thread starts from
    except ImportError:  # pragma: no cover - a scikit-learn without it: carry everything
        defaults = {}
    current = sklearn.get_config()
    delta = {k: v for k, v in current.items() if k not in defaults or defaults[k] != v}
    return delta or None


@contextlib.contextmanager
def sklearn_config(delta: dict[str, Any] | None) -> Iterator[None]:
    """scikit-learn's ``config_context`` with the caller's configuration ``delta`` (nothing when None)."""
    if not delta:
        yield
        return
    import sklearn

    with sklearn.config_context(**delta):
        yield


def under_sklearn_config(delta: dict[str, Any] | None, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` under the caller's scikit-learn configuration (a task sent to another process)."""
    with sklearn_config(delta):
        return fn(*args)
