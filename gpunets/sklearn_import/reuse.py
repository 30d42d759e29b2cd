"""``reuse_fitted=True``: give the network's machines the fitted state of a fitted original.

At the first fit, each machine whose counterpart in the fitted original is
fitted, of the same class with the same parameters, and whose upstream
machines were all adopted too, takes a copy of that fitted estimator; the fit
then skips it.  Counterparts: a ``Pipeline``'s steps, a ``ColumnTransformer``'s
``named_transformers_`` (and its ``sparse_output_`` for the join), a
``FeatureUnion``'s transformers, a voting ensemble's ``named_estimators_`` (and
``le_``), a ``TransformedTargetRegressor``'s ``regressor_`` and ``transformer_``,
a top-level leaf itself.  Stacks are never adopted (scikit-learn keeps no
per-fold models): they train.  What was adopted, and why not otherwise, is in
``conversion_``.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from gpunets.core.graph import machine_parents
from gpunets.core.machines import FittedState, _equal, snapshot_params
from gpunets.sklearn_import._base import converts_as, is_drop, root_name
from gpunets.sklearn_import.columns import ColumnStack
from gpunets.sklearn_import.target import TargetTransformer

__all__ = ["adopt"]


def _is_est(v: Any) -> bool:
    return not isinstance(v, type) and callable(getattr(v, "fit", None))


def same_params(a: Any, b: Any) -> bool:
    """Same class and hyperparameters (nested estimators by class and their own parameters)."""
    if type(a) is not type(b):
        return False
    pa, pb = a.get_params(deep=True), b.get_params(deep=True)
    if pa.keys() != pb.keys():
        return False
    for k in pa:
        x, y = pa[k], pb[k]
        if _is_est(x) or _is_est(y):
            if type(x) is not type(y):
                return False
        elif isinstance(x, (list, tuple)) and any(_is_est(v) or isinstance(v, tuple) for v in x):
            continue  # lists of (name, estimator): the estimators' own parameters are compared by name
        elif not _equal(x, y):
            return False
    return True


def _is_fitted(est: Any) -> bool:
    from sklearn.utils.validation import check_is_fitted

    try:
        check_is_fitted(est)
    except Exception:  # noqa: BLE001 - NotFittedError or not an estimator
        return False
    return True


def counterpart(original: Any, name: str) -> tuple[Any, str]:
    """The fitted object in ``original`` for machine ``name`` (or None) and why not."""
    from sklearn.compose import ColumnTransformer, TransformedTargetRegressor
    from sklearn.ensemble import VotingClassifier, VotingRegressor
    from sklearn.pipeline import FeatureUnion, Pipeline

    if name == root_name(original) and not converts_as(original, Pipeline, ColumnTransformer, FeatureUnion):
        return original, ""
    est = original
    segs = name.split("__")
    for i, seg in enumerate(segs):
        last = i == len(segs) - 1
        try:
            if converts_as(est, Pipeline):
                est = est.named_steps[seg]
            elif converts_as(est, ColumnTransformer):
                if seg == "<stack>":
                    from sklearn.compose._column_transformer import _is_empty_column_selection

                    names = tuple(n for n, t, cols in est.transformers_
                                  if not is_drop(t) and not _is_empty_column_selection(cols))
                    cs = ColumnStack(est.sparse_threshold, names, est.verbose_feature_names_out,
                                     getattr(est, "_sklearn_output_config", {}).get("transform"))
                    cs.sparse_output_ = est.sparse_output_
                    return cs, ""
                est = est.named_transformers_[seg]
            elif converts_as(est, FeatureUnion):
                if seg == "<stack>":
                    names = tuple(n for n, t in est.transformer_list if not is_drop(t))
                    cs = ColumnStack(None, names, getattr(est, "verbose_feature_names_out", True),
                                     getattr(est, "_sklearn_output_config", {}).get("transform"))
                    cs.sparse_output_ = False
                    return cs, ""
                est = dict(est.transformer_list)[seg]
            elif converts_as(est, VotingRegressor, VotingClassifier):
                if seg == "<labels>":
                    return est.le_, ""
                est = est.named_estimators_[seg]
            elif converts_as(est, TransformedTargetRegressor):
                if seg == "transformer" and last:
                    tt = TargetTransformer(est.transformer, est.func, est.inverse_func, est.check_inverse)
                    tt.transformer_ = est.transformer_
                    tt.training_dim_ = est._training_dim
                    return tt, ""
                if seg != "regressor":
                    return None, f"no fitted counterpart for {seg!r}"
                est = est.regressor_
            else:
                return None, f"{type(est).__name__} keeps no fitted part named {seg!r}"
        except (KeyError, AttributeError):
            return None, f"the original has no fitted part {'__'.join(segs[:i + 1])!r}"
    return est, ""


def adopt(machines: tuple[Any, ...], original: Any) -> dict[str, str]:
    """Install fitted states on ``machines`` (dependency order); ``{machine name: what happened}``."""
    out: dict[str, str] = {}
    adopted: set[int] = set()
    for m in machines:
        name = m.label
        if any(p._uid not in adopted for p in machine_parents(m)):
            out[name] = "trained: an upstream part was not adopted"
            continue
        fitted, why = counterpart(original, name)
        if fitted is None:
            out[name] = f"trained: {why}"
            continue
        if not same_params(m.model, fitted):
            out[name] = "trained: its parameters differ from the fitted original's"
            continue
        if not _is_fitted(fitted):
            out[name] = "trained: the original's part is not fitted"
            continue
        seen = getattr(fitted, "n_features_in_", None)
        n_in = int(seen) if isinstance(seen, (int, np.integer)) else None
        # the width of what it will be given: its input evaluated on the data (through the parts adopted so far)
        width = _width(m.args[0]) if n_in is not None and m.args else None
        if width is not None and n_in != width:
            out[name] = (f"trained: the original's part was fitted on {n_in} features, and the data it is "
                         f"given here have {width}")
            continue
        m._state = FittedState(copy.deepcopy(fitted), snapshot_params(m.model), None, m._upstream_versions(),
                               m._version + 1, "adopt", 0.0, history=("adopt",))
        m._version += 1
        adopted.add(m._uid)
        out[name] = "adopted"
    return out


def _width(x: Any) -> int | None:
    """The number of columns of the training input ``x`` (a node over the sources: evaluated), None if unknown."""
    try:
        value = x()
    except Exception:  # noqa: BLE001 - unknown width: the fitted part is checked by its own predict
        return None
    shape = getattr(value, "shape", None)
    return int(shape[1]) if shape is not None and len(shape) == 2 else None
