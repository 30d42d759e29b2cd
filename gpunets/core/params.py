"""Hyperparameter snapshots and their equality, argument checks, and machine labels.

Part of :mod:`gpunets.core.machines`: a machine retrains when the snapshot of its model's hyperparameters
(``get_params(deep=False)``, estimator-valued parameters compared recursively, arrays by content) differs from
the one taken at its last fit.  Comparing snapshots is hand-written for speed: see docs/architecture.md.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from gpunets.compute.estimators import is_stateless
from gpunets.core.nodes import is_node

#: The values of ``machine(..., warm=...)``.
WARM_MODES = ("auto", False, "partial_fit")

if TYPE_CHECKING:  # pragma: no cover
    from gpunets.core.machines import Machine


def _check_warm(model: Any, warm: Any, has_args: bool) -> None:
    """The ``warm=`` and static-machine checks of :func:`machine`, before anything is built."""
    name = type(model).__name__
    if not any(warm is m for m in WARM_MODES) and not (isinstance(warm, str) and warm in WARM_MODES):
        msg = (f"machine({name}, ...): warm={warm!r} is not a warm-update mode; expected 'auto' (continue with "
               "warm_start when the estimator has warm_start=True), 'partial_fit' (continue with partial_fit) or "
               "False (always refit a fresh clone).")
        raise ValueError(msg)
    if warm == "partial_fit" and not callable(getattr(model, "partial_fit", None)):
        msg = (f"machine({name}, ..., warm='partial_fit'): {name} has no partial_fit method, so an update cannot "
               f"continue with it. Use warm='auto' with {name}(warm_start=True) if it has warm_start, or warm=False.")
        raise TypeError(msg)
    if not has_args:
        if warm == "partial_fit":
            msg = (f"machine({name}, warm='partial_fit') has no training arguments (a static machine never trains), "
                   "so there is nothing to continue. Pass its training data, e.g. machine(model, X, y, warm=...).")
            raise TypeError(msg)
        if not is_stateless(model):
            msg = (f"machine({name}) has no training arguments, so it would be static (it never trains and applies "
                   f"its operations to the data they are called on), but {name} must be fitted before it can "
                   f"transform or predict (scikit-learn's requires_fit tag). Pass its training data, e.g. "
                   f"machine({name}(), X) or machine({name}(), X, y); only stateless models such as "
                   "FunctionTransformer, Normalizer or Binarizer can be static.")
            raise TypeError(msg)


def _check_argument(a: Any, what: str) -> None:
    if not is_node(a) and (callable(a) or isinstance(a, (str, bytes))):
        msg = (f"{what} is {a!r} of type {type(a).__name__}: expected a node or data (NumPy, pandas, CuPy "
               "or cuDF). Wrap data in gn.source(data) or pass a node.")
        raise TypeError(msg)


def _n_rows(x: Any) -> int | None:
    shape = getattr(x, "shape", None)
    if shape:
        return int(shape[0])
    try:
        return len(x)
    except TypeError:
        return None


def _same_rows(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return _equal(a, b)


def labels(machines: Iterable[Machine]) -> dict[Machine, str]:
    """Readable, unique labels for ``machines`` (in the order given).

    Examples
    --------
    >>> import gpunets as gn
    >>> from sklearn.linear_model import Ridge
    >>> ms = [gn.machine(Ridge(), gn.source(name="X")) for _ in range(2)]
    >>> list(labels(ms).values())
    ['Ridge', 'Ridge#2']
    """
    out: dict[Machine, str] = {}
    count: dict[str, int] = {}
    for m in machines:
        base = m.label
        count[base] = count.get(base, 0) + 1
        out[m] = base if count[base] == 1 else f"{base}#{count[base]}"
    return out


def snapshot_params(model: Any) -> dict[str, Any]:
    """A copy of ``model``'s hyperparameters (nested ones included) to compare later."""
    get = getattr(model, "get_params", None)
    if callable(get):
        try:
            params = get(deep=True)
        except TypeError:
            params = get()
    else:
        params = {k: v for k, v in vars(model).items() if not k.endswith("_")} if hasattr(model, "__dict__") else {}
    return {k: _freeze(v) for k, v in params.items()}


def _is_estimator(v: Any) -> bool:
    return not isinstance(v, type) and (callable(getattr(v, "get_params", None)) or callable(getattr(v, "fit", None)))


def _freeze(v: Any) -> Any:
    """A comparable copy: estimators by identity (their params are flattened separately)."""
    if _is_estimator(v):
        return ("<estimator>", type(v), id(v))
    if isinstance(v, (list, tuple)):
        return type(v)(_freeze(x) for x in v) if type(v) in (list, tuple) else tuple(_freeze(x) for x in v)
    if isinstance(v, dict):
        return {k: _freeze(x) for k, x in v.items()}
    try:
        return copy.deepcopy(v)
    except Exception:
        return ("<uncopyable>", id(v))


def params_equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a.keys() != b.keys():
        return False
    return all(_equal(a[k], b[k]) for k in a)


def _equal(x: Any, y: Any, depth: int = 0) -> bool:
    if x is y:
        return True
    if type(x) is not type(y):
        return False
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        import numpy as np

        try:
            return x.shape == y.shape and bool(np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True))
        except TypeError:
            return bool(np.array_equal(np.asarray(x), np.asarray(y)))
    if isinstance(x, (list, tuple)):
        return len(x) == len(y) and all(_equal(p, q, depth) for p, q in zip(x, y))
    if isinstance(x, dict):
        return x.keys() == y.keys() and all(_equal(x[k], y[k], depth) for k in x)
    if isinstance(x, slice):
        return (x.start, x.stop, x.step) == (y.start, y.stop, y.step)
    if type(x).__eq__ is object.__eq__:
        return _same_contents(x, y, depth)
    try:
        r = x == y
        return bool(r) if isinstance(r, (bool,)) or type(r).__name__ == "bool_" else False
    except Exception:
        return False


def _same_contents(x: Any, y: Any, depth: int) -> bool:
    """Two objects of one class without ``__eq__`` (a CV splitter, a ``RandomState``), by what they hold: a copy
    taken at fit time equals the object as long as nobody changed it."""
    if depth > 8:
        return False
    state = getattr(x, "get_state", None)   # numpy's RandomState
    if callable(state) and type(x).__module__.startswith("numpy"):
        try:
            a, b = state(), y.get_state()
            return all(_equal(p, q, depth + 1) for p, q in zip(a, b)) and len(a) == len(b)
        except Exception:  # noqa: BLE001 - not numpy's RandomState after all
            return False
    gen = getattr(x, "bit_generator", None)  # numpy's Generator
    if gen is not None and type(x).__module__.startswith("numpy"):
        return _equal(gen.state, y.bit_generator.state, depth + 1)
    if hasattr(x, "__dict__") and hasattr(y, "__dict__"):
        return _equal(vars(x), vars(y), depth + 1)
    return False
